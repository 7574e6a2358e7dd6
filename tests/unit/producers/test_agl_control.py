"""Agent Lightning's control records (producers/ingest/agl/control.py) and 1.x's store routes on them
(producers/ingest/agl/v1_store_http.py): the state machine every replica replays, and the routes served by aiohttp's
test server on a :class:`LocalControl`, the queue a real claim book, rb.spans in memory."""

from __future__ import annotations

import json
import threading
from typing import Any

from aiohttp.test_utils import TestClient

from producers.ingest.agl.control import ControlState, LocalControl
from producers.ingest.agl.v1_api_http import AgentLightning1Routes
from producers.ingest.agl.v1_triplets import events_reply
from schemas.codec import decode
from schemas.models import RolloutEvent
from tests.unit.producers.memory_transport import MemoryTransport
from tests.unit.producers.test_agl_api_routes import AUTH, CREATE, POLL, TOKEN, BookQueue, answer, policy, serve


def _rollout(rid: str, state: str = "queuing") -> dict[str, Any]:
    return {"rollout_id": rid, "input": {"data_id": rid}, "is_train": True,
            "status": {"state": state, "version": 1, "created_at": 1.0, "updated_at": 1.0, "last_attempt_id": None}}


def test_replaying_the_same_records_gives_every_replica_the_same_state_and_answers() -> None:
    records = [{"op": "create", "rollouts": [_rollout("a"), _rollout("b")]},
               {"op": "create", "rollouts": [{**_rollout("a"), "input": "DIFFERENT"}]},
               {"op": "patch", "rollout_id": "a", "status": {"state": "running"}, "now": 2.0},
               {"op": "patch", "rollout_id": "a", "status": {"state": "queuing"}, "now": 3.0},
               {"op": "patch", "rollout_id": "a", "status": {"state": "succeeded"}, "now": 4.0},
               {"op": "sequence", "key": "a/0"}, {"op": "sequence", "key": "a/0"}, {"op": "sequence", "key": "b/0"},
               {"op": "delete", "rollout_id": "b"}, {"op": "nonsense"}]
    one, two = ControlState(), ControlState()
    answers = [one.apply(json.loads(json.dumps(r))) for r in records]
    assert answers == [two.apply(json.loads(json.dumps(r))) for r in records]
    assert one == two
    assert answers[1][1]["rollouts"][0]["input"] == {"data_id": "a"} and answers[1][1]["created"] == [False]
    assert answers[3][0] == 409, "running never goes back to queuing"
    assert [a[1] for a in answers[5:8]] == [1, 2, 1], "sequence ids: per attempt, 1 up"
    assert one.terminal == ["a"] and "b" not in one.rollouts and answers[9][0] == 400
    assert one.rollouts["a"]["status"]["version"] == 3 and one.rollouts["a"]["status"]["updated_at"] == 4.0


def test_concurrent_callers_of_the_sequence_counter_get_unique_increasing_ids() -> None:
    control, got = LocalControl(), []
    lock = threading.Lock()

    def call() -> None:
        for _ in range(50):
            n = control.write({"op": "sequence", "key": "ro/at"})[1]
            with lock:
                got.append(n)

    threads = [threading.Thread(target=call) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 1001))


def test_triplets_trim_and_keep_the_last_request_of_each_valid_prompt() -> None:
    def req(prompt: Any, out: int) -> dict[str, Any]:
        return {"event_type": "model_request", "data": {"response": {"prompt_token_ids": prompt, "choices": [{"token_ids": [out]}]}}}

    events = [req([1, 2], 10), {"event_type": "reward", "data": {"value": 0.5, "extra": 1}}, req([1, 2], 30), req([True], 40),
              req([True], 50)]
    got = events_reply(events, triplet=True)
    assert [e["data"].get("response_token_ids") for e in got] == [None, [30], [40], [50]]
    assert got[0]["data"] == {"value": 0.5}
    assert events_reply(events, triplet=False) == events


def _routes() -> tuple[AgentLightning1Routes, MemoryTransport]:
    transport = MemoryTransport()
    routes = AgentLightning1Routes(transport, lambda: policy("http://proxy:8788/v1"), token=TOKEN, queue=BookQueue())  # type: ignore[arg-type]
    routes.control = LocalControl()
    return routes, transport


