"""Agent Lightning 1.x's controller loop on the gateway's ``/api`` routes (producers/ingest/agl/v1_api_http.py), served by
aiohttp's test server: the queue a real claim book behind an in-memory stand-in for rb.tasks, the LLM
route forwarded to a stand-in proxy; no network beyond loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from producers.ingest.agl.claims import Claim, ClaimBook
from producers.ingest.agl.v1_api_http import AgentLightning1Routes
from schemas.codec import decode
from schemas.models import ResourceVersion, RolloutEvent, Task
from tests.unit.producers.memory_transport import MemoryTransport

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# What its controller polls (LocalReconciler._reconcile_once) and what its trainer posts, 1.0.2.
POLL = [("state_in", "queuing"), ("state_in", "running"), ("limit", "50")]
CREATE = [{"input": {"data_id": "s-1", "q": "2+2?"}, "is_train": True, "rollout_id": rid,
           "config": {"timeout_seconds": 600, "local": {"agent_class": "pkg.mod:Agent", "env_map": {"AGL_TASK": "input"}}}}
          for rid in ("ro-1", "ro-2")]


class BookQueue:
    """The gateway's TaskQueue as its 1.x routes use it: rb.tasks in memory, one replica owning it all."""

    def __init__(self) -> None:
        self.book = ClaimBook(600.0)
        self.offsets = 0

    def publish(self, tasks: Sequence[tuple[str, Task]]) -> None:
        for _rid, task in tasks:
            self.book.add(0, self.offsets, task, now=time.time())
            self.offsets += 1

    def claim_agl1(self, rollout_id: str, attempt_id: str) -> Claim | None:
        return self.book.take(None, now=time.time(), rollout_id=rollout_id, attempt_id=attempt_id, agl1=True)

    def finished(self, attempt_id: str, status: str, rollout_id: str | None = None) -> None:
        claim = self.book.claim_of(attempt_id, rollout_id)
        if claim is not None:
            self.book.end(claim, status)


def policy(endpoint: str) -> dict[str, ResourceVersion]:
    return {"policy": ResourceVersion(name="policy", version=3, kind="model", uri="/ckpt/3", base_model="tiny",
                                      created_ns=1, config={"endpoint": endpoint, "model": "policy"})}


Go = Callable[[TestClient], Awaitable[Any]]


def serve(routes: AgentLightning1Routes, go: Go) -> Any:
    async def main() -> Any:
        app = web.Application()
        routes.add_to(app)
        async with TestClient(TestServer(app)) as client:
            return await go(client)

    return asyncio.run(main())


async def answer(resp: Any) -> tuple[int, Any]:
    return resp.status, await resp.json()


def finished(transport: MemoryTransport) -> list[tuple[str, str, str | None]]:
    out = []
    for _key, value in transport.records:
        ev = decode(value)
        if isinstance(ev, RolloutEvent) and ev.event == "FINISHED":
            out.append((ev.rollout_id, ev.attempt_id, ev.status))
    return out


