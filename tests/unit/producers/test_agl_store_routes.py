"""The /v1/agl routes that publish resources and wait for rollouts (producers/ingest/agl/v0_3_store_http.py), served by
aiohttp's test server with in-memory stand-ins for Kafka and ClickHouse; no network."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from foundation.errors import KafkaUnavailable
from producers.ingest.agl.v0_3_store_http import LightningStoreRoutes
from schemas.models import ResourceVersion
from tests.unit.producers.memory_transport import MemoryTransport


class Rollouts:
    """ClickHouse's rollouts table: ``rows`` answered from the ``after``-th query on."""

    def __init__(self, rows: list[tuple[Any, ...]], after: int = 0) -> None:
        self.rows, self.after, self.queries = rows, after, 0

    def query(self, sql: str, parameters: dict[str, Any]) -> list[tuple[Any, ...]]:
        self.queries += 1
        wanted = set(parameters.get("ids", []))
        return [r for r in self.rows if r[0] in wanted] if self.queries > self.after else []


def row(rid: str, status: str) -> tuple[Any, ...]:
    return (rid, "at-1", rid, "train", 1, status, 1.0, 10**9, 2 * 10**9, {})


def call(routes: LightningStoreRoutes, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        app = web.Application()
        routes.add_to(app)
        async with TestClient(TestServer(app)) as client:
            r = await client.request(method, path, json=body)
            return r.status, await r.json()

    return asyncio.run(go())


POLICY = ResourceVersion(name="policy", version=2, kind="model", uri="/ckpt/2", base_model="tiny", created_ns=10**9,
                         config={"endpoint": "http://proxy:8788/v1"})
LLM = {"resource_type": "proxy_llm", "endpoint": "http://vllm:8000/v1", "model": "tiny", "sampling_parameters": {}}


def test_add_and_update_resources_publish_the_next_versions_and_answer_the_newest_set() -> None:
    published: list[ResourceVersion] = []
    current = {"policy": POLICY}
    routes = LightningStoreRoutes(MemoryTransport(), lambda: current)  # type: ignore[arg-type]
    routes.publish = lambda versions: published.extend(versions)

    status, up = call(routes, "POST", "/v1/agl/resources", {"policy": LLM})
    assert status == 201 and up["resources_id"] == "policy=3" and up["version"] == 3 and up["resources"] == {"policy": LLM}
    assert [(v.name, v.version, v.uri) for v in published] == [("policy", 3, "/ckpt/2")]
    current["policy"] = published[-1]  # what the follower reads back
    status, up = call(routes, "POST", "/v1/agl/resources/policy=3", {"policy": LLM})  # update_resources
    assert status == 200 and up["resources_id"] == "policy=4" and published[-1].version == 4


def test_resources_that_cannot_be_published_say_why() -> None:
    routes = LightningStoreRoutes(MemoryTransport(), lambda: {"policy": POLICY})  # type: ignore[arg-type]
    status, body = call(routes, "POST", "/v1/agl/resources", {"policy": LLM})
    assert status == 501 and "POST /v1/agl/resources" in body["detail"]  # a gateway built without Kafka settings

    def down(_versions: Sequence[ResourceVersion]) -> None:
        raise KafkaUnavailable("1 resource versions not delivered to rb.resources: timed out")

    routes.publish = down
    assert call(routes, "POST", "/v1/agl/resources", {"policy": LLM})[0] == 503
    status, body = call(routes, "POST", "/v1/agl/resources", {"policy": {"resource_type": "tool"}})
    assert status == 422 and "resource_type 'tool'" in body["detail"]
    routes.resources = lambda: None  # rb.resources not read to its end yet: versions cannot be numbered
    assert call(routes, "POST", "/v1/agl/resources", {"policy": LLM})[0] == 503


def test_wait_for_rollouts_answers_those_that_finished_once_they_did() -> None:
    routes = LightningStoreRoutes(MemoryTransport(), dict)  # type: ignore[arg-type]
    routes.wait_poll_s = 0.01
    table = Rollouts([row("ro-a", "succeeded"), row("ro-b", "failed")], after=2)
    routes.clickhouse = table  # type: ignore[assignment]
    status, got = call(routes, "POST", "/v1/agl/waits/rollouts", {"rollout_ids": ["ro-b", "ro-a"], "timeout": 5})
    assert status == 200 and [(r["rollout_id"], r["status"]) for r in got] == [("ro-b", "failed"), ("ro-a", "succeeded")]
    assert table.queries == 3 and "attempt" not in got[0], "polled until both ended; a Rollout, not an AttemptedRollout"


def test_wait_for_rollouts_answers_what_finished_when_its_timeout_passes() -> None:
    routes = LightningStoreRoutes(MemoryTransport(), dict)  # type: ignore[arg-type]
    routes.clickhouse = Rollouts([row("ro-a", "succeeded")])  # type: ignore[assignment]
    status, got = call(routes, "POST", "/v1/agl/waits/rollouts", {"rollout_ids": ["ro-a", "ro-unknown"], "timeout": 0.1})
    assert status == 200 and [r["rollout_id"] for r in got] == ["ro-a"]
    assert call(routes, "POST", "/v1/agl/waits/rollouts", {"rollout_ids": [], "timeout": None}) == (200, [])


@pytest.mark.parametrize("body", [{"rollout_ids": "ro-a"}, {"rollout_ids": ["ro-a"], "timeout": "soon"}])
def test_a_bad_wait_is_422_and_without_clickhouse_501(body: Any) -> None:
    routes = LightningStoreRoutes(MemoryTransport(), dict)  # type: ignore[arg-type]
    assert call(routes, "POST", "/v1/agl/waits/rollouts", body)[0] == 501
    routes.clickhouse = Rollouts([])  # type: ignore[assignment]
    assert call(routes, "POST", "/v1/agl/waits/rollouts", body)[0] == 422


class FlakyTransport(MemoryTransport):
    """Takes ``room`` more records (None: any number); refuses all while ``up`` is false."""

    def __init__(self) -> None:
        super().__init__()
        self.room: int | None = None
        self.up = True

    def accepting(self, nbytes: int = 0) -> bool:
        return self.up

    def emit_encoded(self, key: bytes, value: bytes) -> bool:
        if self.room is not None:
            if self.room <= 0:
                return False
            self.room -= 1
        return super().emit_encoded(key, value)


class Commits:
    def __init__(self) -> None:
        self.offsets: list[Any] = []

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.offsets.extend(offsets)


def queue_of(transport: FlakyTransport, tasks: int) -> Any:
    from foundation.config import Topics
    from producers.ingest.agl.queue import TaskQueue
    from schemas.models import Task

    q = TaskQueue({}, Topics(), transport, claim_timeout_s=60)  # type: ignore[arg-type]
    q._thread, q._consumer = object(), Commits()  # type: ignore[assignment]  # joined already: no consumer thread here
    q.book.assign(0, (-1, 0.0))
    for off in range(tasks):
        q.book.add(0, off, Task(task_id=f"t{off}", input="{}", group_size=1, created_ns=1), now=0)
    return q


def dequeue(routes: LightningStoreRoutes, limit: int = 1) -> tuple[int, Any, str | None]:
    async def go() -> tuple[int, Any, str | None]:
        app = web.Application()
        routes.add_to(app)
        async with TestClient(TestServer(app)) as client:
            r = await client.post("/v1/agl/queues/rollouts/dequeue", json={"limit": limit, "worker_id": "w"})
            return r.status, await r.json(), r.headers.get("Retry-After")

    return asyncio.run(go())


def test_a_claim_whose_started_cannot_be_recorded_is_not_handed_out() -> None:
    transport = FlakyTransport()
    routes = LightningStoreRoutes(transport, dict, queue=queue_of(transport, 2))  # type: ignore[arg-type]
    transport.room = 0  # the local queue is full: the STARTED is refused
    status, body, retry = dequeue(routes)
    assert status == 503 and retry == "5" and "STARTED could not be recorded" in body["detail"]
    transport.up = False  # Kafka down and the spool full: refused before anything is taken
    assert dequeue(routes)[0] == 503
    transport.up, transport.room = True, 1
    status, got, _ = dequeue(routes, limit=2)  # room for one STARTED: one handed out, the other kept
    assert status == 200 and [(r["rollout_id"], r["attempt"]["sequence_id"]) for r in got] == [("ro-t0-p0o0-0", 1)]
    transport.room = None
    status, got, _ = dequeue(routes)
    assert [(r["rollout_id"], r["attempt"]["sequence_id"]) for r in got] == [("ro-t1-p0o1-0", 1)], "offered again, first"
    assert len(transport.records) == 2, "a STARTED for each rollout handed out, none for the refused tries"