def test_a_created_rollout_reads_back_at_once_and_a_re_create_with_its_id_answers_the_first() -> None:
    routes, transport = _routes()

    async def go(c: TestClient) -> dict[str, Any]:
        seen = {"created": await answer(await c.post("/api/rollouts", json=CREATE, headers=AUTH))}
        seen["detail"] = await answer(await c.get("/api/rollouts/ro-1", headers=AUTH))
        seen["running"] = await answer(await c.patch("/api/rollouts/ro-1", json={"status": {"state": "running"}}, headers=AUTH))
        again = [{**CREATE[0], "input": {"data_id": "s-1", "q": "DIFFERENT"}}]
        seen["again"] = await answer(await c.post("/api/rollouts", json=again, headers=AUTH))
        seen["back"] = await answer(await c.patch("/api/rollouts/ro-1", json={"status": {"state": "queuing"}}, headers=AUTH))
        seen["listed"] = await answer(await c.get("/api/rollouts", params=POLL, headers=AUTH))
        seen["event"] = await answer(await c.post("/api/rollouts/ro-1/attempt/0/events",
                                                  json={"event_type": "reward", "data": {"value": 1.0}}, headers=AUTH))
        seen["events"] = await answer(await c.get("/api/rollouts/ro-1/events", params={"format": "triplet"}, headers=AUTH))
        seen["done"] = await answer(await c.patch("/api/rollouts/ro-1", json={"status": {"state": "succeeded"}}, headers=AUTH))
        seen["terminal"] = await answer(await c.get("/api/rollouts/terminal", headers=AUTH))
        seen["deleted"] = (await c.delete("/api/rollouts/ro-2", headers=AUTH)).status
        seen["gone"] = (await c.get("/api/rollouts/ro-2", headers=AUTH)).status
        seen["deleted_again"] = (await c.delete("/api/rollouts/ro-2", headers=AUTH)).status
        return seen

    seen = serve(routes, go)
    assert seen["created"][0] == 201 and [r["status"]["state"] for r in seen["created"][1]] == ["queuing", "queuing"]
    assert seen["detail"] == (200, {"rollout": seen["created"][1][0], "attempts": []})
    assert seen["running"][0] == 200 and seen["running"][1]["status"]["state"] == "running"
    assert seen["again"][0] == 201 and seen["again"][1][0]["input"]["q"] == "2+2?"
    assert seen["again"][1][0]["status"]["state"] == "running", "a re-create leaves a running rollout running"
    assert seen["back"][0] == 409
    assert {(r["rollout_id"], r["status"]["state"]) for r in seen["listed"][1]} == {("ro-1", "running"), ("ro-2", "queuing")}
    assert seen["events"] == (200, [{**seen["event"][1], "data": {"value": 1.0}}])
    assert seen["terminal"][1]["items"] == [{"rollout_id": "ro-1", "state": "succeeded", "data_id": "s-1", "is_train": True}]
    assert (seen["deleted"], seen["gone"], seen["deleted_again"]) == (204, 404, 204)
    events = [decode(v) for _k, v in transport.records]
    lifecycle = [(e.rollout_id, e.event, e.status) for e in events if isinstance(e, RolloutEvent)]
    # its STARTED is the queue's, which claimed it (the stand-in records claims, not events); its FINISHED once
    assert lifecycle == [("ro-1", "FINISHED", "succeeded")]
    assert not routes.queue.book.claims(), "claimed on running, its claim ended with the rollout"  # type: ignore[union-attr]


def test_the_proxy_refuses_a_body_that_is_no_object_and_answers_503_while_paused() -> None:
    routes, _transport = _routes()
    url = "/proxy/rollout/ro-1/attempt/0/mode/train/openai/v1/chat/completions"

    async def go(c: TestClient) -> dict[str, Any]:
        await c.post("/api/rollouts", json=CREATE, headers=AUTH)
        seen = {"list": await answer(await c.post(url, data="[]", headers={**AUTH, "Content-Type": "application/json"}))}
        seen["unknown"] = (await c.post(url.replace("ro-1", "ro-9"), json={}, headers=AUTH)).status
        seen["pause"] = await answer(await c.post("/proxy/pause", json={"retry_after_seconds": 9, "reason": "drain"}, headers=AUTH))
        paused = await c.post(url, json={"messages": []}, headers=AUTH)
        seen["paused"] = (paused.status, paused.headers.get("Retry-After"))
        seen["state"] = await answer(await c.get("/proxy/state", headers=AUTH))
        seen["resume"] = await answer(await c.post("/proxy/resume", headers=AUTH))
        return seen

    seen = serve(routes, go)
    assert seen["list"] == (400, {"detail": "Request body must be a JSON object"})
    assert seen["unknown"] == 404
    assert seen["pause"] == (200, {"paused": True, "retry_after_seconds": 9, "reason": "drain", "inflight": 0})
    assert seen["paused"] == (503, "9") and seen["state"][1]["reason"] == "drain"
    assert seen["resume"][1]["paused"] is False


