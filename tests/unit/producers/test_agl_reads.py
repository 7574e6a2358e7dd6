"""The reads of Agent Lightning's store API shaped from ClickHouse rows (producers/ingest/agl/v0_3_store.py), no I/O."""

from __future__ import annotations

import pytest

from producers.ingest.agl.v0_3_store import check_query, filter_rollouts, filter_spans, page, rollouts_from_rows, span_to_agl
from producers.mapping import MappingError


def row(rid: str, aid: str, attempt: int, status: str, reward: float | None = None, worker: str | None = None) -> dict:
    return {"rollout_id": rid, "attempt_id": aid, "task_id": "t", "mode": "train", "attempt": attempt, "status": status,
            "final_reward": reward, "started_ns": attempt * 10**9, "finished_ns": (attempt + 1) * 10**9,
            "metadata": {"agentlightning.worker_id": worker} if worker else {}}


def test_a_rollout_is_its_latest_attempt() -> None:
    [ro] = rollouts_from_rows([row("ro-1", "at-1", 1, "timed_out"), row("ro-1", "at-2", 2, "succeeded", 0.5, "Worker-0")])
    assert ro["status"] == "succeeded" and ro["start_time"] == 1.0 and ro["end_time"] == 3.0 and ro["input"] is None
    assert ro["metadata"] == {"task_id": "t", "final_reward": 0.5}
    assert ro["attempt"] == {"rollout_id": "ro-1", "attempt_id": "at-2", "sequence_id": 2, "start_time": 2.0, "end_time": 3.0,
                             "status": "succeeded", "worker_id": "Worker-0", "last_heartbeat_time": 3.0,
                             "metadata": {"agentlightning.worker_id": "Worker-0"}}


@pytest.mark.parametrize("status, attempt, rollout", [
    ("succeeded", "succeeded", "succeeded"), ("finished", "succeeded", "succeeded"), ("failed", "failed", "failed"),
    ("timeout", "timeout", "failed"), ("timed_out", "timeout", "failed"), ("cancelled", "failed", "failed"),
])
def test_statuses_map_onto_its_own(status: str, attempt: str, rollout: str) -> None:
    [ro] = rollouts_from_rows([row("ro-1", "at-1", 1, status)])
    assert (ro["attempt"]["status"], ro["status"]) == (attempt, rollout)


def test_filters_and_pages_as_its_store_does() -> None:
    items = rollouts_from_rows([row("ro-a", "1", 1, "succeeded"), row("ro-b", "2", 1, "failed"), row("ro-c", "3", 1, "succeeded")])
    assert [i["rollout_id"] for i in filter_rollouts(items, status_in=["succeeded"])] == ["ro-a", "ro-c"]
    both = filter_rollouts(items, status_in=["failed"], rollout_id_in=["ro-a"], filter_logic="or")
    assert [i["rollout_id"] for i in both] == ["ro-a", "ro-b"]
    assert filter_rollouts(items, status_in=["failed"], rollout_id_in=["ro-a"]) == []
    p = page(items, sort_by="rollout_id", sort_order="desc", limit=2, offset=0)
    assert [i["rollout_id"] for i in p["items"]] == ["ro-c", "ro-b"] and (p["limit"], p["offset"], p["total"]) == (2, 0, 3)
    assert page(items, sort_by=None, limit=-1, offset=2)["items"] == items[2:]
    with pytest.raises(MappingError, match="sort by 'nope'"):
        page(items, sort_by="nope")


def test_a_stored_span_is_its_span() -> None:
    stored = {"rollout_id": "ro-1", "attempt_id": "at-1", "sequence_id": 2, "trace_id": "ab", "span_id": "cd",
              "parent_id": "ef", "name": "openai.chat.completion", "status_code": "ok", "status_message": None,
              "attributes": {"k": "v"}, "events": [("e", 1_500_000_000, {"a": "b"})], "resource": {"service.name": "x"},
              "start_time_ns": 10**9, "end_time_ns": 2 * 10**9}
    span = span_to_agl(stored)
    assert span["status"] == {"status_code": "OK", "description": None} and span["sequence_id"] == 2
    assert span["events"] == [{"name": "e", "timestamp": 1.5, "attributes": {"a": "b"}}]
    assert span["parent"] == {"trace_id": "ab", "span_id": "ef", "is_remote": False, "trace_state": {}}
    assert span["resource"] == {"attributes": {"service.name": "x"}, "schema_url": ""}
    assert filter_spans([span], {"name_contains": "chat"}) == [span]
    assert filter_spans([span], {"name": "x", "span_id": "cd", "filter_logic": "or"}) == [span]
    assert filter_spans([span], {"name": "x", "span_id": "cd"}) == []


@pytest.mark.parametrize("query, reason", [
    ([], "JSON object"), ({"limit": "5"}, "limit"), ({"limit": True}, "limit"), ({"status_in": "succeeded"}, "status_in"),
    ({"rollout_id_in": [1]}, "rollout_id_in"), ({"sort_order": "up"}, "sort_order"), ({"filter_logic": "xor"}, "filter_logic"),
    ({"name_contains": 3}, "name_contains"),
])
def test_a_bad_query_says_which_field(query: object, reason: str) -> None:
    with pytest.raises(MappingError, match=reason):
        check_query(query)


def test_a_good_query_drops_its_nulls() -> None:
    assert check_query({"rollout_id": "ro-1", "attempt_id": None, "limit": -1, "status_in": ["failed"]}) == {
        "rollout_id": "ro-1", "limit": -1, "status_in": ["failed"]}
