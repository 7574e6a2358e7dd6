"""Agent Lightning's control-plane records (rollouts, their events, the terminal log, registered models, the proxy's
pause, span sequence counters) as one state machine every gateway replica replays in the same order. Pure.

Why a replayed log: its store answers its own writes at once (read-your-writes) and decides conditional writes
(a re-enqueue with a known id returns the first rollout; ``running`` never goes back to ``queuing``; two callers
of the next sequence id get two ids). The gateway's replicas share no memory, so each write is a record on one
Kafka partition (:mod:`producers.ingest.agl.control_log`) and every replica applies the records in the
partition's order with :meth:`ControlState.apply`: the same records give every replica the same state and the
writer the same answer, and a replica that starts (or restarts after a crash) rebuilds it by replaying the
partition. Deterministic: every time in a record is the writer's (``now``), never the applier's clock.

Each record is a JSON object with an ``op``; :meth:`ControlState.apply` answers ``(status, body)`` as Agent
Lightning 1.0.2's server answers the call (201/200/204, 404 for an unknown rollout, 409 for a transition its
``VALID_TRANSITIONS`` forbid). :class:`LocalControl` applies records at once, in this process (one replica,
no Kafka: the unit tests).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TRANSITIONS = {"queuing": ("running", "failed"), "running": ("succeeded", "failed"), "succeeded": (), "failed": ()}
TERMINAL = ("succeeded", "failed")
DEFAULT_ATTEMPT_ID = "0"
# Agent Lightning 0.3: an attempt status that ends it → its rollout's status; a rollout status that ends it.
ATTEMPT_ENDED = {"succeeded": "succeeded", "failed": "failed", "timeout": "failed"}
ROLLOUT_ENDED = ("succeeded", "failed", "cancelled")
# On a patch's answer only, never stored: this patch moved the rollout off queuing (its one STARTED is due now).
LEFT_QUEUING = "_left_queuing"

Result = tuple[int, Any]  # (HTTP status, JSON body)


def _data_id(rollout: Mapping[str, Any]) -> str:
    inp = rollout.get("input")
    if isinstance(inp, Mapping):
        return str(inp.get("data_id") or inp.get("instance_id") or "")
    return ""


def _worker(worker_id: str) -> dict[str, Any]:
    """A 0.3 ``Worker`` first heard of: nothing known but its id."""
    return {"worker_id": worker_id, "status": "unknown", "heartbeat_stats": None, "last_heartbeat_time": None,
            "last_dequeue_time": None, "last_busy_time": None, "last_idle_time": None, "current_rollout_id": None,
            "current_attempt_id": None}


@dataclass
class ControlState:
    """The records applied so far (see the module's docstring for the ops)."""

    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)  # rollout → attempt → events
    terminal: list[str] = field(default_factory=list)  # rollout ids in the order they ended
    models: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # model → endpoint → Model
    sequence: dict[str, int] = field(default_factory=dict)  # "rollout/attempt" → last id handed out
    proxy: dict[str, Any] = field(default_factory=lambda: {"paused": False, "retry_after_seconds": 5, "reason": None})
    # Agent Lightning 0.3's store (its own Rollout shape): rollouts enqueued or started, their status; its workers.
    rollouts_v03: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts_v03: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # rollout → its attempts, in order
    resource_sets: dict[str, dict[str, Any]] = field(default_factory=dict)  # resources_id → its ResourcesUpdate
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Rollouts a start_attempt or a status update took out of the queue: the owner of their task on rb.tasks settles
    # it instead of handing it out (TaskQueue.settled_v03), at its next sweep or dequeue.
    left_queue_v03: set[str] = field(default_factory=set)
    # Rollouts enqueued (a task on rb.tasks, whose owner offers them again after a failed attempt while attempts are left).
    queued_v03: set[str] = field(default_factory=set)

    def apply(self, record: Mapping[str, Any]) -> Result:
        """Apply one record; its answer. A record of an unknown op (a newer gateway's) changes nothing: 400."""
        op = getattr(self, "_op_" + str(record.get("op")), None)
        if op is None:
            return 400, {"detail": f"unknown control op {record.get('op')!r}"}
        return op(record)

    # ------------------------------------------------------------------ rollouts

    def _op_create(self, rec: Mapping[str, Any]) -> Result:
        """``rollouts``: new rollouts (:func:`producers.ingest.agl.v1_api.new_rollout`); one whose id is known
        already is answered as stored (its events intact): a create is idempotent by id."""
        out, created = [], []
        for rollout in rec["rollouts"]:
            rid = rollout["rollout_id"]
            if rid in self.rollouts:
                out.append(self.rollouts[rid])
                created.append(False)
                continue
            self.rollouts[rid] = copy.deepcopy(rollout)
            self.events[rid] = {}
            out.append(self.rollouts[rid])
            created.append(True)
        return 201, {"rollouts": copy.deepcopy(out), "created": created}

    def _op_patch(self, rec: Mapping[str, Any]) -> Result:
        """``rollout_id``, ``status`` (the fields set), ``now``: its state moves only as its transitions allow."""
        rid, updates = rec["rollout_id"], dict(rec["status"])
        rollout = self.rollouts.get(rid)
        if rollout is None:
            return 404, {"detail": f"Rollout not found: {rid}"}
        if not updates:
            return 200, copy.deepcopy(rollout)
        status = rollout["status"]
        if "state" in updates and updates["state"] not in TRANSITIONS.get(status["state"], ()):
            return 409, {"detail": f"Rollout {rid}: cannot transition {status['state']} -> {updates['state']}"}
        was = status["state"]
        status.update(updates, version=status["version"] + 1, updated_at=rec["now"])
        if "state" in updates and status["state"] in TERMINAL:
            self.terminal.append(rid)  # one-way (guarded above): once per rollout
        out = copy.deepcopy(rollout)
        if was == "queuing" and status["state"] != "queuing":  # one-way too: once per rollout
            out[LEFT_QUEUING] = True
        return 200, out

    def _op_delete(self, rec: Mapping[str, Any]) -> Result:
        """A rollout and its events go; idempotent. It stays in the terminal log's count (as its server's)."""
        self.rollouts.pop(rec["rollout_id"], None)
        self.events.pop(rec["rollout_id"], None)
        return 204, None

    # ------------------------------------------------------------------ events

    def _op_event(self, rec: Mapping[str, Any]) -> Result:
        """``event``: the stored event of a known rollout (its events query reads them back); 404 otherwise."""
        event = rec["event"]
        rid = event["rollout_id"]
        if rid not in self.rollouts:
            return 404, {"detail": f"Rollout not found: {rid}"}
        self.events.setdefault(rid, {}).setdefault(event["attempt_id"], []).append(copy.deepcopy(event))
        return 200, event

    # ------------------------------------------------------------------ models, the proxy's pause

    def _op_models(self, rec: Mapping[str, Any]) -> Result:
        """``models``: registered (upserted by model and endpoint), as its ``POST /api/models``."""
        for m in rec["models"]:
            self.models.setdefault(m["model"], {})[m["endpoint"]] = dict(m)
        return 201, [dict(m) for m in rec["models"]]

    def _op_models_clear(self, rec: Mapping[str, Any]) -> Result:
        self.models.clear()
        return 200, {"status": "ok"}

    def _op_pause(self, rec: Mapping[str, Any]) -> Result:
        self.proxy = {"paused": True, "retry_after_seconds": rec["retry_after_seconds"], "reason": rec.get("reason")}
        return 200, dict(self.proxy)

    def _op_resume(self, rec: Mapping[str, Any]) -> Result:
        self.proxy = {**self.proxy, "paused": False, "reason": None}
        return 200, dict(self.proxy)

    # ------------------------------------------------------------------ sequence ids

    def _op_sequence(self, rec: Mapping[str, Any]) -> Result:
        """``key`` (rollout/attempt): the next span sequence id of that attempt, 1 up, each once; with ``count``,
        that many in a row (the list)."""
        first = self.sequence.get(rec["key"], 0) + 1
        count = max(int(rec.get("count", 1)), 1)
        self.sequence[rec["key"]] = first + count - 1
        return 200, (list(range(first, first + count)) if "count" in rec else first)

    def _op_sequence_seen(self, rec: Mapping[str, Any]) -> Result:
        """``key``, ``id``: a span came with its own sequence id; the counter hands out only ids above it
        (as Agent Lightning's store syncs its counter to a span's explicit id)."""
        self.sequence[rec["key"]] = max(self.sequence.get(rec["key"], 0), int(rec["id"]))
        return 200, self.sequence[rec["key"]]

    # ------------------------------------------------------------------ Agent Lightning 0.3's store

    def _op_v03_rollouts(self, rec: Mapping[str, Any]) -> Result:
        """``rollouts``: 0.3 ``Rollout``s, each new one kept, a known one's fields updated (its status moves on).
        One with an ``attempt`` (an ``AttemptedRollout``: dequeued, started) keeps that attempt among its own, and its
        worker is busy with it (``dequeue``: the worker dequeued it, at ``now``)."""
        for r in rec["rollouts"]:
            r = copy.deepcopy(dict(r))
            attempt = r.pop("attempt", None)
            if r.get("status") == "queuing" and not isinstance(attempt, Mapping) and r["rollout_id"] not in self.rollouts_v03:
                self.queued_v03.add(r["rollout_id"])
            self.rollouts_v03.setdefault(r["rollout_id"], {}).update(r)
            if isinstance(attempt, Mapping):
                self._keep_attempt(r["rollout_id"], dict(attempt))
                now = rec.get("now", attempt.get("start_time"))
                self._sync_worker(dict(attempt), now, dequeued=bool(rec.get("dequeue")))
        return 200, None

    def _keep_attempt(self, rollout_id: str, attempt: dict[str, Any]) -> None:
        kept = self.attempts_v03.setdefault(rollout_id, [])
        for n, a in enumerate(kept):
            if a["attempt_id"] == attempt["attempt_id"]:
                kept[n] = {**a, **attempt}
                return
        kept.append(attempt)

    def latest_v03(self, rollout_id: str) -> dict[str, Any] | None:
        """A rollout's latest attempt (the highest number), as kept; None before its first."""
        attempts = self.attempts_v03.get(rollout_id)
        return max(attempts, key=lambda a: a["sequence_id"]) if attempts else None

    def _rollout_status(self, rollout_id: str, attempt: Mapping[str, Any]) -> str | None:
        """Its store's ``rollout_status_from_attempt`` for the latest attempt's status: progress and success as they are;
        an end of the kinds its config retries, with attempts left, ``requeuing`` where the queue offers it again (an
        enqueued rollout no start_attempt or status update took out of the queue), else ``failed``. None: no change
        (``unresponsive``: a watchdog's guess the attempt's next heartbeat undoes; its claim runs on until it ends)."""
        status = attempt["status"]
        if status in ("preparing", "running", "succeeded"):
            return status
        if status not in ("failed", "timeout"):
            return None
        config = self.rollouts_v03[rollout_id].get("config") or {}
        retried = status in (config.get("retry_condition") or ()) and attempt["sequence_id"] < int(config.get("max_attempts") or 1)
        queued = rollout_id in self.queued_v03 and rollout_id not in self.left_queue_v03
        return "requeuing" if retried and queued else "failed"

    def _sync_worker(self, attempt: Mapping[str, Any], now: Any, *, dequeued: bool = False) -> None:
        """Its store's ``_sync_worker_with_attempt``: the attempt's worker busy with it while it runs, idle once it
        succeeded or failed, ``unknown`` after a timeout."""
        wid = attempt.get("worker_id")
        if not wid:
            return
        w = self.workers.setdefault(wid, _worker(wid))
        if dequeued:
            w["last_dequeue_time"] = now
        if attempt["status"] in ("succeeded", "failed", "timeout", "unresponsive"):
            w.update(status="idle" if attempt["status"] in ("succeeded", "failed") else "unknown", last_idle_time=now,
                     current_rollout_id=None, current_attempt_id=None)
        else:
            w.update(status="busy", last_busy_time=now, current_rollout_id=attempt["rollout_id"],
                     current_attempt_id=attempt["attempt_id"])

    def _op_v03_idle(self, rec: Mapping[str, Any]) -> Result:
        """``worker_id``, ``now``: a dequeue that found nothing for it: idle (its store's ``_dequeue_mark_worker_idle``:
        only a worker not idle already changes)."""
        w = self.workers.setdefault(rec["worker_id"], _worker(rec["worker_id"]))
        if w["status"] != "idle":
            w.update(status="idle", last_idle_time=rec["now"], last_dequeue_time=rec["now"])
        return 200, copy.deepcopy(w)

    def _op_v03_status(self, rec: Mapping[str, Any]) -> Result:
        """``rollout_id``, ``attempt_id`` (or ``latest``), ``status``, ``end_time``, ``now``, ``worker_id``, ``metadata``: an attempt of
        a known rollout moved on (``update_attempt``); the latest attempt's status moves its rollout
        (:meth:`_rollout_status`), an older one's does not, as in its store; its worker follows. 404 (nothing changed)
        for an attempt not recorded. Answers the attempt as kept."""
        rid, status = rec["rollout_id"], rec["status"]
        latest = self.latest_v03(rid)
        aid = latest["attempt_id"] if latest is not None and rec.get("attempt_id") == "latest" else rec.get("attempt_id")
        attempt = next((a for a in self.attempts_v03.get(rid, []) if a["attempt_id"] == aid), None)
        if attempt is None:
            return 404, {"detail": f"Attempt {aid} not found for rollout {rid}"}
        if rec.get("worker_id") is not None:
            attempt["worker_id"] = rec["worker_id"]
        if rec.get("metadata") is not None:
            attempt["metadata"] = copy.deepcopy(rec["metadata"])
        if status is not None:
            attempt.update(status=status, end_time=rec.get("end_time") if status in ATTEMPT_ENDED else None)
        attempt["last_heartbeat_time"] = rec.get("now", attempt.get("last_heartbeat_time"))
        rollout = self.rollouts_v03[rid]
        if status is not None and attempt is latest and (moved := self._rollout_status(rid, attempt)) is not None:
            rollout.update(status=moved, end_time=rec.get("end_time") if moved in ROLLOUT_ENDED else None)
        if status is not None or rec.get("worker_id") is not None:
            self._sync_worker(attempt, rec.get("now"))
        return 200, copy.deepcopy(attempt)

    def _op_v03_attempt(self, rec: Mapping[str, Any]) -> Result:
        """``rollout_id``, ``attempt_id``, ``worker_id``, ``now``: a new attempt of a known rollout (``start_attempt``),
        numbered one above its attempts so far, its rollout ``preparing``; 404 for a rollout never recorded. As its
        store does, one still in the queue (``queuing``, or offered again after a failed attempt) leaves it: its
        task's owner replica no longer hands it out (:attr:`left_queue_v03`)."""
        rid = rec["rollout_id"]
        rollout = self.rollouts_v03.get(rid)
        if rollout is None:
            return 404, {"detail": f"Rollout {rid} not found"}
        attempt = {"rollout_id": rid, "attempt_id": rec["attempt_id"], "sequence_id": len(self.attempts_v03.get(rid, [])) + 1,
                   "start_time": rec["now"], "end_time": None, "status": "preparing", "worker_id": rec.get("worker_id"),
                   "last_heartbeat_time": None, "metadata": None}
        self._keep_attempt(rid, attempt)
        self._sync_worker(attempt, rec["now"])
        self.left_queue_v03.add(rid)
        rollout.update(status="preparing", end_time=None)
        return 201, {**copy.deepcopy(rollout), "attempt": dict(attempt)}

    def _op_v03_update(self, rec: Mapping[str, Any]) -> Result:
        """``rollout_id``, ``fields`` (``update_rollout``'s: input, mode, resources_id, status, config, metadata),
        ``now``: set on a known rollout; an ended status sets its end time, and any status takes it out of the queue
        (:attr:`left_queue_v03`), as its store does. 404 for one never recorded."""
        rollout = self.rollouts_v03.get(rec["rollout_id"])
        if rollout is None:
            return 404, {"detail": f"Rollout {rec['rollout_id']} not found"}
        rollout.update(copy.deepcopy(dict(rec["fields"])))
        if "status" in rec["fields"]:
            rollout["end_time"] = rec["now"] if rec["fields"]["status"] in ROLLOUT_ENDED else None
            self.left_queue_v03.add(rec["rollout_id"])
        return 200, copy.deepcopy(rollout)

    def _op_resources_set(self, rec: Mapping[str, Any]) -> Result:
        """``update``: a set of resources (a ``ResourcesUpdate``) this API named or served, kept by its id (the first
        record of an id wins), so ``get_resources_by_id`` answers it after newer versions came."""
        update = rec["update"]
        self.resource_sets.setdefault(update["resources_id"], copy.deepcopy(dict(update)))
        return 200, None

    def _op_worker(self, rec: Mapping[str, Any]) -> Result:
        """``worker``: a heartbeat (``update_worker``): its stats (kept when it sends none) and time."""
        beat = dict(rec["worker"])
        w = self.workers.setdefault(beat["worker_id"], _worker(beat["worker_id"]))
        w["last_heartbeat_time"] = beat.get("last_heartbeat_time")
        if beat.get("heartbeat_stats") is not None:
            w["heartbeat_stats"] = beat["heartbeat_stats"]
        return 200, copy.deepcopy(w)

    # ------------------------------------------------------------------ reads

    def attempts(self, rollout_id: str) -> list[str]:
        """The attempts that posted events, in the order of their first one (as its server lists them)."""
        return list(self.events.get(rollout_id, {}))

    def rollout_events(self, rollout_id: str, event_type: str | None = None) -> list[dict[str, Any]]:
        """The events of the rollout's last attempt (its ``last_attempt_id``, else ``"0"``), as its server reads them."""
        rollout = self.rollouts[rollout_id]
        aid = rollout["status"].get("last_attempt_id") or DEFAULT_ATTEMPT_ID
        events = self.events.get(rollout_id, {}).get(aid, [])
        return [copy.deepcopy(e) for e in events if event_type is None or e["event_type"] == event_type]

    def listed(self, states: tuple[str, ...], limit: int) -> list[dict[str, Any]]:
        return copy.deepcopy([r for r in self.rollouts.values() if r["status"]["state"] in states][:limit])

    def terminal_page(self, after: int, limit: int) -> dict[str, Any]:
        after, limit = max(after, 0), max(limit, 1)
        ids = self.terminal[after:after + limit]
        items = [{"rollout_id": rid, "state": self.rollouts[rid]["status"]["state"], "data_id": _data_id(self.rollouts[rid]),
                  "is_train": self.rollouts[rid]["is_train"]} for rid in ids if rid in self.rollouts]
        return {"items": items, "next_after": after + len(ids), "total_terminal": len(self.terminal)}


class LocalControl:
    """The control records applied at once in this process: one replica and no Kafka (the unit tests; a gateway
    built without the control topic). Same calls as :class:`producers.ingest.agl.control_log.ControlLog`."""

    def __init__(self) -> None:
        self.state = ControlState()
        self._lock = threading.Lock()

    def write(self, record: Mapping[str, Any]) -> Result:
        with self._lock:
            return self.state.apply(copy.deepcopy(dict(record)))

    def read(self, fn: Callable[[ControlState], Any]) -> Any:
        with self._lock:
            return fn(self.state)

    def peek(self, fn: Callable[[ControlState], Any]) -> Any:
        return self.read(fn)

    def close(self) -> None:
        pass


__all__ = ["ControlState", "LocalControl", "Result", "TRANSITIONS", "TERMINAL"]