def test_the_queue_drops_offered_rollouts_that_ran_through_another_replica() -> None:
    routes, _transport = _routes()
    queue = routes.queue

    async def go(c: TestClient) -> None:
        await c.post("/api/rollouts", json=CREATE, headers=AUTH)

    serve(routes, go)
    assert [s.rollout_id for s in queue.book.offered_slots(agl1=True)] == ["ro-1", "ro-2"]  # type: ignore[union-attr]
    routes.control.write({"op": "patch", "rollout_id": "ro-1", "status": {"state": "running"}, "now": 1.0})  # type: ignore[union-attr]
    assert routes.store.settled(["ro-1", "ro-2", "ro-old"]) == {"ro-1"}, "unknown ones (older than the records) stay"
    queue.book.settle(routes.store.settled(["ro-1", "ro-2"]))  # type: ignore[union-attr]
    assert [s.rollout_id for s in queue.book.offered_slots(agl1=True)] == ["ro-2"]  # type: ignore[union-attr]
    assert queue.book.committable(0) == 1, "its task is done here: the partition's commit moves past it"  # type: ignore[union-attr]


def test_0_3_workers_and_an_ended_rollout_read_from_the_control_records() -> None:
    from producers.ingest.agl.v0_3_store_http import LightningStoreRoutes
    from tests.unit.producers.test_agl_store_routes import Rollouts, call, row

    routes = LightningStoreRoutes(MemoryTransport(), lambda: {})  # type: ignore[arg-type]
    routes.control = LocalControl()
    assert call(routes, "POST", "/v1/agl/workers/w-1", {"heartbeat_stats": {"cpu": 0.5}})[0] == 200
    assert call(routes, "POST", "/v1/agl/workers/w-2", None)[0] == 200
    assert call(routes, "POST", "/v1/agl/workers/w-1", None)[1]["heartbeat_stats"] == {"cpu": 0.5}, "no stats: the last kept"
    assert call(routes, "GET", "/v1/agl/workers/w-9") == (200, None)
    status, found = call(routes, "POST", "/v1/agl/workers/search", {"worker_id_contains": "-2"})
    assert status == 200 and [w["worker_id"] for w in found["items"]] == ["w-2"] and found["total"] == 1
    # An enqueued rollout whose attempt ended: without a ClickHouse server, the recorded end; with one, running until
    # ClickHouse has its attempt (its spans are there from then on), then ClickHouse's.
    routes.control.write({"op": "v03_rollouts", "rollouts": [{"rollout_id": "ro-1", "status": "queuing", "end_time": None}]})
    routes.control.write({"op": "v03_rollouts", "rollouts": [{"rollout_id": "ro-1", "status": "preparing", "attempt": _attempt(
        "ro-1", "at-1", 1, "w-1")}], "now": 1.0, "dequeue": True})
    routes.control.write({"op": "v03_status", "rollout_id": "ro-1", "attempt_id": "at-1", "status": "succeeded", "end_time": 2.0})
    assert call(routes, "GET", "/v1/agl/rollouts/ro-1")[1]["status"] == "succeeded"
    routes.clickhouse = Rollouts([row("ro-1", "succeeded")], after=1)  # type: ignore[assignment]
    search = {"rollout_id_in": ["ro-1"]}
    assert [r["status"] for r in call(routes, "POST", "/v1/agl/rollouts/search", search)[1]["items"]] == ["running"]
    assert [r["status"] for r in call(routes, "POST", "/v1/agl/rollouts/search", search)[1]["items"]] == ["succeeded"]
    # One ended by update_rollout before any attempt (no spans, never a row in ClickHouse) reads ended at once.
    routes.control.write({"op": "v03_rollouts", "rollouts": [{"rollout_id": "ro-2", "status": "queuing", "end_time": None}]})
    routes.control.write({"op": "v03_update", "rollout_id": "ro-2", "fields": {"status": "failed"}, "now": 3.0})
    failed = call(routes, "POST", "/v1/agl/rollouts/search", {"status_in": ["failed"]})[1]["items"]
    assert [(r["rollout_id"], r["status"]) for r in failed] == [("ro-2", "failed")]


