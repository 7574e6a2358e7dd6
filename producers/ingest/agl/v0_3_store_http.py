"""The routes of Agent Lightning 0.3's LightningStore API that the gateway serves (``/v1/agl/...``).

The attempt-level calls its runner makes — health, spans, sequence ids, attempt updates, resources,
worker heartbeats — mapped by :mod:`producers.ingest.agl.v0_3_store`. Its OTLP endpoint (``/v1/traces``) is the
gateway's own. The queue (``queues/rollouts/enqueue`` / ``dequeue``) is rb.tasks, claimed through
:mod:`producers.ingest.agl.queue` (its records :mod:`producers.ingest.agl.v0_3_queue_records`'); ``start_rollout``
starts an attempt the caller runs at once (no task); ``add_resources`` / ``update_resources`` publish
versions on rb.resources (:mod:`producers.ingest.resources`). The rollouts, attempts, sequence counters and workers
this API writes are control records (:mod:`producers.ingest.agl.control`) read back at once through any replica
(``start_attempt``, ``update_rollout``, ``statistics`` are those records' only); the spans and ended attempts of
other rollouts, and ``wait_for_rollouts``, answer from ClickHouse. A call not listed answers 501 naming it. Token, body and error shape are the front door's
(:mod:`producers.ingest.front_door`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from foundation.errors import EncodeError, KafkaUnavailable
from producers.ingest.agl.claims import may_be_minted, new_attempt_id
from producers.ingest.agl.v0_3_queue_records import (
    EnqueueError,
    attempted_rollout,
    enqueue_requests,
    new_rollout_id,
    task_from_request,
)
from producers.ingest.agl.v0_3_store import (
    PREFIX,
    check_rollout_update,
    resources_page,
    sequence_key,
    unnumber,
    ROLLOUT_COLUMNS,
    check_query,
    check_page,
    Refused,
    SPAN_COLUMNS,
    filter_rollouts,
    filter_spans,
    page,
    rollouts_from_rows,
    span_to_agl,
    attempt_from_row,
    attempt_reply,
    check_attempt_update,
    check_wait,
    finished_from_update,
    finished_rollouts,
    resources_update,
    versions_from_agl,
    span_from_agl,
    worker_reply,
)
from producers.ingest.front_door import BadRequest, BodyTooLarge, FrontDoor, TooDeep, guarded
from producers.ingest.resources import Publish, Resources, newest
from producers.mapping import MappingError
from producers.transport import SPAN, SpanTransport
from schemas.codec import encode, encode_raw
from schemas.models import UNNUMBERED, RolloutEvent

if TYPE_CHECKING:
    from producers.ingest.agl.control import ControlState, LocalControl
    from producers.ingest.agl.control_log import ControlLog
    from producers.ingest.agl.queue import ClickHouseReader, TaskQueue

log = logging.getLogger(__name__)

ENDED = ("succeeded", "failed", "timeout", "cancelled")  # a 0.3 rollout's statuses once an attempt of it ended
MAX_ROWS = 100_000  # rows one read takes from ClickHouse (filters it cannot push down run here)


class _Unavailable(Exception):
    """ClickHouse did not answer a read."""


def _with_attempt(state: ControlState, rollout_id: str) -> dict[str, Any] | None:
    """A recorded rollout (a copy), with its latest attempt when it has one (its ``AttemptedRollout``)."""
    rollout = state.rollouts_v03.get(rollout_id)
    if rollout is None:
        return None
    out = copy.deepcopy(rollout)
    attempts = state.attempts_v03.get(rollout_id)
    if attempts:
        out["attempt"] = copy.deepcopy(max(attempts, key=lambda a: a["sequence_id"]))
    return out


class LightningStoreRoutes:
    """Adds the ``/v1/agl`` routes to the gateway's application."""

    def __init__(self, transport: SpanTransport, resources: Resources, *, token: str | None = None,
                 retry_after_s: int = 5, max_body_bytes: int = 16 << 20, queue: TaskQueue | None = None) -> None:
        self.transport = transport
        self.resources = resources
        self.queue = queue  # None: the queue calls answer 501 (a gateway built without Kafka consumer settings)
        self.clickhouse: ClickHouseReader | None = None  # None: the reads answer 501
        self.publish: Publish | None = None  # None: add_resources / update_resources answer 501
        self.wait_poll_s = 0.5  # how often wait_for_rollouts reads ClickHouse
        # The control records every replica replays (None: as before them): rollouts readable once enqueued, workers.
        self.control: ControlLog | LocalControl | None = None
        self.door = FrontDoor(token=token, max_body_bytes=max_body_bytes, retry_after_s=retry_after_s, detail=True)
        self.started = time.monotonic()

    def add_to(self, app: web.Application) -> None:
        r = app.router
        if self.control is not None and self.queue is not None:
            self.queue.settled_v03 = self.settled
        r.add_get(f"{PREFIX}/health", self.health)
        r.add_post(f"{PREFIX}/queues/rollouts/enqueue", self.enqueue)
        r.add_post(f"{PREFIX}/queues/rollouts/dequeue", self.dequeue)
        r.add_post(f"{PREFIX}/rollouts", self.start_rollout)
        r.add_post(f"{PREFIX}/rollouts/{{rollout_id}}/attempts", self.start_attempt)
        r.add_get(f"{PREFIX}/statistics", self.statistics)
        r.add_get(f"{PREFIX}/resources", self.query_resources)
        r.add_post(f"{PREFIX}/spans/next", self.next_sequence_id)
        r.add_post(f"{PREFIX}/spans", self.add_span)
        r.add_post(f"{PREFIX}/rollouts/search", self.query_rollouts)
        r.add_get(f"{PREFIX}/rollouts", self.query_rollouts)
        r.add_get(f"{PREFIX}/rollouts/{{rollout_id}}", self.get_rollout)
        r.add_post(f"{PREFIX}/rollouts/{{rollout_id}}/attempts/search", self.query_attempts)
        r.add_get(f"{PREFIX}/rollouts/{{rollout_id}}/attempts", self.query_attempts)
        r.add_get(f"{PREFIX}/rollouts/{{rollout_id}}/attempts/latest", self.latest_attempt)
        r.add_post(f"{PREFIX}/spans/search", self.query_spans)
        r.add_get(f"{PREFIX}/spans", self.query_spans)
        r.add_post(f"{PREFIX}/rollouts/{{rollout_id}}/attempts/{{attempt_id}}", self.update_attempt)
        r.add_post(f"{PREFIX}/rollouts/{{rollout_id}}", self.update_rollout)
        r.add_get(f"{PREFIX}/resources/latest", self.latest_resources)
        r.add_get(f"{PREFIX}/resources/{{resources_id}}", self.resources_by_id)
        r.add_post(f"{PREFIX}/resources", self.add_resources)
        r.add_post(f"{PREFIX}/resources/{{resources_id}}", self.add_resources)  # update_resources: the same on the bus
        r.add_post(f"{PREFIX}/waits/rollouts", self.wait_for_rollouts)
        r.add_post(f"{PREFIX}/workers/{{worker_id}}", self.update_worker)
        r.add_get(f"{PREFIX}/workers/{{worker_id}}", self.get_worker)
        r.add_get(f"{PREFIX}/workers", self.query_workers)
        r.add_post(f"{PREFIX}/workers/search", self.query_workers)
        r.add_route("*", f"{PREFIX}/{{call:.*}}", self.not_on_the_bus)  # registered last: the others win

    # ------------------------------------------------------------------ helpers

    async def _json(self, request: web.Request) -> Any:
        """The body as JSON (None when empty); :class:`MappingError` for one that is too big, unreadable or not
        JSON, which each route answers in its own words. Two are not the routes' to answer, as before the front
        door: JSON nested too deep (:class:`TooDeep`, the front door's 400) and a body sent without its length
        (chunked) found over the limit while it is read (aiohttp's own 413, raised through)."""
        try:
            return await self.door.json(request)
        except TooDeep:
            raise
        except BodyTooLarge as exc:
            if isinstance(exc.__cause__, web.HTTPRequestEntityTooLarge):
                raise exc.__cause__ from None
            raise MappingError(str(exc)) from exc
        except BadRequest as exc:
            raise MappingError(str(exc)) from exc

    def _send(self, key: str, value: bytes) -> web.Response | None:
        """Hand a record to the transport; a 503 answer when it cannot keep it."""
        return self.door.deliver(self.transport, [(key.encode(), value)])

    # ------------------------------------------------------------------ routes

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    @guarded()
    async def next_sequence_id(self, request: web.Request) -> web.Response:
        """``get_next_span_sequence_id``: the attempt's counter in the control records, 1 up, each id once through
        any replica. Without them, 0: the span stage numbers the span (:func:`unnumber`)."""
        try:
            key = sequence_key(await self._json(request))
        except MappingError as exc:
            return self.door.refuse(422, f"not a sequence id request: {exc}")
        if self.control is None:
            return web.json_response({"sequence_id": UNNUMBERED})
        _status, n = await self._write({"op": "sequence", "key": key})
        return web.json_response({"sequence_id": n})

    async def _write(self, record: dict[str, Any]) -> Any:
        assert self.control is not None
        return await asyncio.get_running_loop().run_in_executor(None, self.control.write, record)

    @guarded()
    async def add_span(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
            span = span_from_agl(body, now_ns=time.time_ns())
            seq = unnumber(span)
            value = encode_raw(SPAN, span)
        except (MappingError, EncodeError) as exc:
            return self.door.refuse(400, f"not an Agent Lightning span: {exc}")
        key = f"{span['rollout_id']}/{span['attempt_id']}"
        if self.control is not None and seq > self.control.peek(lambda s: s.sequence.get(key, 0)):
            # an id the counter has not handed out yet (the caller's own): the counter goes on above it
            await self._write({"op": "sequence_seen", "key": key, "id": seq})
        if (busy := self._send(span["rollout_id"], value)) is not None:
            return busy
        return web.json_response(body, status=201)

    @guarded()
    async def update_attempt(self, request: web.Request) -> web.Response:
        """``update_attempt``: an ended status is the attempt's FINISHED on rb.spans; on an attempt this API handed out, a
        new status or worker is recorded (the latest attempt's status moves its rollout, as in its store; a heartbeat
        alone writes nothing). ``latest`` names the rollout's latest attempt as recorded (404 before its first)."""
        rollout_id, attempt_id = request.match_info["rollout_id"], request.match_info["attempt_id"]
        try:
            body = check_attempt_update(await self._json(request))
        except MappingError as exc:
            return self.door.refuse(400, str(exc) if isinstance(exc, Refused) else f"not an attempt update: {exc}")
        if attempt_id == "latest":
            latest = await self._controlled(lambda s: (s.latest_v03(rollout_id) or {}).get("attempt_id")) \
                if self.control is not None else None
            if latest is None:
                return self.door.refuse(404, f"No attempts found for rollout {rollout_id}")
            attempt_id = latest
        event = finished_from_update(rollout_id, attempt_id, body, now_ns=time.time_ns())
        if event is not None:
            if (busy := self._send(rollout_id, encode(event))) is not None:
                return busy
            log.debug("attempt %s/%s ended through the store API: %s", rollout_id, attempt_id, event.status)
            if self.queue is not None:
                self.queue.finished(attempt_id, event.status or "succeeded")
        reply = attempt_reply(rollout_id, attempt_id, body, now=time.time())
        if self.control is not None and await self._controls(rollout_id, attempt_id):
            status = event.status if event is not None and event.status else body.get("status")
            known = self.control.peek(lambda s: next((dict(a) for a in s.attempts_v03.get(rollout_id, [])
                                                      if a["attempt_id"] == attempt_id), None))
            worker, metadata = body.get("worker_id"), body.get("metadata")
            # This replica's view may lag (an attempt dequeued through another one): not known here is written too.
            if event is not None or (status is not None and (known is None or known.get("status") != status)) \
                    or (worker is not None and (known is None or known.get("worker_id") != worker)) \
                    or (metadata is not None and (known is None or known.get("metadata") != metadata)):
                answer = await self._record({"op": "v03_status", "rollout_id": rollout_id, "attempt_id": attempt_id,
                                             "status": status, "end_time": reply["end_time"],
                                             "now": reply["last_heartbeat_time"], "worker_id": worker, "metadata": metadata})
                known = answer[1] if answer is not None and answer[0] == 200 else known
            if known is not None:  # its number, start and worker as recorded
                reply.update(sequence_id=known["sequence_id"], start_time=known["start_time"],
                             worker_id=reply["worker_id"] or known.get("worker_id"))
                if status is None:
                    reply.update(status=known["status"], end_time=known.get("end_time"))
                if metadata is None:
                    reply["metadata"] = known.get("metadata")
        return web.json_response(reply)

    async def _controls(self, rollout_id: str, attempt_id: str) -> bool:
        """Whether the attempt's status belongs in the control records: its rollout is one of theirs (enqueued or
        started through this API, on any replica). An attempt this API never handed out (its spans and its end come
        through OTLP and this call only) is the data plane's: its end is the Finished event on the spans topic, and
        a status record of it would change nothing when applied, so none is written and no round trip is made.
        This replica's view answers at once when it knows the rollout; an attempt id of the shape this API mints,
        on a rollout it does not know yet, takes one linearizable read (another replica may have handed it out)."""
        assert self.control is not None
        if self.control.peek(lambda s: rollout_id in s.rollouts_v03):
            return True
        if not may_be_minted(attempt_id):
            return False
        try:
            return bool(await self._controlled(lambda s: rollout_id in s.rollouts_v03))
        except KafkaUnavailable as exc:  # written, as before: applying it changes nothing if the rollout is not theirs
            log.warning("the control records could not be read for %s: %s", rollout_id, exc)
            return True

    async def _record(self, record: dict[str, Any]) -> Any:
        """A control record of what was just answered, and its answer; not recorded (Kafka down: None), it is read back
        later from ClickHouse only, as before the control records."""
        if self.control is None:
            return None
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.control.write, record)
        except Exception as exc:  # noqa: BLE001 — what it records was answered already (a claim made): never a 500 here
            log.warning("a /v1/agl control record was not written: %s", exc)
            return None

    def settled(self, rollout_ids: Sequence[str]) -> set[str]:
        """Of rollouts the queue would hand out, those a start_attempt or a status update (through any replica,
        answered before this call) took out of the queue: the control records' :attr:`left_queue_v03`."""
        assert self.control is not None
        return self.control.read(lambda s: {r for r in rollout_ids if r in s.left_queue_v03})

    async def _controlled(self, fn: Callable[[Any], Any]) -> Any:
        assert self.control is not None
        return await asyncio.get_running_loop().run_in_executor(None, self.control.read, fn)

    def _resources_id(self) -> str | None:
        current = self.resources()
        update = resources_update(current) if current is not None else None
        return update["resources_id"] if update is not None else None

    async def _remember(self, update: dict[str, Any] | None) -> None:
        """Keep a set this API named or served in the control records (once per id), so ``get_resources_by_id`` answers
        it through any replica after newer versions replaced it on rb.resources (a rollout enqueued under it)."""
        if self.control is None or update is None:
            return
        if update["resources_id"] not in self.control.peek(lambda s: s.resource_sets):
            await self._record({"op": "resources_set", "update": update})

    def _newest(self) -> dict[str, Any] | None:
        current = self.resources()
        return resources_update(current) if current is not None else None

    @guarded()
    async def enqueue(self, request: web.Request) -> web.Response:
        """``enqueue_rollout(s)``: each rollout a task on rb.tasks; answers its ``Rollout``s (queuing)."""
        if self.queue is None:
            return await self.not_on_the_bus(request)
        try:
            reqs = enqueue_requests(await self._json(request))
        except (MappingError, EnqueueError) as exc:
            return self.door.refuse(422, f"not an enqueue request: {exc}")
        if not reqs:
            return web.json_response([], status=201)
        await self._remember(self._newest())
        replies = await asyncio.get_running_loop().run_in_executor(None, self.queue.enqueue, reqs, self._resources_id())
        await self._record({"op": "v03_rollouts", "rollouts": replies})
        return web.json_response(replies, status=201)

    @guarded()
    async def dequeue(self, request: web.Request) -> web.Response:
        """``dequeue_rollout(s)``: rollouts of the tasks this replica owns, each claimed by the caller; []
        when it has none (the client's None)."""
        if self.queue is None:
            return await self.not_on_the_bus(request)
        try:
            body = await self._json(request) or {}
        except MappingError as exc:
            return self.door.refuse(422, str(exc))
        if not isinstance(body, dict):
            return self.door.refuse(422, "the request is a JSON object: {\"limit\": <int>, \"worker_id\": <string or null>}")
        limit, worker_id = body.get("limit", 1), body.get("worker_id")
        if isinstance(limit, bool) or not isinstance(limit, int) or (worker_id is not None and not isinstance(worker_id, str)):
            return self.door.refuse(422, "the request is {\"limit\": <int>, \"worker_id\": <string or null>}")
        if limit <= 0:
            return web.json_response([])
        got = await asyncio.get_running_loop().run_in_executor(None, self.queue.dequeue, worker_id, min(limit, 100))
        if got:
            await self._record({"op": "v03_rollouts", "rollouts": got, "now": time.time(), "dequeue": True})
        elif worker_id and self.control is not None and \
                self.control.peek(lambda s: (s.workers.get(worker_id) or {}).get("status")) != "idle":
            await self._record({"op": "v03_idle", "worker_id": worker_id, "now": time.time()})  # once, not per poll
        return web.json_response(got)

    @guarded()
    async def start_rollout(self, request: web.Request) -> web.Response:
        """``start_rollout``: a rollout its caller runs now: no task on rb.tasks, its attempt STARTED on
        rb.spans (task id = rollout id); answers the ``AttemptedRollout``."""
        try:
            body = await self._json(request)
            [req] = enqueue_requests(body)
        except TooDeep:  # a ValueError too, but the front door's 400, not this route's 422
            raise
        except (MappingError, EnqueueError, ValueError) as exc:  # ValueError: not one rollout
            return self.door.refuse(422, f"not a rollout request: {exc}")
        rid, aid, now = new_rollout_id(), new_attempt_id(), time.time()
        await self._remember(self._newest())
        task = task_from_request(req, rollout_id=rid, resources_id=req.get("resources_id") or self._resources_id(),
                                 now_ns=int(now * 1e9))
        worker = req.get("worker_id") if isinstance(req.get("worker_id"), str) else None
        started = RolloutEvent(rollout_id=rid, attempt_id=aid, event="STARTED", time_ns=int(now * 1e9), task_id=rid,
                               mode=task.mode, metadata={"agentlightning.worker_id": worker} if worker else {})
        if (busy := self._send(rid, encode(started))) is not None:
            return busy
        reply = attempted_rollout(task, rid, attempt_id=aid, attempt=1, worker_id=worker, now=now)
        await self._record({"op": "v03_rollouts", "rollouts": [reply]})
        return web.json_response(reply, status=201)

    @guarded()
    async def start_attempt(self, request: web.Request) -> web.Response:
        """``start_attempt``: a new attempt of a recorded rollout, run by its caller now: numbered by the control
        records (one above its attempts so far), its STARTED on rb.spans; answers the ``AttemptedRollout``. One still
        queuing leaves the queue (a dequeue no longer hands it out)."""
        if self.control is None:
            return await self.not_on_the_bus(request)
        rid = request.match_info["rollout_id"]
        try:
            body = await self._json(request) or {}
            worker = body.get("worker_id") if isinstance(body, dict) else None
            if worker is not None and not isinstance(worker, str):
                raise MappingError("worker_id must be a string")
        except MappingError as exc:
            return self.door.refuse(422, f"not a start_attempt request: {exc}")
        now = time.time()
        status, reply = await self._write({"op": "v03_attempt", "rollout_id": rid, "attempt_id": new_attempt_id(),
                                           "worker_id": worker, "now": now})
        if status != 201:
            return self.door.refuse(status, reply["detail"])
        attempt = reply["attempt"]
        started = RolloutEvent(rollout_id=rid, attempt_id=attempt["attempt_id"], event="STARTED", time_ns=int(now * 1e9),
                               task_id=rid, mode=reply.get("mode") or "train", attempt=attempt["sequence_id"],
                               metadata={"agentlightning.worker_id": worker} if worker else {})
        if (busy := self._send(rid, encode(started))) is not None:
            return busy
        return web.json_response(reply, status=201)

    @guarded()
    async def update_rollout(self, request: web.Request) -> web.Response:
        """``update_rollout``: its fields set in the control records (read back at once through any replica). Another
        status takes a rollout still queuing out of the queue (its task's owner settles it, never hands it out). A
        status that puts it back in the queue (``queuing``, ``requeuing``) answers 501: the queue is rb.tasks, whose
        record of it is not taken back; ``start_attempt`` runs a new attempt of it instead."""
        if self.control is None:
            return await self.not_on_the_bus(request)
        try:
            fields = check_rollout_update(await self._json(request))
        except Refused as exc:
            return self.door.refuse(400, str(exc))
        except MappingError as exc:
            return self.door.refuse(422, f"not a rollout update: {exc}")
        if fields.get("status") in ("queuing", "requeuing"):
            return self.door.refuse(501, f"update_rollout(status={fields['status']!r}) is not served by rolloutbus: the "
                                         "queue is rb.tasks, whose task is not put back; start_attempt runs a new attempt")
        status, reply = await self._write({"op": "v03_update", "rollout_id": request.match_info["rollout_id"],
                                           "fields": fields, "now": time.time()})
        if status != 200:
            return self.door.refuse(status, reply["detail"])
        return web.json_response(reply)

    @guarded()
    async def statistics(self, request: web.Request) -> web.Response:
        """``statistics``: what the control records count (the rollouts, attempts and workers of this API, the
        resource sets held); spans are ClickHouse's (null here)."""
        if self.control is None:
            return await self.not_on_the_bus(request)
        counts = await self._controlled(lambda s: (len(s.rollouts_v03), sum(map(len, s.attempts_v03.values())),
                                                   len(s.workers), set(s.resource_sets)))
        return web.json_response({"name": "rolloutbus", "total_rollouts": counts[0], "total_attempts": counts[1],
                                  "total_spans": None, "total_resources": len(counts[3] | {self._resources_id()} - {None}),
                                  "total_workers": counts[2], "uptime": time.monotonic() - self.started})

    @guarded()
    async def query_resources(self, request: web.Request) -> web.Response:
        """``query_resources``: the sets this API named or served (the control records), and the newest, filtered and
        paged as its store pages them."""
        current = self.resources()
        if current is None:
            return self.door.busy("rb.resources is still being read; retry", retry_after_s=1)
        try:
            q = await self._query(request)
            sets = await self._controlled(lambda s: copy.deepcopy(list(s.resource_sets.values()))) if self.control else []
            newest_set = resources_update(current)
            if newest_set is not None and all(u["resources_id"] != newest_set["resources_id"] for u in sets):
                sets.append(newest_set)
            items = [u for u in sets for _ in resources_page(u, q)]
            return web.json_response(page(items, **self._paging(q, None, "ResourcesUpdate")))
        except Refused as exc:
            return self.door.refuse(400, str(exc))
        except MappingError as exc:
            return self.door.refuse(422, f"not a query: {exc}")

    # ------------------------------------------------------------------ reads (ClickHouse)

    async def _query(self, request: web.Request) -> dict[str, Any]:
        """The query of a read: the JSON body of a POST search, the query string of a GET (lists repeat)."""
        if request.method == "POST":
            return check_query(await self._json(request) or {})
        q = request.query
        out: dict[str, Any] = {k: q[k] for k in q if k not in ("status_in", "rollout_id_in")}
        for key in ("status_in", "rollout_id_in"):
            if key in q:
                out[key] = q.getall(key)
        for key in ("limit", "offset"):
            if key in out:
                try:
                    out[key] = int(out[key])
                except ValueError as exc:
                    raise MappingError(f"{key} must be an integer") from exc
        return check_query(out)

    async def _rows(self, sql: str, columns: tuple[str, ...], params: dict[str, Any]) -> list[dict[str, Any]]:
        assert self.clickhouse is not None
        try:
            rows = await asyncio.get_running_loop().run_in_executor(
                None, self.clickhouse.query, f"SELECT {', '.join(columns)} {sql} LIMIT {MAX_ROWS}", params)
        except Exception as exc:  # noqa: BLE001 — the driver's errors of every kind, mapped once, here
            raise _Unavailable(str(exc).splitlines()[0] if str(exc) else repr(exc)) from exc
        if len(rows) >= MAX_ROWS:
            log.warning("a /v1/agl read took its limit of %d rows; narrow it (rollout_id_in, rollout_id_contains)", MAX_ROWS)
        return [dict(zip(columns, row)) for row in rows]

    async def _rollouts(self, where: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        if self.clickhouse is None:
            return []  # a gateway without ClickHouse: the control records answer alone
        return await self._rows(f"FROM rollouts FINAL WHERE {where} ORDER BY rollout_id, attempt", ROLLOUT_COLUMNS, params)

    async def _read(self, request: web.Request, answer: Callable[[dict[str, Any]], Any], *,
                    controlled: bool = False) -> web.Response:
        """Run one read for a guarded handler: 501 without ClickHouse, 422 for a bad query, 503 when ClickHouse cannot
        answer."""
        if self.clickhouse is None and (self.control is None or not controlled):
            return self.door.refuse(501, f"{request.method} {request.path} reads ClickHouse: this gateway has no ClickHouse "
                                         "server to read (ROLLOUTBUS_CLICKHOUSE_DSN=http://...; an embedded chdb:// store is "
                                         "the stream worker's own)")
        try:
            query = await self._query(request)
            return web.json_response(await answer(query))
        except Refused as exc:
            return self.door.refuse(400, str(exc))
        except MappingError as exc:
            return self.door.refuse(422, f"not a query: {exc}")
        except _Unavailable as exc:
            log.warning("a /v1/agl read failed: %s", exc)
            return self.door.busy(f"ClickHouse cannot answer now: {exc}")

    @staticmethod
    def _paging(query: dict[str, Any], default_sort: str | None, model: str) -> dict[str, Any]:
        """Sorting and paging of a read of ``model``'s items (:data:`MODEL_FIELDS`), checked as its server checks them."""
        limit, offset = query.get("limit", -1), query.get("offset", 0)
        if not isinstance(limit, int) or not isinstance(offset, int) or isinstance(limit, bool):
            raise MappingError("limit and offset must be integers")
        check_page(query, model)
        return {"sort_by": query.get("sort_by", default_sort), "sort_order": query.get("sort_order") or "asc",
                "limit": limit, "offset": offset}

    @guarded()
    async def query_rollouts(self, request: web.Request) -> web.Response:
        """``query_rollouts``: the rollouts with an ended attempt, each with its latest attempt."""
        async def answer(q: dict[str, Any]) -> Any:
            ids, contains = q.get("rollout_id_in"), q.get("rollout_id_contains")
            where, params = ["1"], {}
            if q.get("filter_logic", "and") != "or":  # narrowed in ClickHouse; every filter is applied below
                if ids is not None:
                    where, params["ids"] = [*where, "rollout_id IN {ids:Array(String)}"], list(ids)
                if contains is not None:
                    where, params["c"] = [*where, "position(rollout_id, {c:String}) > 0"], str(contains)
            items = await self._with_controlled(rollouts_from_rows(await self._rollouts(" AND ".join(where), params)))
            items = filter_rollouts(items, status_in=q.get("status_in"), rollout_id_in=ids, rollout_id_contains=contains,
                                    filter_logic=q.get("filter_logic", "and"))
            return page(items, **self._paging(q, None, "Rollout"))

        return await self._read(request, answer, controlled=True)

    @guarded()
    async def get_rollout(self, request: web.Request) -> web.Response:
        """``get_rollout_by_id``: an ended one from ClickHouse (its attempts' rows), else as the control records have it
        (from its enqueue on: through any replica); null when neither has it."""
        rid = request.match_info["rollout_id"]

        async def answer(_q: dict[str, Any]) -> Any:
            items = rollouts_from_rows(await self._rollouts("rollout_id = {rid:String}", {"rid": rid}))
            if items:
                return items[0]
            if self.control is None:
                return None
            return self._unended(await self._controlled(lambda s: _with_attempt(s, rid)))

        return await self._read(request, answer, controlled=True)

    async def _with_controlled(self, ended: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rollouts ClickHouse has (ended), and those only the control records have yet (queuing, running)."""
        if self.control is None:
            return ended
        known = {r["rollout_id"] for r in ended}
        more = await self._controlled(lambda s: [_with_attempt(s, rid) for rid in s.rollouts_v03 if rid not in known])
        return ended + [self._unended(r) for r in more]

    def _unended(self, rollout: dict[str, Any] | None) -> dict[str, Any] | None:
        """A rollout ClickHouse does not have yet. Where the gateway reads a ClickHouse server, one whose attempt ended
        reads ``running`` until the stream worker stored it: its algorithm reads the attempt's spans once it sees it
        end (Agent Lightning's Baseline does), and they are there from then on. Without one, the recorded end; and for a
        rollout that never had an attempt (ended by ``update_rollout`` while queuing: no spans, no row to wait for)."""
        if rollout is not None and self.clickhouse is not None and rollout.get("status") in ENDED and rollout.get("attempt"):
            rollout = {**rollout, "status": "running", "end_time": None}
            if rollout.get("attempt"):
                rollout["attempt"] = {**rollout["attempt"], "status": "running", "end_time": None}
        return rollout

    async def _attempts(self, rollout_id: str) -> list[dict[str, Any]]:
        """A rollout's attempts: as the control records have them (from its dequeue or start on, through any replica),
        and those only ClickHouse has (a rollout the store API did not hand out)."""
        rows = await self._rollouts("rollout_id = {rid:String}", {"rid": rollout_id})
        recorded = await self._controlled(lambda s: copy.deepcopy(s.attempts_v03.get(rollout_id, []))) if self.control else []
        known = {a["attempt_id"] for a in recorded}
        return recorded + [attempt_from_row(r) for r in rows if r["attempt_id"] not in known]

    @guarded()
    async def query_attempts(self, request: web.Request) -> web.Response:
        async def answer(q: dict[str, Any]) -> Any:
            return page(await self._attempts(request.match_info["rollout_id"]), **self._paging(q, "sequence_id", "Attempt"))

        return await self._read(request, answer, controlled=True)

    @guarded()
    async def latest_attempt(self, request: web.Request) -> web.Response:
        async def answer(_q: dict[str, Any]) -> Any:
            attempts = await self._attempts(request.match_info["rollout_id"])
            return max(attempts, key=lambda a: a["sequence_id"]) if attempts else None

        return await self._read(request, answer, controlled=True)

    @guarded()
    async def query_spans(self, request: web.Request) -> web.Response:
        """``query_spans``: the spans of a rollout (of one attempt, or its ``latest``) as the span stage stored them."""
        async def answer(q: dict[str, Any]) -> Any:
            rid, aid = q.get("rollout_id"), q.get("attempt_id")
            if not isinstance(rid, str) or not rid:
                raise MappingError("rollout_id is required")
            if aid == "latest":
                rows = await self._rollouts("rollout_id = {rid:String}", {"rid": rid})
                aid = max(rows, key=lambda r: (r["attempt"], r["finished_ns"]))["attempt_id"] if rows else None
                if aid is None:
                    return page([], **self._paging(q, "sequence_id", "Span"))
            where, params = "rollout_id = {rid:String}", {"rid": rid}
            if aid is not None:
                where, params["aid"] = where + " AND attempt_id = {aid:String}", str(aid)
            rows = await self._rows(f"FROM spans FINAL WHERE {where} ORDER BY attempt_id, sequence_id", SPAN_COLUMNS, params)
            return page(filter_spans([span_to_agl(r) for r in rows], q), **self._paging(q, "sequence_id", "Span"))

        return await self._read(request, answer)

    @guarded()
    async def latest_resources(self, request: web.Request) -> web.Response:
        current = self.resources()
        if current is None:
            return self.door.busy("rb.resources is still being read; retry", retry_after_s=1)
        update = resources_update(current)
        await self._remember(update)
        return web.json_response(update)

    @guarded()
    async def resources_by_id(self, request: web.Request) -> web.Response:
        current = self.resources()
        if current is None:
            return self.door.busy("rb.resources is still being read; retry", retry_after_s=1)
        update = resources_update(current)
        wanted = request.match_info["resources_id"]
        if update is not None and update["resources_id"] == wanted:
            return web.json_response(update)
        if self.control is None:
            return web.json_response(None)  # only the newest set is held: another id answers null, as its store does
        # an older set this API named or served; null for one it never did, as its store answers
        return web.json_response(await self._controlled(lambda s: copy.deepcopy(s.resource_sets.get(wanted))))

    @guarded()
    async def add_resources(self, request: web.Request) -> web.Response:
        """``add_resources`` and ``update_resources``: the next version of each named resource on rb.resources;
        answers the ``ResourcesUpdate`` of the newest set (its id names the versions: ``policy=4,prompt=2``)."""
        if self.publish is None:
            return await self.not_on_the_bus(request)
        current = self.resources()
        if current is None:
            return self.door.busy("rb.resources is still being read; retry", retry_after_s=1)
        try:
            versions = versions_from_agl(await self._json(request), current, now_ns=time.time_ns())
        except MappingError as exc:
            return self.door.refuse(422, f"not Agent Lightning's NamedResources: {exc}")
        await asyncio.get_running_loop().run_in_executor(None, self.publish, versions)
        log.info("published through the store API: %s", ", ".join(f"{v.name} v{v.version}" for v in versions))
        update = resources_update(newest(current, versions))
        await self._remember(update)
        return web.json_response(update, status=201 if "resources_id" not in request.match_info else 200)

    @guarded()
    async def wait_for_rollouts(self, request: web.Request) -> web.Response:
        """``wait_for_rollouts``: the named rollouts that finished (ClickHouse's rollouts, read until all did
        or its timeout passed; no timeout waits :data:`WAIT_CAP_S`)."""
        async def answer(q: dict[str, Any]) -> Any:
            ids, wait_s = check_wait(q)
            deadline = time.monotonic() + wait_s
            while True:
                rows = await self._rollouts("rollout_id IN {ids:Array(String)}", {"ids": sorted(set(ids))}) if ids else []
                done = finished_rollouts(rollouts_from_rows(rows), ids)
                left = deadline - time.monotonic()
                if len({r["rollout_id"] for r in done}) == len(set(ids)) or left <= 0:
                    return done
                await asyncio.sleep(min(self.wait_poll_s, left))

        return await self._read(request, answer)

    @guarded()
    async def update_worker(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
            reply = worker_reply(request.match_info["worker_id"], body, now=time.time())
        except MappingError as exc:
            return self.door.refuse(400, str(exc) if isinstance(exc, Refused) else f"not a worker update: {exc}")
        if self.control is not None:
            reply = (await asyncio.get_running_loop().run_in_executor(None, self.control.write,
                                                                      {"op": "worker", "worker": reply}))[1]
        return web.json_response(reply)

    @guarded()
    async def get_worker(self, request: web.Request) -> web.Response:
        """``get_worker_by_id``: its last heartbeat, through any replica; null for one never heard."""
        if self.control is None:
            return await self.not_on_the_bus(request)
        wid = request.match_info["worker_id"]
        return web.json_response(await self._controlled(lambda s: copy.deepcopy(s.workers.get(wid))))

    @guarded()
    async def query_workers(self, request: web.Request) -> web.Response:
        """``query_workers`` (``status_in``, ``worker_id_contains``, ``filter_logic``, sorting, paging)."""
        if self.control is None:
            return await self.not_on_the_bus(request)
        try:
            q = (await self._json(request) or {}) if request.method == "POST" else dict(request.query)
            if not isinstance(q, dict):
                raise MappingError("the query is a JSON object")
            workers = await self._controlled(lambda s: [copy.deepcopy(w) for w in s.workers.values()])
            status_in, contains = q.get("status_in"), q.get("worker_id_contains")
            tests = [(lambda w: w["status"] in status_in) if status_in is not None else None,
                     (lambda w: str(contains) in w["worker_id"]) if contains is not None else None]
            tests = [t for t in tests if t is not None]
            pick = any if q.get("filter_logic", "and") == "or" else all
            items = [w for w in workers if not tests or pick(t(w) for t in tests)]
            q = {k: int(v) if k in ("limit", "offset") and isinstance(v, str) else v for k, v in q.items()}
            return web.json_response(page(items, **self._paging(q, "worker_id", "Worker")))
        except Refused as exc:
            return self.door.refuse(400, str(exc))
        except (MappingError, ValueError) as exc:
            return self.door.refuse(422, f"not a worker query: {exc}")

    async def not_on_the_bus(self, request: web.Request) -> web.Response:
        call = f"{request.method} {request.path}"
        return self.door.refuse(501, f"{call} is not served by rolloutbus: the gateway serves the queue (queues/rollouts/enqueue, "
                                     "dequeue; rb.tasks), start_rollout, start_attempt, update_rollout, the calls of an "
                                     "attempt (spans, spans/next, rollouts/{id}/attempts/{id}, resources, workers), "
                                     "add_resources and update_resources (rb.resources), query_resources, statistics, the reads "
                                     "of rollouts, attempts and spans, wait_for_rollouts and OTLP /v1/traces")


__all__ = ["LightningStoreRoutes"]
