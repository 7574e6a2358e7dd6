"""The routes of Agent Lightning 1.x's server API (``/api/...``) that the gateway serves.

Rollouts created (``POST /api/rollouts``: a STARTED per rollout on rb.spans) and ended (``PATCH
/api/rollouts/{id}`` to a terminal state: its FINISHED), and ``GET /api/models`` (the model versions on
rb.resources), mapped by :mod:`producers.agl_api`. Its events route is the gateway's own
(:mod:`producers.agl_events`). Its calls that read or change a rollout table — listing and getting
rollouts, querying events, deleting, registering model servers — answer 501 naming the call: they need a
table the gateway replicas share, not built yet; rollouts are read from ClickHouse.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from foundation.errors import EncodeError
from producers.agl_api import (
    PREFIX,
    check_depth,
    check_rollout_creates,
    check_rollout_patch,
    finished_from_patch,
    models_reply,
    new_rollout,
    patched_rollout,
    policy_version,
    started_from_create,
)
from producers.agl_events import EVENT_PATH
from producers.agl_store_http import Resources
from producers.gateway_auth import CHALLENGE, REFUSED, authorized
from producers.mapping import MappingError
from producers.spool import FRAME_OVERHEAD
from producers.transport import SpanTransport
from schemas.codec import encode

log = logging.getLogger(__name__)

# Its server's calls that need a rollout table (or own the model registry): what each is, for the 501.
NOT_ON_THE_BUS = {
    ("GET", "/rollouts"): "listing rollouts by state (its controllers' queue)",
    ("GET", "/rollouts/terminal"): "paging finished rollouts",
    ("GET", "/rollouts/{rollout_id}"): "reading a rollout",
    ("DELETE", "/rollouts/{rollout_id}"): "deleting a rollout",
    ("GET", "/rollouts/{rollout_id}/events"): "querying a rollout's events",
    ("POST", "/models"): "registering model servers (versions come from `rolloutbus train` on rb.resources)",
    ("DELETE", "/models"): "removing model servers (versions come from `rolloutbus train` on rb.resources)",
}


class BadBody(ValueError):
    """The body is not JSON the routes can read (400)."""


class AgentLightning1Routes:
    """Adds Agent Lightning 1.x's ``/api`` routes (all but its events route, the gateway's) to an application."""

    def __init__(self, transport: SpanTransport, resources: Resources, *, token: str | None = None,
                 retry_after_s: int = 5, max_body_bytes: int = 16 << 20, policy: str = "policy") -> None:
        self.transport = transport
        self.resources = resources
        self.token = token
        self.retry_after_s = retry_after_s
        self.max_body_bytes = max_body_bytes
        self.policy = policy

    def add_to(self, app: web.Application) -> None:
        r = app.router
        r.add_post(f"{PREFIX}/rollouts", self.create_rollouts)
        r.add_patch(f"{PREFIX}/rollouts/{{rollout_id}}", self.patch_rollout)
        r.add_get(f"{PREFIX}/models", self.list_models)
        for (method, path), what in NOT_ON_THE_BUS.items():
            r.add_route(method, PREFIX + path, self._not_on_the_bus(what))
        r.add_route("*", f"{PREFIX}/{{call:.*}}", self.not_on_the_bus)  # registered last: the others win

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> web.Response:
        # Its server answers errors as FastAPI does: {"detail": ...}.
        return web.json_response({"detail": detail}, status=status, headers=headers)

    def _refused(self, request: web.Request) -> web.Response | None:
        if self.token is not None and not authorized(request.headers.get("Authorization", ""), self.token):
            return self._error(401, REFUSED, CHALLENGE)
        return None

    async def _json(self, request: web.Request) -> Any:
        """The body as JSON; :class:`BadBody` with one line for a body that is too big, unreadable,
        not JSON or nested too deep."""
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise BadBody(f"body of {request.content_length} bytes is over the limit of {self.max_body_bytes}")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BadBody(f"body is over the limit of {self.max_body_bytes} bytes") from None
        except RequestPayloadError as exc:
            raise BadBody(f"body cannot be read as sent: {exc}") from exc
        if not raw:
            return None
        try:
            body = json.loads(raw)
        except RecursionError:
            raise BadBody("body is JSON nested too deep") from None
        except ValueError as exc:
            raise BadBody(f"body is not JSON: {exc}") from exc
        try:
            check_depth(body)
        except MappingError as exc:
            raise BadBody(f"body is {exc}") from exc
        return body

    def _send(self, records: list[tuple[str, bytes]]) -> web.Response | None:
        """Hand records to the transport, all or none; a 503 answer when it cannot keep them."""
        size = sum(len(k.encode()) + len(v) + FRAME_OVERHEAD for k, v in records)
        if not self.transport.accepting(size):
            return self._error(503, "Kafka is unreachable and the local spool is full; retry later",
                               {"Retry-After": str(self.retry_after_s)})
        for key, value in records:
            if not self.transport.emit_encoded(key.encode(), value):
                return self._error(503, "the local queue is full; retry later", {"Retry-After": str(self.retry_after_s)})
        return None

    # ------------------------------------------------------------------ routes

    async def create_rollouts(self, request: web.Request) -> web.Response:
        """``POST /api/rollouts``: its rollouts, queuing, and a STARTED for each one's attempt "0"."""
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            reqs = check_rollout_creates(await self._json(request))
        except BadBody as exc:
            return self._error(400, str(exc))
        except MappingError as exc:
            return self._error(422, f"not a list of Agent Lightning rollouts to create: {exc}")
        current = self.resources()
        if current is None:  # the STARTED names the policy version its group is keyed by: wait for it
            return self._error(503, "rb.resources is still being read; retry", {"Retry-After": "1"})
        now, now_ns = time.time(), time.time_ns()
        version = policy_version(current, self.policy)
        rollouts, records = [], []
        try:
            for req in reqs:
                rollout = new_rollout(req, req["rollout_id"] or uuid.uuid4().hex, now=now)
                event = started_from_create(rollout, resource_version=version, now_ns=now_ns)
                records.append((rollout["rollout_id"], encode(event)))
                rollouts.append(rollout)
        except (EncodeError, ValueError) as exc:
            return self._error(422, f"a rollout cannot be started: {exc}")
        if (busy := self._send(records)) is not None:
            return busy
        log.info("%d rollouts created through Agent Lightning 1.x's API", len(rollouts))
        return web.json_response(rollouts, status=201)

    async def patch_rollout(self, request: web.Request) -> web.Response:
        """``PATCH /api/rollouts/{id}``: a terminal state is its attempt's FINISHED."""
        if (refused := self._refused(request)) is not None:
            return refused
        rollout_id = request.match_info["rollout_id"]
        try:
            status = check_rollout_patch(await self._json(request))
        except BadBody as exc:
            return self._error(400, str(exc))
        except MappingError as exc:
            return self._error(422, f"not an Agent Lightning rollout patch: {exc}")
        event = finished_from_patch(rollout_id, status, now_ns=time.time_ns())
        if event is not None:
            try:
                value = encode(event)
            except (EncodeError, ValueError) as exc:
                return self._error(422, f"the rollout cannot be finished: {exc}")
            if (busy := self._send([(rollout_id, value)])) is not None:
                return busy
            log.info("rollout %s/%s ended through Agent Lightning 1.x's API: %s", rollout_id, event.attempt_id, event.status)
        return web.json_response(patched_rollout(rollout_id, status, now=time.time()))

    async def list_models(self, request: web.Request) -> web.Response:
        """``GET /api/models``: the model versions on rb.resources, latest first, as its ``Model`` list."""
        if (refused := self._refused(request)) is not None:
            return refused
        current = self.resources()
        if current is None:
            return self._error(503, "rb.resources is still being read; retry", {"Retry-After": "1"})
        return web.json_response(models_reply(current))

    def _not_on_the_bus(self, what: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            if (refused := self._refused(request)) is not None:
                return refused
            return self._error(501, f"{request.method} {request.path} ({what}) is not served by rolloutbus: "
                                    f"{self._served()}; rollouts and their steps are in ClickHouse")
        return handler

    async def not_on_the_bus(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return self._error(501, f"{request.method} {request.path} is not served by rolloutbus: {self._served()}")

    @staticmethod
    def _served() -> str:
        return (f"of Agent Lightning 1.x's API the gateway serves POST {PREFIX}/rollouts, PATCH {PREFIX}/rollouts/{{id}}, "
                f"GET {PREFIX}/models and POST {EVENT_PATH}")


__all__ = ["AgentLightning1Routes", "NOT_ON_THE_BUS"]