def test_only_the_patch_that_moves_a_rollout_off_queuing_says_so() -> None:
    """Its attempt's one STARTED hangs on this: running -> succeeded must not start it again (seen: a duplicate
    STARTED when the task reached the replica's queue between the two patches)."""
    from producers.ingest.agl.control import LEFT_QUEUING

    s = ControlState()
    s.apply({"op": "create", "rollouts": [_rollout("a"), _rollout("b")]})
    running = s.apply({"op": "patch", "rollout_id": "a", "status": {"state": "running"}, "now": 2.0})[1]
    done = s.apply({"op": "patch", "rollout_id": "a", "status": {"state": "succeeded"}, "now": 3.0})[1]
    failed_at_once = s.apply({"op": "patch", "rollout_id": "b", "status": {"state": "failed"}, "now": 4.0})[1]
    meta_only = s.apply({"op": "patch", "rollout_id": "a", "status": {"error_message": "x"}, "now": 5.0})[1]
    assert running[LEFT_QUEUING] is True and failed_at_once[LEFT_QUEUING] is True
    assert LEFT_QUEUING not in done and LEFT_QUEUING not in meta_only
    assert LEFT_QUEUING not in s.rollouts["a"] and LEFT_QUEUING not in s.rollouts["b"], "never stored"


def test_0_3_sequence_ids_come_from_the_counter_and_add_span_leaves_the_numbering_to_the_span_stage() -> None:
    """Ids handed out are 1 up per attempt and never repeated; a span sent with one travels unnumbered (the stage
    numbers every span of an attempt by arrival, so an OTLP or proxy span never takes an id the counter gave), its
    own id kept in an attribute; an id of the caller's own moves the counter above it (as its store syncs it)."""
    from producers.ingest.agl.v0_3_store import STORE_SEQUENCE
    from producers.ingest.agl.v0_3_store_http import LightningStoreRoutes
    from schemas.models import UNNUMBERED
    from tests.unit.producers.test_agl_store import REWARD
    from tests.unit.producers.test_agl_store_routes import call

    transport = MemoryTransport()
    routes = LightningStoreRoutes(transport, lambda: {})  # type: ignore[arg-type]
    assert call(routes, "POST", "/v1/agl/spans/next", {"rollout_id": "ro-1", "attempt_id": "at-1"})[1] == {"sequence_id": 0}
    routes.control = LocalControl()
    ids = [call(routes, "POST", "/v1/agl/spans/next", {"rollout_id": "ro-1", "attempt_id": a})[1]["sequence_id"]
           for a in ("at-1", "at-1", "at-2", "at-1")]
    assert ids == [1, 2, 1, 3], "per attempt, 1 up"
    assert call(routes, "POST", "/v1/agl/spans/next", {"rollout_id": "ro-1"})[0] == 422
    assert call(routes, "POST", "/v1/agl/spans", {**REWARD, "sequence_id": 3})[0] == 201
    assert call(routes, "POST", "/v1/agl/spans", {**REWARD, "span_id": "ab" * 8, "sequence_id": 100})[0] == 201
    sent = [decode(v) for _k, v in transport.records]
    assert [(s.sequence_id, s.attributes[STORE_SEQUENCE]) for s in sent] == [(UNNUMBERED, "3"), (UNNUMBERED, "100")]
    assert call(routes, "POST", "/v1/agl/spans/next", {"rollout_id": "ro-1", "attempt_id": "at-1"})[1]["sequence_id"] == 101


