"""Agent Lightning 1.x's store calls (``/api/rollouts...``, ``/api/models``, ``/proxy/{pause,resume,state}``) with
its server's semantics, on the gateway's control records (:mod:`producers.ingest.agl.control`, one Kafka partition
every replica replays: :mod:`producers.ingest.agl.control_log`).

A created rollout is readable at once through any replica; a re-create with its id answers the first one; a
``running`` rollout never moves back to ``queuing`` (409, as its ``VALID_TRANSITIONS``); deleting is idempotent;
its events query and terminal pages read the recorded events and ends. The bus's records still follow: each new
rollout's task goes onto rb.tasks, its agents' events are spans on rb.spans, ``running`` is its attempt's STARTED
and a terminal state its FINISHED, so the stream worker and the trainer see what they saw before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, Protocol

from aiohttp import web

from foundation.errors import EncodeError, KafkaUnavailable
from producers.ingest.agl.control import LEFT_QUEUING, ControlState, Result
from producers.ingest.agl.v1_api import (
    DEFAULT_ATTEMPT_ID,
    PREFIX,
    check_list_query,
    check_rollout_creates,
    check_rollout_patch,
    finished_from_patch,
    new_rollout,
    policy_version,
    task_from_create,
)
from producers.ingest.agl.v1_triplets import events_reply
from producers.ingest.front_door import BadRequest, guarded
from producers.mapping import MappingError
from schemas.codec import encode
from schemas.models import RolloutEvent

log = logging.getLogger(__name__)

PROXY_BODY = "Request body must be a JSON object"
RESOURCES_WAIT_S = 10.0


def check_models(body: Any) -> list[dict[str, Any]]:
    """``POST /api/models``'s body: a list of its ``Model`` (``model``, ``endpoint``, ``version`` = 0)."""
    if not isinstance(body, list):
        raise MappingError('the body is a JSON list of models ([{"model", "endpoint", "version"}])')
    out = []
    for i, m in enumerate(body):
        if not isinstance(m, dict) or not isinstance(m.get("model"), str) or not isinstance(m.get("endpoint"), str):
            raise MappingError(f"item {i} needs model and endpoint strings")
        version = m.get("version", 0)
        if isinstance(version, bool) or not isinstance(version, int):
            raise MappingError(f"item {i}: version must be an integer")
        out.append({"model": m["model"], "endpoint": m["endpoint"], "version": version})
    return out


def started_event(rollout: dict[str, Any], attempt_id: str, version: int | None) -> RolloutEvent:
    """The STARTED of a rollout's attempt, made from its stored rollout (its task is :func:`task_from_create`'s)."""
    task = task_from_create(rollout, resource_version=version, now_ns=time.time_ns())
    metadata = {k: v for k, v in task.metadata.items() if k.startswith("agentlightning.metadata.")}
    return RolloutEvent(rollout_id=rollout["rollout_id"], attempt_id=attempt_id, event="STARTED", time_ns=time.time_ns(),
                        task_id=task.task_id, mode=task.mode, attempt=1, resource_version=version, metadata=metadata)


class Api(Protocol):
    """What the store routes use of :class:`producers.ingest.agl.v1_api_http.AgentLightning1Routes` (which holds them)."""

    door: Any
    transport: Any
    queue: Any
    control: Any
    resources: Any
    policy: str
    inflight: int

    async def _json(self, request: web.Request) -> Any: ...


