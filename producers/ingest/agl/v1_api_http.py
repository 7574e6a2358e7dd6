"""The routes of Agent Lightning 1.x's server API (``/api/...``) that the gateway serves, so its controllers
(``LocalReconciler``, ``K8sReconciler``) run against the gateway with only its URL (and key) changed.

Its store's calls (rollouts created, listed, read back, patched, deleted; terminal pages; events queries; model
servers; the proxy's pause) keep its server's semantics on the control records
(:mod:`producers.ingest.agl.v1_store_http`): in this process by default (:class:`LocalControl`, one replica), on
the control topic under ``rolloutbus gateway`` (every replica reads the same records, so any replica answers).
Its queue is rb.tasks, through the gateway's :class:`producers.ingest.agl.queue.TaskQueue` (one owner per task
partition, at most one live claim per rollout): a created rollout is a task on rb.tasks too, ``PATCH
/api/rollouts/{id}`` to ``running`` the claim by the replica that owns its task (the attempt's STARTED on rb.spans),
to a terminal state its FINISHED; without the queue, the rollouts are the control records' alone.
``GET /api/models`` lists the model versions on rb.resources. The LLM route its controllers hand every agent
(``/proxy/rollout/{id}/attempt/{id}/mode/{mode}/openai/v1/...``) is forwarded to ``rolloutbus proxy``'s route for
the attempt, at the endpoint the policy's version names. Its agents' events URL (``POST
/api/rollouts/{rollout_id}/attempt/{attempt_id}/events`` with ``{"event_type", "data"}``) makes one span each
(:mod:`producers.ingest.agl.v1_events`); the reply is the stored event, as its store answers (422 with the reason
for a body that is not an event). Mapped by :mod:`producers.ingest.agl.v1_api`. Token, body and error shape are
the front door's (:mod:`producers.ingest.front_door`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from foundation.errors import EncodeError
from producers.context import new_span_id
from producers.ingest.agl.control import LocalControl
from producers.ingest.agl.v1_api import LLM_PATHS, PREFIX, check_depth, llm_upstream, models_reply
from producers.ingest.agl.v1_events import EVENT_PATH, event_to_span
from producers.ingest.agl.v1_store_http import AgentLightning1Store
from producers.ingest.front_door import BadRequest, Counts, FrontDoor, TooDeep, guarded, not_a_json_constant, parse_json
from producers.ingest.resources import Resources
from producers.mapping import MappingError
from producers.transport import SPAN, SpanTransport
from schemas.codec import encode_raw
from schemas.models import UNNUMBERED

if TYPE_CHECKING:
    from producers.ingest.agl.control_log import ControlLog
    from producers.ingest.agl.queue import TaskQueue

log = logging.getLogger(__name__)

LLM_ROUTE = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/{path:.*}"  # its server's LLM proxy


class AgentLightning1Routes:
    """Adds Agent Lightning 1.x's ``/api`` routes to an application."""

    def __init__(self, transport: SpanTransport, resources: Resources, *, token: str | None = None,
                 retry_after_s: int = 5, max_body_bytes: int = 16 << 20, policy: str = "policy",
                 queue: TaskQueue | None = None, llm_token: str | None = None, llm_timeout_s: float = 300.0,
                 counts: Counts = Counts()) -> None:
        """``queue``: rb.tasks (None: the rollouts are the control records' alone, no task on rb.tasks);
        ``llm_token``: the bearer token the LLM route sends ``rolloutbus proxy`` (its ``ROLLOUTBUS_PROXY_TOKEN``);
        ``counts``: the gateway's counters, which count the events route's answers and spans with the OTLP route's."""
        self.transport = transport
        self.resources = resources
        self.door = FrontDoor(token=token, max_body_bytes=max_body_bytes, retry_after_s=retry_after_s, detail=True)
        # The events route answers its refusals as plain text, as it did as the gateway's own route.
        self.events_door = FrontDoor(token=token, max_body_bytes=max_body_bytes, retry_after_s=retry_after_s,
                                     counts=counts)
        self.counts = counts
        self.policy = policy
        self.queue = queue
        self.llm_token = llm_token
        self.llm_timeout_s = llm_timeout_s
        self._session: aiohttp.ClientSession | None = None
        # The control records: its store's calls with its semantics. In this process (one replica) until
        # `rolloutbus gateway` sets the control topic's (every replica reads the same records).
        self.control: ControlLog | LocalControl = LocalControl()
        self.store = AgentLightning1Store(self)
        self.inflight = 0  # LLM calls being forwarded (its /proxy/state's count)

    def add_to(self, app: web.Application) -> None:
        r = app.router
        self.store.add_to(app)
        if self.queue is not None:
            self.queue.settled = self.store.settled
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

    @guarded()
    async def not_on_the_bus(self, request: web.Request) -> web.Response:
        return self.door.refuse(501, f"{request.method} {request.path} is not served by rolloutbus: {self._served()}")

    @staticmethod
    def _served() -> str:
        return (f"of Agent Lightning 1.x's API the gateway serves {PREFIX}/rollouts (POST, GET, and GET, PATCH, DELETE "
                f"by id, its events and terminal pages), {PREFIX}/models, POST {EVENT_PATH}, /proxy/pause|resume|state "
                "and its LLM route")


__all__ = ["AgentLightning1Routes", "LLM_ROUTE"]