def test_0_3_attempts_start_attempt_update_rollout_and_statistics_on_the_control_records() -> None:
    from producers.ingest.agl.v0_3_store_http import LightningStoreRoutes
    from tests.unit.producers.test_agl_store_routes import call

    transport = MemoryTransport()
    routes = LightningStoreRoutes(transport, lambda: {})  # type: ignore[arg-type]
    assert call(routes, "POST", "/v1/agl/rollouts/ro-1/attempts", None)[0] == 501, "no control records: not served"
    routes.control = LocalControl()
    status, started = call(routes, "POST", "/v1/agl/rollouts", {"input": {"q": 1}, "mode": "val"})
    rid, first = started["rollout_id"], started["attempt"]
    assert status == 201 and first["sequence_id"] == 1
    assert call(routes, "GET", f"/v1/agl/rollouts/{rid}/attempts/latest")[1]["attempt_id"] == first["attempt_id"]
    # It fails; a new attempt of it (start_attempt) is numbered 2, its STARTED on rb.spans with that number.
    assert call(routes, "POST", f"/v1/agl/rollouts/{rid}/attempts/{first['attempt_id']}", {"status": "failed"})[0] == 200
    assert call(routes, "GET", f"/v1/agl/rollouts/{rid}")[1]["status"] == "failed"
    status, retry = call(routes, "POST", f"/v1/agl/rollouts/{rid}/attempts", {"worker_id": "w-1"})
    assert status == 201 and retry["attempt"]["sequence_id"] == 2 and retry["status"] == "preparing"
    started_events = [e for e in (decode(v) for _k, v in transport.records) if isinstance(e, RolloutEvent) and e.event == "STARTED"]
    assert [(e.attempt_id, e.attempt, e.mode) for e in started_events][-1] == (retry["attempt"]["attempt_id"], 2, "val")
    assert call(routes, "POST", f"/v1/agl/rollouts/{rid}/attempts/{retry['attempt']['attempt_id']}", {"status": "running"})[1]["sequence_id"] == 2
    status, attempts = call(routes, "POST", f"/v1/agl/rollouts/{rid}/attempts/search", {"sort_by": "sequence_id", "sort_order": "desc"})
    assert status == 200 and [(a["sequence_id"], a["status"]) for a in attempts["items"]] == [(2, "running"), (1, "failed")]
    assert call(routes, "GET", f"/v1/agl/rollouts/{rid}")[1]["status"] == "running"
    assert call(routes, "POST", "/v1/agl/rollouts/ro-none/attempts", None)[0] == 404
    # update_rollout: fields read back at once; a status back to the queue is not served; an unknown rollout 404.
    status, updated = call(routes, "POST", f"/v1/agl/rollouts/{rid}", {"metadata": {"k": "v"}, "status": "cancelled"})
    assert status == 200 and updated["metadata"] == {"k": "v"} and updated["status"] == "cancelled" and updated["end_time"]
    assert call(routes, "GET", f"/v1/agl/rollouts/{rid}")[1]["metadata"] == {"k": "v"}
    assert call(routes, "POST", f"/v1/agl/rollouts/{rid}", {"status": "requeuing"})[0] == 501
    assert call(routes, "POST", f"/v1/agl/rollouts/{rid}", {"status": "nonsense"})[0] == 422
    assert call(routes, "POST", "/v1/agl/rollouts/ro-none", {"metadata": {}})[0] == 404
    # A rollout still queuing: a status update or a new attempt takes it out of the queue, as its store does.
    routes.control.write({"op": "v03_rollouts", "rollouts": [{"rollout_id": "ro-q", "status": "queuing"},
                                                               {"rollout_id": "ro-s", "status": "queuing"},
                                                               {"rollout_id": "ro-k", "status": "queuing"}]})
    status, cancelled = call(routes, "POST", "/v1/agl/rollouts/ro-q", {"status": "cancelled"})
    assert status == 200 and cancelled["status"] == "cancelled" and cancelled["end_time"]
    status, begun = call(routes, "POST", "/v1/agl/rollouts/ro-s/attempts", {"worker_id": "w-2"})
    assert status == 201 and begun["status"] == "preparing" and begun["attempt"]["sequence_id"] == 1
    assert call(routes, "POST", "/v1/agl/rollouts/ro-k", {"metadata": {"n": 1}})[0] == 200, "no status: stays queued"
    assert routes.settled(["ro-q", "ro-s", "ro-k", "ro-none"]) == {"ro-q", "ro-s"}
    stats = call(routes, "GET", "/v1/agl/statistics")[1]
    assert (stats["total_rollouts"], stats["total_attempts"], stats["total_workers"]) == (4, 3, 2), "w-1, w-2: by their attempts"
    assert call(routes, "GET", "/v1/agl/workers/w-2")[1]["current_rollout_id"] == "ro-s"
    # What its server refuses with 400, in its words: a null an update needs, a page it cannot give.
    assert call(routes, "POST", f"/v1/agl/rollouts/{rid}", {"status": None}) == (400, {
        "detail": "status is invalid; it cannot be a null value."})
    assert call(routes, "POST", f"/v1/agl/rollouts/{rid}/attempts/latest", {"worker_id": None})[0] == 400
    assert call(routes, "POST", "/v1/agl/workers/w-1", {"heartbeat_stats": None})[0] == 400
    for query, reason in (({"sort_by": "nope"}, "Invalid sort_by: nope, allowed fields are: rollout_id, input"),
                          ({"limit": 0}, "Limit must be greater than 0"), ({"offset": -1}, "Offset must be"),
                          ({"sort_order": "up"}, "Invalid sort_order: up"), ({"filter_logic": "xor"}, "Invalid filter_logic")):
        status, body = call(routes, "POST", "/v1/agl/rollouts/search", query)
        assert status == 400 and body["detail"].startswith(reason), (query, body)
    assert call(routes, "POST", "/v1/agl/workers/search", {"sort_by": "cpu"})[0] == 400
    # update_attempt on "latest": the rollout's latest attempt as recorded; 404 before its first.
    status, latest = call(routes, "POST", "/v1/agl/rollouts/ro-s/attempts/latest", {"status": "running"})
    assert status == 200 and latest["attempt_id"] == begun["attempt"]["attempt_id"] and latest["status"] == "running"
    assert call(routes, "GET", "/v1/agl/rollouts/ro-s")[1]["status"] == "running"
    assert call(routes, "POST", "/v1/agl/rollouts/ro-s/attempts/latest", {"metadata": {"k": 1}})[1]["status"] == "running"
    assert call(routes, "GET", "/v1/agl/rollouts/ro-s/attempts/latest")[1]["metadata"] == {"k": 1}, "kept, read back"
    assert call(routes, "POST", "/v1/agl/rollouts/ro-k/attempts/latest", {"status": "running"})[0] == 404