class AgentLightning1Store:
    """The store routes of one 1.x API object (its door, transport, queue, resources) on its control records."""

    def __init__(self, api: Api) -> None:
        self.api = api

    @property
    def door(self) -> Any:
        return self.api.door

    def add_to(self, app: web.Application) -> None:
        r = app.router
        r.add_get(f"{PREFIX}/rollouts/terminal", self.terminal)  # before {rollout_id}
        r.add_post(f"{PREFIX}/rollouts", self.create)
        r.add_get(f"{PREFIX}/rollouts", self.list)
        r.add_get(f"{PREFIX}/rollouts/{{rollout_id}}", self.get)
        r.add_patch(f"{PREFIX}/rollouts/{{rollout_id}}", self.patch)
        r.add_delete(f"{PREFIX}/rollouts/{{rollout_id}}", self.delete)
        r.add_get(f"{PREFIX}/rollouts/{{rollout_id}}/events", self.events)
        r.add_post(f"{PREFIX}/models", self.add_models)
        r.add_delete(f"{PREFIX}/models", self.clear_models)
        r.add_post("/proxy/pause", self.pause)
        r.add_post("/proxy/resume", self.resume)
        r.add_get("/proxy/state", self.proxy_state)

    # ------------------------------------------------------------------ helpers

    async def _write(self, record: dict[str, Any]) -> Result:
        return await asyncio.get_running_loop().run_in_executor(None, self.api.control.write, record)

    async def _read(self, fn: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, self.api.control.read, fn)

    def _answer(self, result: Result) -> web.Response:
        status, body = result
        if status == 204:
            return web.Response(status=204)
        return web.json_response(body, status=status)

    async def _resources(self) -> Any:
        """The newest resource versions, waiting up to :data:`RESOURCES_WAIT_S` for a replica's first read of rb.resources
        (its follower starts on the first call): its clients do not retry a create that answers 503."""
        deadline = time.monotonic() + RESOURCES_WAIT_S
        while (current := self.api.resources()) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return current

    async def _body(self, request: web.Request) -> Any:
        return await self.api._json(request)

    # ------------------------------------------------------------------ rollouts

    @guarded()
    async def create(self, request: web.Request) -> web.Response:
        """``POST /api/rollouts``: each new rollout recorded (one with a known id answered as stored), then its task
        onto rb.tasks."""
        try:
            reqs = check_rollout_creates(await self._body(request))
        except BadRequest as exc:
            return self.door.refuse(400, str(exc))
        except MappingError as exc:
            return self.door.refuse(422, f"not a list of Agent Lightning rollouts to create: {exc}")
        current = await self._resources()
        if current is None:
            return self.door.busy("rb.resources is still being read; retry", retry_after_s=1)
        now, now_ns = time.time(), time.time_ns()
        version = policy_version(current, self.api.policy)
        rollouts = [new_rollout(req, req["rollout_id"] or uuid.uuid4().hex, now=now) for req in reqs]
        try:
            tasks = [(r["rollout_id"], task_from_create(r, resource_version=version, now_ns=now_ns)) for r in rollouts]
            for _rid, task in tasks:
                encode(task)  # refused here, as a 422, rather than by the producer
            status, body = await self._write({"op": "create", "rollouts": rollouts})
        except (EncodeError, ValueError) as exc:
            return self.door.refuse(422, f"a rollout cannot be queued: {exc}")
        new = [t for t, created in zip(tasks, body["created"]) if created]
        if new and self.api.queue is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.api.queue.publish, new)
        return web.json_response(body["rollouts"], status=status)

    @guarded()
    async def list(self, request: web.Request) -> web.Response:
        """``GET /api/rollouts?state_in=...&limit=...``: the rollouts in those states, in creation order."""
        try:
            states, limit = check_list_query(request.query.getall("state_in", []), request.query.get("limit"))
        except MappingError as exc:
            return self.door.refuse(422, str(exc))
        return web.json_response(await self._read(lambda s: s.listed(states, limit)))

    @guarded()
    async def get(self, request: web.Request) -> web.Response:
        """``GET /api/rollouts/{id}``: its ``RolloutDetail``; 404 for an unknown (or deleted) one."""
        rid = request.match_info["rollout_id"]

        def detail(s: ControlState) -> Result:
            if rid not in s.rollouts:
                return 404, {"detail": f"Rollout not found: {rid}"}
            return 200, {"rollout": s.rollouts[rid], "attempts": s.attempts(rid)}
        return self._answer(await self._read(detail))

    @guarded()
    async def patch(self, request: web.Request) -> web.Response:
        """``PATCH /api/rollouts/{id}``: its status, as its transitions allow (409 otherwise); ``running`` records the
        attempt's STARTED, a terminal state its FINISHED."""
        rid = request.match_info["rollout_id"]
        try:
            status = check_rollout_patch(await self._body(request))
        except BadRequest as exc:
            return self.door.refuse(400, str(exc))
        except MappingError as exc:
            return self.door.refuse(422, f"not an Agent Lightning rollout patch: {exc}")
        code, body = await self._write({"op": "patch", "rollout_id": rid, "status": status, "now": time.time()})
        # Whether this patch moved it off queuing: then, and only then, its attempt starts (one STARTED). A later
        # patch (running -> succeeded) must not claim: the task may reach this replica's queue only now.
        started = bool(body.pop(LEFT_QUEUING, False)) if isinstance(body, dict) else False
        if code != 200 or "state" not in status:
            return web.json_response(body, status=code)
        attempt_id = status.get("last_attempt_id") or DEFAULT_ATTEMPT_ID
        loop = asyncio.get_running_loop()
        claim = None
        if self.api.queue is not None and started:  # the owner of its task's partition claims it (its STARTED, its time limit)
            try:
                claim = await loop.run_in_executor(None, self.api.queue.claim_agl1, rid, attempt_id)
            except KafkaUnavailable:
                claim = None
        records = []
        if claim is None and started:  # not claimed: its STARTED here
            records.append(encode(started_event(body, attempt_id, policy_version(self.api.resources(), self.api.policy))))
        finished = finished_from_patch(rid, status, now_ns=time.time_ns())
        if finished is not None:
            records.append(encode(finished))
        if records and (busy := self.door.deliver(self.api.transport, [(rid.encode(), v) for v in records])) is not None:
            return busy
        if finished is not None and self.api.queue is not None:
            await loop.run_in_executor(None, self.api.queue.finished, finished.attempt_id, finished.status or "failed", rid)
        return web.json_response(body)

    @guarded()
    async def delete(self, request: web.Request) -> web.Response:
        """``DELETE /api/rollouts/{id}``: 204, known or not."""
        return self._answer(await self._write({"op": "delete", "rollout_id": request.match_info["rollout_id"]}))

    @guarded()
    async def events(self, request: web.Request) -> web.Response:
        """``GET /api/rollouts/{id}/events?event_type=&format=triplet``: its last attempt's events."""
        rid, q = request.match_info["rollout_id"], request.query

        def read(s: ControlState) -> Result:
            if rid not in s.rollouts:
                return 404, {"detail": f"Rollout not found: {rid}"}
            return 200, s.rollout_events(rid, q.get("event_type"))
        code, body = await self._read(read)
        if code != 200:
            return web.json_response(body, status=code)
        routed = q.get("include_routed_experts", "true").lower() not in ("false", "0", "no", "off")
        return web.json_response(events_reply(body, triplet=q.get("format") == "triplet", routed_experts=routed))

    @guarded()
    async def terminal(self, request: web.Request) -> web.Response:
        """``GET /api/rollouts/terminal?after=&limit=``: the ended rollouts in the order they ended, a page."""
        try:
            after, limit = int(request.query.get("after", 0)), int(request.query.get("limit", 1000))
        except ValueError:
            return self.door.refuse(422, "after and limit are integers")
        return web.json_response(await self._read(lambda s: s.terminal_page(after, limit)))

    def settled(self, rollout_ids: list[str]) -> set[str]:
        """Of rollouts the queue offers, those the control records have past queuing (run through another replica)."""
        return self.api.control.read(lambda s: {r for r in rollout_ids
                                                if r in s.rollouts and s.rollouts[r]["status"]["state"] != "queuing"})

    async def record_event(self, event: dict[str, Any]) -> None:
        """An event its agent posted (already a span on rb.spans), recorded for its events query; one of a rollout
        the control records do not know (created before them, or by another API) is only the span."""
        try:
            await self._write({"op": "event", "event": event})
        except KafkaUnavailable as exc:
            log.warning("event of %s/%s not recorded for its events query: %s", event["rollout_id"], event["attempt_id"], exc)

    # ------------------------------------------------------------------ models, the proxy's pause

    @guarded()
    async def add_models(self, request: web.Request) -> web.Response:
        try:
            models = check_models(await self._body(request))
        except BadRequest as exc:
            return self.door.refuse(400, str(exc))
        except MappingError as exc:
            return self.door.refuse(422, str(exc))
        return await self._call({"op": "models", "models": models})

    @guarded()
    async def clear_models(self, request: web.Request) -> web.Response:
        return await self._call({"op": "models_clear"})

    @guarded()
    async def pause(self, request: web.Request) -> web.Response:
        """``POST /proxy/pause`` (``retry_after_seconds``, ``reason``): the LLM route answers 503 until resumed."""
        try:
            body = await self._body(request) or {}
        except BadRequest as exc:
            return self.door.refuse(400, str(exc))
        retry = body.get("retry_after_seconds", 5) if isinstance(body, dict) else None
        if not isinstance(body, dict) or isinstance(retry, bool) or not isinstance(retry, int):
            return self.door.refuse(422, "the body is {\"retry_after_seconds\": int, \"reason\": str}")
        return await self._call({"op": "pause", "retry_after_seconds": retry, "reason": body.get("reason")}, inflight=True)

    @guarded()
    async def resume(self, request: web.Request) -> web.Response:
        return await self._call({"op": "resume"}, inflight=True)

    @guarded()
    async def proxy_state(self, request: web.Request) -> web.Response:
        state = await self._read(lambda s: dict(s.proxy))
        return web.json_response({**state, "inflight": self.api.inflight})

    async def _call(self, record: dict[str, Any], *, inflight: bool = False) -> web.Response:
        code, body = await self._write(record)
        if inflight:
            body = {**body, "inflight": self.api.inflight}
        return web.json_response(body, status=code)

    async def llm_check(self, request: web.Request, rollout_id: str, body: bytes) -> web.Response | None:
        """Its LLM route's own refusals before forwarding: 503 while paused, 404 for an unknown rollout, 400 for a body
        that is not a JSON object. None: forward it."""
        try:
            proxy, known = await self._read(lambda s: (dict(s.proxy), rollout_id in s.rollouts))
        except KafkaUnavailable as exc:  # called by the LLM route, not a guarded handler of this class
            return self.door.busy(f"{exc}; retry later")
        if proxy["paused"]:
            return self.door.refuse(503, f"the LLM proxy is paused: {proxy['reason'] or 'no reason given'}",
                                    {"Retry-After": str(proxy["retry_after_seconds"])})
        if not known:
            return self.door.refuse(404, f"Rollout not found: {rollout_id}")
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            return self.door.refuse(400, "Invalid JSON in request body")
        if not isinstance(parsed, dict):
            return self.door.refuse(400, PROXY_BODY)
        return None


__all__ = ["AgentLightning1Store", "check_models", "started_event", "PROXY_BODY"]
