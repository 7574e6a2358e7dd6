"""The feedback stage: late rewards on ``<prefix>feedback`` (keyed by rollout id) → the rollout's stored
final reward, and a one-rollout batch on rb.batches for a task-less train rollout. The rules are
:mod:`streams.feedback`'s; the baseline :mod:`streams.baselines`'.

A faust agent of the worker. Each Feedback is decided against the rollout's row in ClickHouse (its latest
attempt) and the stage's table ``feedback-applied`` (rollout id → the feedback applied, and the advantage it
trained with; per partition, the running baseline's windows). Unknown rollout, a second feedback, or one
past ``window_s``: dead-lettered on rb.dlq with the reason, and counted.

Delivery: the stage's own commit point (:class:`streams.checkpoint.Checkpoint`, the steps done here on
faust's aiokafka producer, as the group stage does): the rows written, then the batches and dead letters
delivered, then the table entries, then the events acked. A crash replays what was not acked: a feedback
whose entry was restored is only counted again; one whose rows were written but whose entry was lost is
done again with the same rows and the same batch id, which the trainer drops (it dedupes by group id).
So each feedback reaches the store and training once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from foundation.errors import ClickHouseError, DecodeError, KafkaUnavailable, ValidationError
from schemas import codec
from schemas.models import DeadLetter, Feedback, GroupBatch
from streams.baselines import FEEDBACK_BASELINES, LeaveOneOutBaseline, prompt_key
from streams.checkpoint import Checkpoint
from streams.feedback import AGAIN, APPLY, StoredRollout, agent_of, apply, verdict
from streams.groups_stage import _refused_for_good
from streams.health import StreamHealth
from streams.spans_stage import DLQ_OUT, dead_letter_reason

log = logging.getLogger("rolloutbus.streams")

FEEDBACK = Counter("rolloutbus_streams_feedback_total", "Feedback records by outcome "
                   "(applied, redelivered, feedback.unknown_rollout, feedback.duplicate, feedback.after_window, "
                   "feedback.group_open, decode.*)",
                   ["outcome"])

ROLLOUT_COLUMNS = ("rollout_id", "attempt_id", "task_id", "mode", "attempt", "resource_version", "status", "final_reward",
                   "started_ns", "finished_ns", "span_count", "spans_seen", "missing_sequence_ids", "transition_count",
                   "group_id", "error", "metadata", "updated_ns")
TRANSITION_COLUMNS = ("rollout_id", "attempt_id", "turn", "task_id", "span_id", "agent_name", "resource_version",
                      "prompt_token_ids", "response_token_ids", "response_logprobs", "response_mask", "reward", "return_",
                      "advantage", "trained", "group_id", "credit", "updated_ns")


# Records decided together (their ClickHouse reads shared): at most this many wait for the next commit point.
FEEDBACK_BATCH = 64


def feedback_topic_name(prefix: str) -> str:
    return f"{prefix}feedback"


@dataclass
class _Known:
    """What a batch of feedback records needs from ClickHouse: rollout id → its stored row (latest attempt), the
    GRPO groups among theirs that are emitted, and rollout id → its ``transitions`` rows (every attempt, by turn)."""

    rollouts: dict[str, StoredRollout]
    emitted: set[str] = field(default_factory=set)
    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class _Point:
    acks: list[tuple[Any, Any]] = field(default_factory=list)
    changes: list[tuple[bytes, int, bytes | None]] = field(default_factory=list)  # (key, partition, value)


class FeedbackStage:
    """Decides and applies feedback; its commit point is :class:`Checkpoint`'s (:class:`Committing` here).

    The records the agent has at hand are decided together (:meth:`on_feedbacks`): up to three ClickHouse reads on
    the event loop for them all (their rollouts, their groups, their steps), then each in order as if alone.

    ``baseline``: ``none`` (advantage = the reward), ``loo`` (the reward minus the agent's running
    leave-one-out mean over the last ``baseline_window`` feedback rewards of its partition) or ``prompt``
    (the same over the earlier feedback rewards of the rollouts with its prompt key, :func:`prompt_key`:
    the streaming form of a prompt-key group; a key's first feedback has no baseline and trains with 0).
    Both running baselines are kept per partition of the feedback topic (its table entries move with it)."""

    def __init__(self, app: Any, *, sink: Any, health: StreamHealth, batches_topic: Any, dlq_topic: Any, table: Any,
                 flush: Callable[[], None], submit: Callable[[], int], window_s: float, baseline: str = "loo",
                 baseline_window: int = 64, pipelined: bool = True, batch: int = FEEDBACK_BATCH,
                 on_emit: Callable[[GroupBatch], None] | None = None) -> None:
        self.window_of = FEEDBACK_BASELINES.get(baseline)  # an unknown name: one line listing the known ones
        self.app, self.sink, self.health = app, sink, health
        self.batches_topic, self.dlq_topic, self.table = batches_topic, dlq_topic, table
        self.window_s, self.baseline, self.baseline_window = window_s, baseline, baseline_window
        self._pending: list[tuple[Any, Any]] = []
        self.batch = batch
        self._waiting: list[Any] = []  # records not decided yet, in their order
        self._held: dict[int, tuple[Any, Any]] = {}  # id(event) → its ack, while the event waits
        self._draining = asyncio.Lock()
        self._out: list[tuple[Any, bytes | None, bytes, Any]] = []
        self._dirty: dict[bytes, int] = {}  # table key → partition, changed since the last commit point
        self.stats = {"feedback_applied": 0, "feedback_redelivered": 0, "feedback_dead": 0}
        self.checkpoint = Checkpoint(self, sink, flush, submit if pipelined else None, wait=True)
        self.on_emit = on_emit  # each one-rollout batch sent, as the group stage's (the trackers' report)

    # ------------------------------------------------------------------ the agent

    async def on_feedback(self, event: Any) -> None:
        """One Feedback record: decided with those that came with it (:meth:`on_feedbacks`) once ``batch`` wait or at
        the next commit point (:meth:`try_commit`), whichever comes first. Its ack waits for that (:meth:`ack_later`)."""
        self._waiting.append(event)
        if len(self._waiting) >= self.batch:
            await self.drain()

    async def drain(self) -> None:
        """Decide the records waiting, in their order; their acks go with the next commit point."""
        async with self._draining:  # one batch at a time, in order (the agent's and a commit point's)
            events, self._waiting = self._waiting, []
            if not events:
                return
            # Not in a finally: a stop that cancels this leaves their acks held, and the next worker reads them again.
            await self.on_feedbacks(events)
            for event in events:
                ack = self._held.pop(id(event), None)
                if ack is not None:
                    self._pending.append(ack)

    async def on_feedbacks(self, events: list[Any]) -> None:
        """Feedback records in their order, each decided, applied or dead-lettered as if alone: what they need
        from ClickHouse is read first, one query per table for them all (a record costs a round trip less
        than its own reads). A record that fails is dead-lettered (``processing_error``), the others go on."""
        decoded: list[tuple[Any, Feedback | tuple[str, str]]] = []  # a record, or why it is dead-lettered
        for event in events:
            try:
                decoded.append((event, codec.decode(event.message.value, "rolloutbus.Feedback")))  # type: ignore[arg-type]
            except (DecodeError, ValidationError) as exc:
                decoded.append((event, (dead_letter_reason(exc), str(exc))))
            except Exception:  # noqa: BLE001 - one bad record must not stop the others
                log.exception("decoding %s[%s]@%s failed", event.message.topic, event.message.partition, event.message.offset)
                decoded.append((event, ("processing_error", "see worker log")))
        ids = [fb.rollout_id for _, fb in decoded if isinstance(fb, Feedback)]
        known: _Known | None = None
        if len(ids) > 1:
            try:
                known = await self._read(ids)
            except Exception:  # noqa: BLE001 - each record reads on its own then, and fails (or not) alone
                log.exception("reading %d feedback records' rollouts at once failed; reading them one by one", len(ids))
        for event, fb in decoded:
            if not isinstance(fb, Feedback):
                await self.dead_letter(event, *fb)
                continue
            try:
                await self._decide(event, fb, known)
            except Exception:  # noqa: BLE001 - one bad record must not stop the others
                msg = event.message
                log.exception("processing %s[%s]@%s failed", msg.topic, msg.partition, msg.offset)
                await self.dead_letter(event, "processing_error", "see worker log")

    async def _decide(self, event: Any, fb: Feedback, known: _Known | None) -> None:
        msg = event.message
        entry = self._entry(fb.rollout_id)
        if known is not None:
            rollout = known.rollouts.get(fb.rollout_id)
            emitted = rollout is None or not rollout.grpo_group or rollout.grpo_group in known.emitted
        else:
            rollout = await self._stored(fb.rollout_id)
            emitted = rollout is None or not rollout.grpo_group or await self._group_emitted(rollout.grpo_group)
        what = verdict(fb, rollout, entry.get("feedback_id"), self.window_s, emitted)
        if what == AGAIN and entry:
            # Its entry is here: applied in this worker's life (its rows and batch go with an earlier commit
            # point) or restored from the changelog (which lands only after them). Nothing to redo.
            self._count("redelivered")
            return
        if what not in (APPLY, AGAIN):
            self._count(what)
            await self.dead_letter(event, what, self._detail(what, fb, rollout, entry))
            return
        assert rollout is not None
        if not rollout.trains:
            steps = []
        elif known is not None:
            steps = [s for s in known.steps.get(rollout.rollout_id, []) if s["attempt_id"] == rollout.row["attempt_id"]]
        else:
            steps = await self._steps(rollout)
        advantage = self._advantage(msg.partition, agent_of(steps), prompt_key(steps), fb.value) if what == APPLY and steps else 0.0
        done = apply(fb, rollout, steps, advantage)
        source = (msg.topic, msg.partition, msg.offset)
        self.sink.add("rollouts", done.rollout_row, source)
        self.sink.add_many("transitions", done.transition_rows, source)
        if done.batch is not None:
            self._produce(self.batches_topic, done.batch.group_id.encode(), codec.encode(done.batch))
            if self.on_emit is not None:
                self.on_emit(done.batch)
        self._put(fb.rollout_id.encode(), msg.partition, json.dumps({"feedback_id": fb.feedback_id}).encode())
        self._count("applied" if what == APPLY else "redelivered")

    def _entry(self, rollout_id: str) -> dict[str, Any]:
        raw = self.table.data.get(rollout_id.encode())
        return json.loads(raw) if raw else {}

    def _advantage(self, partition: int, agent: str, prompt: str, reward: float) -> float:
        """The reward against the running window the baseline names from the rollout's partition, agent and prompt
        key (streams.baselines.FEEDBACK_BASELINES)."""
        window = self.window_of(partition, agent, prompt)
        if window is None:
            return reward
        entry, name = window
        key = entry.encode()
        raw = self.table.data.get(key)
        loo = LeaveOneOutBaseline.from_state(json.loads(raw) if raw else {}, self.baseline_window)
        adv = loo.advantage(name, reward)
        self._put(key, partition, json.dumps(loo.state()).encode())
        return adv

    def _detail(self, what: str, fb: Feedback, rollout: StoredRollout | None, entry: dict[str, Any]) -> str:
        if rollout is None:
            return f"no rollout {fb.rollout_id!r} is stored (feedback {fb.feedback_id})"
        if what == "feedback.group_open":
            return (f"rollout {fb.rollout_id} is in GRPO group {rollout.grpo_group}, not emitted yet; send feedback "
                    f"{fb.feedback_id} again once it is (its emission rewrites the rollout's reward)")
        if what == "feedback.after_window":
            late = (fb.time_ns - rollout.finished_ns) / 1e9
            return f"feedback {fb.feedback_id} came {late:.1f}s after rollout {fb.rollout_id} finished; the window is {self.window_s:g}s"
        return f"rollout {fb.rollout_id} already has feedback {entry.get('feedback_id') or rollout.applied}; {fb.feedback_id} not applied"

    def _count(self, outcome: str) -> None:
        FEEDBACK.labels(outcome).inc()
        name = {"applied": "feedback_applied", "redelivered": "feedback_redelivered"}.get(outcome, "feedback_dead")
        self.stats[name] += 1

    # ------------------------------------------------------------------ ClickHouse reads

    async def _query(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Rows of ``sql``, read on the loop while no sink batch is being written (one client, one request at a time)."""
        while self.sink.busy:
            await asyncio.sleep(0.005)
        return list(self.sink.client.query(sql, parameters=params).named_results())

    async def _read(self, rollout_ids: list[str]) -> _Known:
        """What :meth:`_stored`, :meth:`_group_emitted` and :meth:`_steps` read, for many rollouts in three queries."""
        ids = sorted(set(rollout_ids))
        rows = await self._query(
            f"SELECT {', '.join(ROLLOUT_COLUMNS)} FROM rollouts FINAL WHERE rollout_id IN {{ids:Array(String)}} "
            "ORDER BY rollout_id, attempt DESC, finished_ns DESC LIMIT 1 BY rollout_id", {"ids": ids})
        known = _Known({str(r["rollout_id"]): StoredRollout(r) for r in rows})
        groups = sorted({r.grpo_group for r in known.rollouts.values() if r.grpo_group})
        if groups:
            found = await self._query("SELECT DISTINCT group_id FROM groups FINAL WHERE group_id IN {gids:Array(String)}",
                                      {"gids": groups})
            known.emitted = {str(r["group_id"]) for r in found}
        trains = sorted(rid for rid, r in known.rollouts.items() if r.trains)
        if trains:
            for step in await self._query(
                    f"SELECT {', '.join(TRANSITION_COLUMNS)} FROM transitions FINAL WHERE rollout_id IN {{ids:Array(String)}} "
                    "ORDER BY rollout_id, attempt_id, turn", {"ids": trains}):
                known.steps.setdefault(str(step["rollout_id"]), []).append(step)
        return known

    async def _stored(self, rollout_id: str) -> StoredRollout | None:
        rows = await self._query(
            f"SELECT {', '.join(ROLLOUT_COLUMNS)} FROM rollouts FINAL WHERE rollout_id = {{rid:String}} "
            "ORDER BY attempt DESC, finished_ns DESC LIMIT 1", {"rid": rollout_id})
        return StoredRollout(rows[0]) if rows else None

    async def _group_emitted(self, group_id: str) -> bool:
        rows = await self._query("SELECT count() AS n FROM groups FINAL WHERE group_id = {gid:String}", {"gid": group_id})
        return bool(rows and rows[0]["n"])

    async def _steps(self, rollout: StoredRollout) -> list[dict[str, Any]]:
        return await self._query(
            f"SELECT {', '.join(TRANSITION_COLUMNS)} FROM transitions FINAL WHERE rollout_id = {{rid:String}} "
            "AND attempt_id = {aid:String} ORDER BY turn", {"rid": rollout.rollout_id, "aid": rollout.row["attempt_id"]})

    # ------------------------------------------------------------------ dead letters and outputs

    async def dead_letter(self, event: Any, reason: str, detail: str) -> None:
        msg = event.message
        dl = DeadLetter(source_topic=msg.topic, partition=msg.partition, offset=msg.offset, key=msg.key,
                        value=msg.value if isinstance(msg.value, (bytes, type(None))) else None,
                        reason=reason, detail=detail[:4000], stage="streams.feedback", time_ns=time.time_ns())
        self._produce(self.dlq_topic, msg.key, codec.encode(dl))
        DLQ_OUT.labels(msg.topic).inc()
        log.warning("dead letter %s[%s]@%s: %s: %s", msg.topic, msg.partition, msg.offset, reason, detail)

    def _produce(self, topic: Any, key: bytes | None, value: bytes) -> None:
        self._out.append((topic, key, value, topic.send_soon(key=key, value=value)))

    def _put(self, key: bytes, partition: int, value: bytes) -> None:
        self.table.data[key] = value
        self._dirty[key] = partition

    # ------------------------------------------------------------------ commit point (streams.checkpoint.Committing)

    def ack_later(self, stream: Any, event: Any) -> None:
        if any(e is event for e in self._waiting):  # acked once it is decided (drain), never before
            self._held[id(event)] = (stream, event)
        else:
            self._pending.append((stream, event))

    async def maybe_commit(self) -> None:
        if self.sink.due() or len(self._pending) >= self.sink.batch_size:
            await self.try_commit()

    async def commit_final(self) -> None:
        """The last commit point (a stop): the records waiting decided, then everything written and acked."""
        await self.drain()
        await self.checkpoint.commit(final=True)

    async def try_commit(self) -> None:
        """A commit point, after the records waiting are decided; a failure is logged and tried again at the next
        one (as the group stage's)."""
        try:
            await self.drain()
            await self.checkpoint.commit()
        except (ClickHouseError, KafkaUnavailable) as exc:
            log.error("feedback stage commit point failed (retrying; nothing is acked past what was written): %s", exc)
            self.health.problem("feedback", "the feedback stage's commit point is failing (see the worker log)")
        else:
            self.health.clear("feedback")

    def take(self, final: bool) -> _Point:
        pending, self._pending = self._pending, []
        dirty, self._dirty = self._dirty, {}
        return _Point(pending, [(k, p, self.table.data.get(k)) for k, p in dirty.items()])

    async def deliver(self) -> None:
        await self.app.producer.flush()
        out = list(self._out)
        results = await asyncio.gather(*(fut for *_, fut in out), return_exceptions=True)
        del self._out[:len(out)]
        again = []
        for (topic, key, value, _), res in zip(out, results):
            if isinstance(res, BaseException) and not _refused_for_good(res, topic.get_topic_name()):
                self._produce(topic, key, value)
                again.append(f"{topic.get_topic_name()}: {res!r}")
        if again:
            raise KafkaUnavailable(f"{len(again)} records not delivered ({again[0]}); sent again at the next commit point")

    async def send_changelog(self, points: list[_Point], by: float | None) -> None:
        changes = [(point, c) for point in points for c in point.changes]
        sent = [self.table.send_changelog(partition, key, value) for _, (key, partition, value) in changes]
        await self.app.producer.flush()
        results = await asyncio.gather(*sent, return_exceptions=True)
        failed = [(p, c) for (p, c), r in zip(changes, results)
                  if isinstance(r, BaseException) and not _refused_for_good(r, "the changelog of table feedback-applied")]
        for point in points:
            point.changes = [c for p, c in failed if p is point]
        if failed:
            raise KafkaUnavailable(f"{len(failed)} feedback table entries not delivered; sent again at the next commit point")

    async def commit(self, points: list[_Point], final: bool) -> None:
        for point in points:
            for stream, event in point.acks:
                await stream.ack(event)

    def put_back(self, points: list[_Point], sent: bool) -> bool:
        for point in reversed(points):
            self._pending[:0] = point.acks
        for point in points:
            for key, partition, _ in point.changes:
                self._dirty.setdefault(key, partition)
            point.acks, point.changes = [], []
        return True


__all__ = ["FEEDBACK", "FeedbackStage", "feedback_topic_name"]