def test_0_3_query_resources_answers_the_newest_set() -> None:
    from producers.ingest.agl.v0_3_store_http import LightningStoreRoutes
    from tests.unit.producers.test_agl_store_routes import POLICY, call

    routes = LightningStoreRoutes(MemoryTransport(), lambda: {"policy": POLICY})  # type: ignore[arg-type]
    status, got = call(routes, "GET", "/v1/agl/resources")
    assert status == 200 and got["total"] == 1 and got["items"][0]["resources_id"] == "policy=2"
    assert call(routes, "GET", "/v1/agl/resources?resources_id_contains=policy")[1]["total"] == 1
    assert call(routes, "GET", "/v1/agl/resources?resources_id=other")[1] == {"items": [], "limit": -1, "offset": 0, "total": 0}


def test_0_3_an_older_resources_set_a_rollout_was_enqueued_under_answers_after_a_newer_version() -> None:
    """Its runner fetches a rollout's resources by the id the enqueue named; the trainer may have published a newer
    version since (rb.resources holds the newest per name): the set is in the control records."""
    from producers.ingest.agl.v0_3_store_http import LightningStoreRoutes
    from tests.unit.producers.test_agl_store_routes import POLICY, call

    current = {"policy": POLICY}
    routes = LightningStoreRoutes(MemoryTransport(), lambda: current)  # type: ignore[arg-type]
    routes.control = LocalControl()
    assert call(routes, "GET", "/v1/agl/resources/latest")[1]["resources_id"] == "policy=2"
    current["policy"] = POLICY.model_copy(update={"version": 3})
    old = call(routes, "GET", "/v1/agl/resources/policy=2")[1]
    assert old["resources_id"] == "policy=2" and old["resources"]["policy"]["resource_type"] == "proxy_llm"
    assert call(routes, "GET", "/v1/agl/resources/policy=9")[1] is None, "a set never served: null, as its store"
    listed = call(routes, "GET", "/v1/agl/resources")[1]
    assert [u["resources_id"] for u in listed["items"]] == ["policy=2", "policy=3"]
    assert call(routes, "GET", "/v1/agl/statistics")[1]["total_resources"] == 2


class _Counted(LocalControl):
    """A replica whose own view (``peek``) may lag what a linearizable ``read`` sees; counts reads and writes."""

    def __init__(self, lagging: bool = False) -> None:
        super().__init__()
        self.lagging, self.reads, self.writes = lagging, 0, []  # type: ignore[var-annotated]

    def write(self, record: Any) -> Any:
        self.writes.append(record["op"])
        return super().write(record)

    def read(self, fn: Any) -> Any:
        self.reads += 1
        return super().read(fn)

    def peek(self, fn: Any) -> Any:
        return fn(ControlState()) if self.lagging else super().read(fn)


