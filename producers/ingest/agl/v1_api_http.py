"""The routes of Agent Lightning 1.x's server API (``/api/...``) that the gateway serves, so its controllers
(``LocalReconciler``, ``K8sReconciler``) run against the gateway with only its URL (and key) changed.

Its queue is rb.tasks, through the gateway's :class:`producers.ingest.agl.queue.TaskQueue` (one owner per task
partition, at most one live claim per rollout): ``POST /api/rollouts`` puts a task per rollout on rb.tasks;
``GET /api/rollouts?state_in=queuing&state_in=running`` (what its controllers poll) lists the rollouts this
replica offers (``queuing``) and has claimed (``running``); ``PATCH /api/rollouts/{id}`` to ``running`` is
the claim (the attempt's STARTED on rb.spans; 409 when this replica does not offer it), to a terminal
state its FINISHED. ``GET /api/rollouts/{id}`` reads it back (queuing or running from this replica's queue,
ended from ClickHouse). ``GET /api/models`` lists the model versions on rb.resources. The LLM route its
controllers hand every agent (``/proxy/rollout/{id}/attempt/{id}/mode/{mode}/openai/v1/...``) is forwarded
to ``rolloutbus proxy``'s route for the attempt, at the endpoint the policy's version names. Its agents'
events URL (``POST /api/rollouts/{rollout_id}/attempt/{attempt_id}/events`` with ``{"event_type", "data"}``)
makes one span each (:mod:`producers.ingest.agl.v1_events`); the reply is the stored event, as its store
answers (422 with the reason for a body that is not an event). Mapped by :mod:`producers.ingest.agl.v1_api`.
With the control records (:attr:`AgentLightning1Routes.control`, what ``rolloutbus gateway`` wires), its store's
calls keep its server's semantics through any replica instead (:mod:`producers.ingest.agl.v1_store_http`: rollouts
read back at once, terminal pages, events queries, deletes, model servers, the proxy's pause); without them, as
described above, and those calls answer 501 naming the call. Token, body and error shape are the front door's
(:mod:`producers.ingest.front_door`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from foundation.errors import EncodeError
from producers.context import new_span_id
from producers.ingest.agl.v1_api import (
    DEFAULT_ATTEMPT_ID,
    ENDED_COLUMNS,
    LLM_PATHS,
    PREFIX,
    TERMINAL,
    check_depth,
    check_list_query,
    check_rollout_creates,
    check_rollout_patch,
    ended_rollout,
    finished_from_patch,
    listing,
    llm_upstream,
    models_reply,
    new_rollout,
    patched_rollout,
    policy_version,
    rollout_of_task,
    task_from_create,
)
from producers.ingest.agl.v1_events import EVENT_PATH, event_to_span
from producers.ingest.agl.v1_store_http import AgentLightning1Store
from producers.ingest.front_door import BadRequest, Counts, FrontDoor, TooDeep, guarded, not_a_json_constant, parse_json
from producers.ingest.resources import Resources
from producers.mapping import MappingError
from producers.transport import SPAN, SpanTransport
from schemas.codec import encode, encode_raw
from schemas.models import UNNUMBERED

if TYPE_CHECKING:
    from producers.ingest.agl.control import LocalControl
    from producers.ingest.agl.control_log import ControlLog
    from producers.ingest.agl.queue import ClickHouseReader, TaskQueue

log = logging.getLogger(__name__)

LLM_ROUTE = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/{path:.*}"  # its server's LLM proxy
# Its server's calls with no meaning on the bus (or that own the model registry): what each is, for the 501.
NOT_ON_THE_BUS = {
    ("GET", "/rollouts/terminal"): "paging finished rollouts",
    ("DELETE", "/rollouts/{rollout_id}"): "deleting a rollout",
    ("GET", "/rollouts/{rollout_id}/events"): "querying a rollout's events",
    ("POST", "/models"): "registering model servers (versions come from `rolloutbus train` on rb.resources)",
    ("DELETE", "/models"): "removing model servers (versions come from `rolloutbus train` on rb.resources)",
}


class AgentLightning1Routes:
    """Adds Agent Lightning 1.x's ``/api`` routes to an application."""

    def __init__(self, transport: SpanTransport, resources: Resources, *, token: str | None = None,
                 retry_after_s: int = 5, max_body_bytes: int = 16 << 20, policy: str = "policy",
                 queue: TaskQueue | None = None, llm_token: str | None = None, llm_timeout_s: float = 300.0,
                 counts: Counts = Counts()) -> None:
        """``queue``: rb.tasks (None: the queue's calls answer 501); ``llm_token``: the bearer token the LLM
        route sends ``rolloutbus proxy`` (its ``ROLLOUTBUS_PROXY_TOKEN``); ``counts``: the gateway's counters,
        which count the events route's answers and spans with the OTLP route's."""
        self.transport = transport
        self.resources = resources
        self.door = FrontDoor(token=token, max_body_bytes=max_body_bytes, retry_after_s=retry_after_s, detail=True)
        # The events route answers its refusals as plain text, as it did as the gateway's own route.
        self.events_door = FrontDoor(token=token, max_body_bytes=max_body_bytes, retry_after_s=retry_after_s,
                                     counts=counts)
        self.counts = counts
        self.policy = policy
        self.queue = queue
        self.clickhouse: ClickHouseReader | None = None  # None: an ended rollout cannot be read (GET /api/rollouts/{id})
        self.llm_token = llm_token
        self.llm_timeout_s = llm_timeout_s
        self._session: aiohttp.ClientSession | None = None
        # The control records (None: the queue-only routes, as before them): its store's calls with its semantics.
        self.control: ControlLog | LocalControl | None = None
        self.store = AgentLightning1Store(self)
        self.inflight = 0  # LLM calls being forwarded (its /proxy/state's count)

    def add_to(self, app: web.Application) -> None:
        r = app.router
        if self.control is not None:
            self.store.add_to(app)
            if self.queue is not None:
                self.queue.settled = self.store.settled
        else:
            for (method, path), what in NOT_ON_THE_BUS.items():  # first: /rollouts/terminal is no {rollout_id}
                r.add_route(method, PREFIX + path, self._not_on_the_bus(what))
            r.add_post(f"{PREFIX}/rollouts", self.create_rollouts)
            r.add_get(f"{PREFIX}/rollouts", self.list_rollouts)
            r.add_patch(f"{PREFIX}/rollouts/{{rollout_id}}", self.patch_rollout)
            r.add_get(f"{PREFIX}/rollouts/{{rollout_id}}", self.get_rollout)
        r.add_get(f"{PREFIX}/models", self.list_models)
        r.add_post(EVENT_PATH, self.add_event)
        r.add_post(LLM_ROUTE, self.llm_call)
        app.on_cleanup.append(self._close)
        r.add_route("*", f"{PREFIX}/{{call:.*}}", self.not_on_the_bus)  # registered last: the others win

    # ------------------------------------------------------------------ helpers

    async def _json(self, request: web.Request) -> Any:
        """The body as JSON (None when empty); :class:`BadRequest` with one line for a body that is too big,
        unreadable, not JSON or nested too deep (each answered 400)."""
        try:
            body = await self.door.json(request)
        except TooDeep:
            raise BadRequest("body is JSON nested too deep") from None  # this API's words, as before the front door
        try:
            check_depth(body)
        except MappingError as exc:
            raise BadRequest(f"body is {exc}") from exc
        return body

    # ------------------------------------------------------------------ routes

    def _no_queue(self, request: web.Request) -> web.Response:
        return self.door.refuse(501, f"{request.method} {request.path} needs the queue on rb.tasks, which this gateway was "
                                     "built without (rolloutbus gateway has it)")

    def _busy(self, exc: Exception) -> web.Response:
        return self.door.busy(f"{exc}; retry later")

    @guarded()
    async def create_rollouts(self, request: web.Request) -> web.Response:
        """``POST /api/rollouts``: a task per rollout on rb.tasks (delivered before the answer), its rollouts queuing."""
        if self.queue is None:
            return self._no_queue(request)
        try:
            reqs = check_rollout_creates(await self._json(request))
        except BadRequest as exc:
            return self.door.refuse(400, str(exc))
        except MappingError as exc:
            return self.door.refuse(422, f"not a list of Agent Lightning rollouts to create: {exc}")
        current = self.resources()
        if current is None:  # the task names the policy version its group is keyed by: wait for it
            return self.door.busy("rb.resources is still being read; retry", retry_after_s=1)
        now, now_ns = time.time(), time.time_ns()
        version = policy_version(current, self.policy)
        rollouts, tasks = [], []
        try:
            for req in reqs:
                rollout = new_rollout(req, req["rollout_id"] or uuid.uuid4().hex, now=now)
                task = task_from_create(rollout, resource_version=version, now_ns=now_ns)
                encode(task)  # refused here, as a 422, rather than by the producer
                tasks.append((rollout["rollout_id"], task))
                rollouts.append(rollout)
        except (EncodeError, ValueError) as exc:
            return self.door.refuse(422, f"a rollout cannot be queued: {exc}")
        await asyncio.get_running_loop().run_in_executor(None, self.queue.publish, tasks)
        log.info("%d rollouts queued on rb.tasks through Agent Lightning 1.x's API", len(rollouts))
        return web.json_response(rollouts, status=201)

    @guarded()
    async def list_rollouts(self, request: web.Request) -> web.Response:
        """``GET /api/rollouts?state_in=...&limit=...``: this replica's offered (queuing) and claimed (running) rollouts."""
        try:
            states, limit = check_list_query(request.query.getall("state_in", []), request.query.get("limit"))
        except MappingError as exc:
            return self.door.refuse(422, str(exc))
        if any(state in TERMINAL for state in states):
            return self.door.refuse(501, f"GET {request.path}?state_in={'|'.join(TERMINAL)} (listing ended rollouts) is not "
                                         "served by rolloutbus: ended rollouts are in ClickHouse's rollouts table; the gateway "
                                         "lists queuing and running ones")
        if self.queue is None:
            return self._no_queue(request)
        offered, claims = await asyncio.get_running_loop().run_in_executor(None, self.queue.agl1_rollouts)
        running = [(c.slot.rollout_id, c.slot.task, c.attempt_id or DEFAULT_ATTEMPT_ID, c.started) for c in claims]
        return web.json_response(listing([(s.rollout_id, s.task) for s in offered], running, states, limit))

    @guarded()
    async def get_rollout(self, request: web.Request) -> web.Response:
        """``GET /api/rollouts/{id}``: its ``RolloutDetail`` — queuing or running from this replica's queue, ended
        from ClickHouse's ``rollouts``; 404 when neither has it (queued in another replica's partition, or not
        yet written by the stream worker)."""
        rollout_id = request.match_info["rollout_id"]
        loop = asyncio.get_running_loop()
        if self.queue is not None:
            offered, claims = await loop.run_in_executor(None, self.queue.agl1_rollouts)
            for c in claims:
                if c.slot.rollout_id == rollout_id:
                    aid = c.attempt_id or DEFAULT_ATTEMPT_ID
                    return web.json_response({"rollout": rollout_of_task(c.slot.task, rollout_id, state="running", attempt_id=aid,
                                                                         updated_at=c.started), "attempts": [aid]})
            for s in offered:
                if s.rollout_id == rollout_id:
                    return web.json_response({"rollout": rollout_of_task(s.task, rollout_id), "attempts": []})
        if self.clickhouse is None:
            return self.door.refuse(501, f"GET {request.path} of a rollout this replica does not queue reads ClickHouse: this "
                                         "gateway has no ClickHouse server to read (ROLLOUTBUS_CLICKHOUSE_DSN=http://...)")
        sql = f"SELECT {', '.join(ENDED_COLUMNS)} FROM rollouts FINAL WHERE rollout_id = {{rid:String}} LIMIT 1000"
        try:
            rows = await loop.run_in_executor(None, self.clickhouse.query, sql, {"rid": rollout_id})
        except Exception as exc:  # noqa: BLE001 — the driver's errors of every kind, mapped once, here
            log.warning("GET /api/rollouts/{id} read failed: %s", exc)
            return self.door.busy("ClickHouse cannot answer now; retry")
        if not rows:
            return self.door.refuse(404, f"Rollout not found: {rollout_id}")
        return web.json_response(ended_rollout([dict(zip(ENDED_COLUMNS, row)) for row in rows]))

    @guarded()
    async def patch_rollout(self, request: web.Request) -> web.Response:
        """``PATCH /api/rollouts/{id}``: ``running`` claims it (its STARTED), a terminal state is its FINISHED."""
        rollout_id = request.match_info["rollout_id"]
        try:
            status = check_rollout_patch(await self._json(request))
        except BadRequest as exc:
            return self.door.refuse(400, str(exc))
        except MappingError as exc:
            return self.door.refuse(422, f"not an Agent Lightning rollout patch: {exc}")
        state, attempt_id = status.get("state"), status.get("last_attempt_id") or DEFAULT_ATTEMPT_ID
        claim = None
        if self.queue is not None and state in ("running", *TERMINAL):
            # running: the claim; a terminal state from queuing (its controller's failed spawn): claimed, then ended
            claim = await asyncio.get_running_loop().run_in_executor(None, self.queue.claim_agl1, rollout_id, attempt_id)
            if claim is None and state == "running":
                return self.door.refuse(409, f"Rollout {rollout_id}: cannot transition to running: this gateway replica does not "
                                             "offer it (running already, ended, or queued in a partition another replica owns; "
                                             "list the rollouts again)")
        event = finished_from_patch(rollout_id, status, now_ns=time.time_ns())
        if event is not None:
            try:
                value = encode(event)
            except (EncodeError, ValueError) as exc:
                return self.door.refuse(422, f"the rollout cannot be finished: {exc}")
            if (busy := self.door.deliver(self.transport, [(rollout_id.encode(), value)])) is not None:
                return busy
            if self.queue is not None:
                await asyncio.get_running_loop().run_in_executor(None, self.queue.finished, event.attempt_id,
                                                                 event.status or "failed", rollout_id)
            log.info("rollout %s/%s ended through Agent Lightning 1.x's API: %s", rollout_id, event.attempt_id, event.status)
        now = time.time()
        if claim is not None:
            reply = rollout_of_task(claim.slot.task, rollout_id, state=state or "running", attempt_id=attempt_id, updated_at=now)
            reply["status"].update(error_message=status.get("error_message"), k8s_job_name=status.get("k8s_job_name"))
            return web.json_response(reply)
        return web.json_response(patched_rollout(rollout_id, status, now=now))

    @guarded()
    async def list_models(self, request: web.Request) -> web.Response:
        """``GET /api/models``: the model versions on rb.resources, latest first, as its ``Model`` list."""
        current = self.resources()
        if current is None:
            return self.door.busy("rb.resources is still being read; retry", retry_after_s=1)
        return web.json_response(models_reply(current))

    @guarded("events_door")
    async def add_event(self, request: web.Request) -> web.Response:
        """One event of its agents (their ``AGL_EVENT_URL``) → one span on rb.spans; answers the stored event."""
        door, counts = self.events_door, self.counts
        try:
            # NaN and Infinity are not JSON: kept, they would go back in the reply and on the span as text no
            # strict reader takes.
            event = parse_json(await door.body(request), parse_constant=not_a_json_constant)
        except BadRequest as exc:
            return door.refuse(exc.status, str(exc))
        rollout_id, attempt_id = request.match_info["rollout_id"], request.match_info["attempt_id"]
        now = time.time_ns()
        try:
            # Unnumbered: the span stage numbers the attempt's events in arrival order (as Agent Lightning's
            # store keeps events in insertion order), whichever replica each came through.
            span = event_to_span(rollout_id, attempt_id, event, sequence_id=UNNUMBERED, span_id=new_span_id(), time_ns=now)
            value = encode_raw(SPAN, span)
        except (MappingError, EncodeError) as exc:
            counts.rejected(1)
            return door.refuse(422, f"not an Agent Lightning event: {exc}")
        if (busy := door.deliver(self.transport, [(rollout_id.encode(), value)])) is not None:
            return busy
        counts.accepted(1)
        counts.answered(200)
        stored = {"event_type": event["event_type"], "rollout_id": rollout_id, "attempt_id": attempt_id,
                  "timestamp": now / 1e9, "data": event.get("data") or {}}
        if self.control is not None:
            await self.store.record_event(stored)
        return web.json_response(stored)

    @guarded()
    async def llm_call(self, request: web.Request) -> web.StreamResponse:
        """Its server's LLM proxy route, as its controllers hand it to every agent
        (``AGL_OPENAI_BASE_URL``): forwarded to ``rolloutbus proxy``'s route for the attempt (which records the
        call's token ids on rb.spans), at the endpoint the policy's newest version names."""
        m = request.match_info
        if m["mode"] not in ("train", "val"):
            return self.door.refuse(404, f"Unsupported proxy mode: {m['mode']}")
        if m["path"] not in LLM_PATHS:
            return self.door.refuse(404, f"Unsupported upstream path: {m['path']}")
        if self.control is not None:
            try:
                early = await self.door.body(request)
            except BadRequest as exc:
                return self.door.refuse(400, str(exc))
            if (refused := await self.store.llm_check(request, m["rollout_id"], early)) is not None:
                return refused
        url = llm_upstream(self.resources(), self.policy, m["rollout_id"], m["attempt_id"], m["path"])
        if url is None:
            return self.door.refuse(503, "no LLM endpoint is published on rb.resources: run rolloutbus train with "
                                         "--llm-endpoint http://<proxy>/v1 (the proxy's base URL)", {"Retry-After": "5"})
        try:
            body = await self.door.body(request)
        except BadRequest as exc:
            return self.door.refuse(400, str(exc))
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        if self.llm_token:
            headers["Authorization"] = f"Bearer {self.llm_token}"
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.llm_timeout_s))
        self.inflight += 1
        try:
            async with self._session.post(url, data=body, headers=headers) as upstream:
                out = await upstream.read()
                return web.Response(status=upstream.status, body=out,
                                    content_type=upstream.content_type or "application/json")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.warning("LLM call of %s/%s not forwarded to %s: %s", m["rollout_id"], m["attempt_id"], url.split("/rollout/")[0],
                        type(exc).__name__)
            return self.door.refuse(502, f"the LLM proxy at {url.split('/rollout/')[0]} did not answer: {type(exc).__name__}")
        finally:
            self.inflight -= 1

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _not_on_the_bus(self, what: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            if (refused := self.door.refused(request)) is not None:
                return refused
            return self.door.refuse(501, f"{request.method} {request.path} ({what}) is not served by rolloutbus: "
                                         f"{self._served()}; rollouts and their steps are in ClickHouse")
        return handler

    @guarded()
    async def not_on_the_bus(self, request: web.Request) -> web.Response:
        return self.door.refuse(501, f"{request.method} {request.path} is not served by rolloutbus: {self._served()}")

    @staticmethod
    def _served() -> str:
        return (f"of Agent Lightning 1.x's API the gateway serves POST and GET {PREFIX}/rollouts, PATCH "
                f"{PREFIX}/rollouts/{{id}}, GET {PREFIX}/models, POST {EVENT_PATH} and its LLM route")


__all__ = ["AgentLightning1Routes", "NOT_ON_THE_BUS", "LLM_ROUTE"]