@pytest.mark.parametrize("with_queue", [True, False], ids=["queue", "no-queue"])
def test_its_controller_loop_lists_claims_and_ends_the_rollouts_it_created(with_queue: bool) -> None:
    """Its controllers' loop on one replica: the control records in this process (LocalControl, the default);
    with the queue each rollout is a task on rb.tasks too, claimed on running and its claim ended with it."""
    transport, queue = MemoryTransport(), BookQueue() if with_queue else None
    routes = AgentLightning1Routes(transport, lambda: policy("http://proxy:8788/v1"), token=TOKEN, queue=queue)  # type: ignore[arg-type]

    async def go(c: TestClient) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        async def poll() -> list[tuple[str, str]]:
            status, body = await answer(await c.get("/api/rollouts", params=POLL, headers=AUTH))
            assert status == 200
            return [(r["rollout_id"], r["status"]["state"]) for r in body]

        seen["created"] = await answer(await c.post("/api/rollouts", json=CREATE, headers=AUTH))
        seen["poll0"] = await poll()
        listed = (await (await c.get("/api/rollouts", params=POLL, headers=AUTH)).json())[0]
        seen["listed"] = listed
        seen["running"] = await answer(await c.patch("/api/rollouts/ro-1", json={"status": {"state": "running", "last_attempt_id": "0"}},
                                                     headers=AUTH))
        seen["again"] = await answer(await c.patch("/api/rollouts/ro-1", json={"status": {"state": "running", "last_attempt_id": "0"}},
                                                   headers=AUTH))
        seen["poll1"] = await poll()
        seen["done"] = await answer(await c.patch("/api/rollouts/ro-1", json={"status": {"state": "succeeded", "last_attempt_id": "0"}},
                                                  headers=AUTH))
        # its _spawn_for failing: the rollout goes from queuing to failed
        seen["spawn_failed"] = await answer(await c.patch("/api/rollouts/ro-2", json={"status": {
            "state": "failed", "error_message": "local subprocess spawn failed: boom"}}, headers=AUTH))
        seen["poll2"] = await poll()
        seen["terminal"] = await answer(await c.get("/api/rollouts", params=[("state_in", "succeeded")], headers=AUTH))
        seen["no_state"] = await answer(await c.get("/api/rollouts", headers=AUTH))
        seen["anonymous"] = (await c.get("/api/rollouts", params=POLL)).status
        return seen

    seen = serve(routes, go)
    status, created = seen["created"]
    assert status == 201 and [(r["rollout_id"], r["status"]["state"]) for r in created] == [("ro-1", "queuing"), ("ro-2", "queuing")]
    assert seen["poll0"] == [("ro-1", "queuing"), ("ro-2", "queuing")]
    assert {k: seen["listed"][k] for k in ("input", "config", "is_train")} == {k: created[0][k] for k in ("input", "config", "is_train")}
    status, running = seen["running"]
    assert status == 200 and running["status"]["state"] == "running" and running["status"]["last_attempt_id"] == "0"
    assert seen["again"] == (409, {"detail": "Rollout ro-1: cannot transition running -> running"})
    assert seen["poll1"] == [("ro-1", "running"), ("ro-2", "queuing")]
    assert seen["done"][0] == 200 and seen["done"][1]["status"]["state"] == "succeeded"
    assert seen["spawn_failed"][0] == 200 and seen["spawn_failed"][1]["status"]["error_message"] == "local subprocess spawn failed: boom"
    assert seen["poll2"] == [], "ended rollouts are no longer its controllers'"
    assert finished(transport) == [("ro-1", "0", "succeeded"), ("ro-2", "0", "failed")]
    assert seen["terminal"][0] == 200 and [(r["rollout_id"], r["status"]["state"]) for r in seen["terminal"][1]] == [
        ("ro-1", "succeeded")], "ended rollouts are listed as its server lists them"
    if queue is not None:
        assert not queue.book.claims() and not queue.book.offered_slots(agl1=True), "claimed, then ended; ro-2 settled"
    assert seen["no_state"][0] == 422 and "state_in is required" in seen["no_state"][1]["detail"]
    assert seen["anonymous"] == 401


def test_its_agents_llm_route_is_forwarded_to_the_proxy_route_of_their_attempt() -> None:
    calls: list[tuple[str, str | None, bytes]] = []

    async def upstream(request: web.Request) -> web.Response:
        calls.append((request.path, request.headers.get("Authorization"), await request.read()))
        return web.json_response({"choices": [{"message": {"content": "answer 4"}}]}, status=200)

    async def go(c: TestClient) -> list[tuple[int, Any]]:
        proxy_app = web.Application()
        proxy_app.router.add_post("/rollout/{rid}/attempt/{aid}/v1/{path:.*}", upstream)
        async with TestServer(proxy_app) as proxy:
            endpoint = str(proxy.make_url("/v1"))
            routes.resources = lambda: policy(endpoint)
            assert (await c.post("/api/rollouts", json=CREATE[:1], headers=AUTH)).status == 201  # its route knows ro-1
            unknown = await answer(await c.post("/proxy/rollout/ro-9/attempt/0/mode/train/openai/v1/chat/completions",
                                                json={}, headers=AUTH))
            route = "/proxy/rollout/ro-1/attempt/0/mode/train/openai/v1"
            out = [unknown, await answer(await c.post(f"{route}/chat/completions", data=b'{"messages": []}', headers=AUTH))]
            out.append(await answer(await c.post("/proxy/rollout/ro-1/attempt/0/mode/eval/openai/v1/chat/completions",
                                                 json={}, headers=AUTH)))
            out.append(await answer(await c.post(f"{route}/embeddings", json={}, headers=AUTH)))
            out.append(((await c.post(f"{route}/chat/completions", json={})).status, None))
        out.append(await answer(await c.post(f"{route}/chat/completions", json={}, headers=AUTH)))  # the proxy is gone
        routes.resources = lambda: {}
        out.append(await answer(await c.post(f"{route}/chat/completions", json={}, headers=AUTH)))
        return out

    routes = AgentLightning1Routes(MemoryTransport(), lambda: {}, token=TOKEN, llm_token="ptok")  # type: ignore[arg-type]
    unknown, ok, mode, path, anonymous, gone, unpublished = serve(routes, go)
    assert unknown == (404, {"detail": "Rollout not found: ro-9"}), "as its server's proxy answers"
    assert ok == (200, {"choices": [{"message": {"content": "answer 4"}}]})
    assert calls == [("/rollout/ro-1/attempt/0/v1/chat/completions", "Bearer ptok", b'{"messages": []}')], \
        "the proxy's route for the attempt, its own token, the body as sent"
    assert mode[0] == 404 and "mode" in mode[1]["detail"] and path[0] == 404 and "embeddings" in path[1]["detail"]
    assert anonymous[0] == 401
    assert gone[0] == 502 and "did not answer" in gone[1]["detail"]
    assert unpublished[0] == 503 and "--llm-endpoint" in unpublished[1]["detail"]