def test_0_3_an_attempt_update_records_control_state_only_for_rollouts_of_the_control_records() -> None:
    """An attempt this API never handed out (OTLP spans, then update_attempt: the e2e bench's load) ends through its
    Finished event alone: no control record, no round trip. One this API handed out is recorded, also through a
    replica whose own view has not applied the rollout yet (one linearizable read tells)."""
    from producers.ingest.agl.claims import may_be_minted, new_attempt_id
    from producers.ingest.agl.v0_3_store_http import LightningStoreRoutes
    from tests.unit.producers.test_agl_store_routes import call

    assert may_be_minted(new_attempt_id()) and not may_be_minted("at-7-000001-0") and not may_be_minted("at-3F9C01AB")

    transport = MemoryTransport()
    routes = LightningStoreRoutes(transport, lambda: {})  # type: ignore[arg-type]
    routes.control = control = _Counted()
    assert call(routes, "POST", "/v1/agl/rollouts/ro-7-000001/attempts/at-7-000001-0", {"status": "succeeded"})[0] == 200
    finished = [decode(v) for _k, v in transport.records]
    assert [(e.rollout_id, e.status) for e in finished if isinstance(e, RolloutEvent)] == [("ro-7-000001", "succeeded")]
    assert control.writes == [] and control.reads == 0, "a data-plane attempt costs no control round trip"

    # A minted-shape id on a rollout nobody recorded: one read, still nothing written.
    assert call(routes, "POST", "/v1/agl/rollouts/ro-x/attempts/at-0123abcd", {"status": "succeeded"})[0] == 200
    assert control.writes == [] and control.reads == 1

    # Started through this API: its end is a control record and reads back as ended.
    status, started = call(routes, "POST", "/v1/agl/rollouts", {"input": {"q": 1}})
    assert status == 201 and control.writes == ["v03_rollouts"]
    rid, aid = started["rollout_id"], started["attempt"]["attempt_id"]
    assert call(routes, "POST", f"/v1/agl/rollouts/{rid}/attempts/{aid}", {"status": "succeeded"})[0] == 200
    assert control.writes == ["v03_rollouts", "v03_status"]
    assert call(routes, "GET", f"/v1/agl/rollouts/{rid}")[1]["status"] == "succeeded"

    # Through a replica that has not applied the rollout yet: the read finds it, and the end is recorded.
    lagging = _Counted(lagging=True)
    lagging.state = control.state
    routes.control = lagging
    second = call(routes, "POST", "/v1/agl/rollouts", {"input": {"q": 2}})[1]
    assert call(routes, "POST", f"/v1/agl/rollouts/{second['rollout_id']}/attempts/{second['attempt']['attempt_id']}",
                {"status": "failed"})[0] == 200
    assert lagging.writes == ["v03_rollouts", "v03_status"] and lagging.reads == 1
    assert control.state.rollouts_v03[second["rollout_id"]]["status"] == "failed"


def _attempt(rid: str, aid: str, n: int, worker: str | None = None, status: str = "preparing") -> dict[str, object]:
    return {"rollout_id": rid, "attempt_id": aid, "sequence_id": n, "start_time": float(n), "end_time": None,
            "status": status, "worker_id": worker, "last_heartbeat_time": None, "metadata": None}


def _enqueued(s: ControlState, rid: str, max_attempts: int = 3) -> None:
    s.apply({"op": "v03_rollouts", "rollouts": [{"rollout_id": rid, "status": "queuing", "end_time": None, "config": {
        "max_attempts": max_attempts, "retry_condition": ["failed", "timeout"], "timeout_seconds": 60}}]})


def test_0_3_only_the_latest_attempt_moves_its_rollout_and_a_failed_one_with_attempts_left_is_requeuing() -> None:
    """Its store's rollout_status_from_attempt: status propagation for the latest attempt only; a failure its config
    retries, with attempts left, requeues an enqueued rollout (the owner of its task offers it again)."""
    s = ControlState()
    _enqueued(s, "ro-1", max_attempts=2)
    s.apply({"op": "v03_rollouts", "rollouts": [{"rollout_id": "ro-1", "status": "preparing", "attempt": _attempt("ro-1", "at-1", 1)}]})
    assert s.apply({"op": "v03_status", "rollout_id": "ro-1", "attempt_id": "latest", "status": "failed", "end_time": 2.0})[1][
        "attempt_id"] == "at-1", "latest: the rollout's latest attempt"
    assert s.rollouts_v03["ro-1"]["status"] == "requeuing" and s.rollouts_v03["ro-1"]["end_time"] is None
    s.apply({"op": "v03_rollouts", "rollouts": [{"rollout_id": "ro-1", "status": "preparing", "attempt": _attempt("ro-1", "at-2", 2)}]})
    s.apply({"op": "v03_status", "rollout_id": "ro-1", "attempt_id": "at-1", "status": "succeeded", "end_time": 3.0})
    assert s.rollouts_v03["ro-1"]["status"] == "preparing", "an older attempt's status leaves its rollout alone"
    s.apply({"op": "v03_status", "rollout_id": "ro-1", "attempt_id": "at-2", "status": "running"})
    assert s.rollouts_v03["ro-1"]["status"] == "running"
    s.apply({"op": "v03_status", "rollout_id": "ro-1", "attempt_id": "at-2", "status": "failed", "end_time": 4.0})
    assert s.rollouts_v03["ro-1"]["status"] == "failed" and s.rollouts_v03["ro-1"]["end_time"] == 4.0, "no attempts left"
    # One a start_attempt took out of the queue is not offered again: failed, whatever its config says.
    _enqueued(s, "ro-2")
    s.apply({"op": "v03_attempt", "rollout_id": "ro-2", "attempt_id": "at-3", "worker_id": None, "now": 5.0})
    s.apply({"op": "v03_status", "rollout_id": "ro-2", "attempt_id": "at-3", "status": "failed", "end_time": 6.0})
    assert s.rollouts_v03["ro-2"]["status"] == "failed"
    status, body = s.apply({"op": "v03_status", "rollout_id": "ro-2", "attempt_id": "at-9", "status": "failed"})
    assert status == 404 and s.rollouts_v03["ro-2"]["end_time"] == 6.0, "an attempt never recorded changes nothing"


def test_0_3_a_worker_is_busy_with_the_attempt_it_took_and_idle_once_it_ended() -> None:
    """Its store's _sync_worker_with_attempt and _dequeue_mark_worker_idle; a heartbeat keeps what the attempts set."""
    s = ControlState()
    _enqueued(s, "ro-1")
    s.apply({"op": "v03_rollouts", "rollouts": [{"rollout_id": "ro-1", "status": "preparing",
                                                "attempt": _attempt("ro-1", "at-1", 1, "w-1")}], "now": 10.0, "dequeue": True})
    w = s.workers["w-1"]
    assert (w["status"], w["current_rollout_id"], w["current_attempt_id"], w["last_busy_time"], w["last_dequeue_time"]) == (
        "busy", "ro-1", "at-1", 10.0, 10.0)
    s.apply({"op": "worker", "worker": {"worker_id": "w-1", "heartbeat_stats": {"cpu": 1}, "last_heartbeat_time": 11.0}})
    assert (w["status"], w["heartbeat_stats"], w["last_heartbeat_time"]) == ("busy", {"cpu": 1}, 11.0)
    s.apply({"op": "v03_status", "rollout_id": "ro-1", "attempt_id": "at-1", "status": "succeeded", "end_time": 12.0, "now": 12.0})
    assert (w["status"], w["current_rollout_id"], w["last_idle_time"]) == ("idle", None, 12.0)
    s.apply({"op": "v03_attempt", "rollout_id": "ro-1", "attempt_id": "at-2", "worker_id": "w-2", "now": 13.0})
    assert s.workers["w-2"]["status"] == "busy" and s.workers["w-2"]["current_attempt_id"] == "at-2"
    s.apply({"op": "v03_status", "rollout_id": "ro-1", "attempt_id": "at-2", "status": "timeout", "end_time": 14.0, "now": 14.0})
    assert s.workers["w-2"]["status"] == "unknown", "a timeout leaves it unknown"
    s.apply({"op": "v03_idle", "worker_id": "w-3", "now": 15.0})
    s.apply({"op": "v03_idle", "worker_id": "w-3", "now": 16.0})
    assert (s.workers["w-3"]["status"], s.workers["w-3"]["last_dequeue_time"]) == ("idle", 15.0), "marked idle once"
