"""Agent Lightning 1.x's server API → our records (producers/ingest/agl/v1_api.py); no network."""

from __future__ import annotations

import json
from typing import Any

import pytest

from producers.ingest.agl.v1_api import (
    check_depth,
    check_list_query,
    check_rollout_creates,
    check_rollout_patch,
    finished_from_patch,
    llm_upstream,
    models_reply,
    new_rollout,
    policy_version,
    task_from_create,
    task_id_of,
)
from producers.ingest.agl.claims import ClaimBook, Limits, limits_of
from producers.mapping import MappingError
from schemas.codec import decode, encode
from schemas.models import SPANS_UNKNOWN, ResourceVersion, RolloutEvent, Task

# What its trainer's rollout manager posts (RolloutCreate.model_dump(mode="json", exclude_none=True)), 1.0.2.
CREATE = [{"input": {"question": "2+2?", "answer": "4"}, "is_train": True, "rollout_id": "ro-a",
           "config": {"timeout_seconds": 600, "local": {"agent_class": "pkg.mod:Agent", "env_map": {"Q": "input.question"}}},
           "metadata": {}}]


def roundtrip(ev: RolloutEvent) -> RolloutEvent:
    back = decode(encode(ev))  # the real codec and its checks
    assert isinstance(back, RolloutEvent)
    return back


def task_roundtrip(task: Task) -> Task:
    back = decode(encode(task))  # what the queue reads back from rb.tasks
    assert isinstance(back, Task)
    return back


def test_a_created_rollout_is_queuing_as_its_server_answers_and_a_task_on_rb_tasks() -> None:
    (req,) = check_rollout_creates(CREATE)
    rollout = new_rollout(req, "ro-a", now=100.0)
    assert rollout["status"] == {"state": "queuing", "k8s_job_name": None, "last_attempt_id": None, "error_message": None,
                                 "version": 1, "created_at": 100.0, "updated_at": 100.0}
    assert rollout["config"] == {"timeout_seconds": 600, "k8s": None,
                                 "local": {"agent_class": "pkg.mod:Agent", "env_map": {"Q": "input.question"}}}
    assert rollout["metadata"] == {"batch_idx": None, "sample_idx_in_batch": None}
    task = task_roundtrip(task_from_create(rollout, resource_version=3, now_ns=7))
    assert (task.task_id, task.mode, task.group_size, task.resource_version) == (task_id_of(CREATE[0]["input"]), "train", 1, 3)
    assert task.task_id.startswith("agl1-")
    # One attempt, never retried (its states are final), claimed a little longer than its controller waits.
    assert limits_of(task, Limits(2, 600.0)) == Limits(1, 630.0, ())


def test_defaults_are_its_own_and_a_val_rollout_is_not_trained() -> None:
    (req,) = check_rollout_creates([{"input": "just text", "is_train": False}])
    rollout = new_rollout(req, "ro-b", now=1.0)
    assert rollout["config"] == {"timeout_seconds": 3600, "local": None, "k8s": None}
    assert req["rollout_id"] is None  # the route makes one, as its server does
    task = task_roundtrip(task_from_create(rollout, resource_version=None, now_ns=1))
    assert task.mode == "val" and json.loads(task.input) == "just text"


def test_the_rollouts_of_one_sample_are_one_task_so_one_group() -> None:
    a, b = {"q": "x", "n": [1, 2]}, {"n": [1, 2], "q": "x"}
    assert task_id_of(a) == task_id_of(b) != task_id_of({"q": "y", "n": [1, 2]})
    assert task_id_of({"data_id": "d-7", "q": "x"}) == "d-7"
    assert task_id_of({"instance_id": 12}) == "12"


def test_its_metadata_is_kept_for_the_started_event() -> None:
    (req,) = check_rollout_creates([{"input": 1, "metadata": {"batch_idx": 2, "tag": {"a": 1}}}])
    rollout = new_rollout(req, "ro-c", now=1.0)
    task = task_roundtrip(task_from_create(rollout, resource_version=None, now_ns=1))
    assert task.metadata["agentlightning.metadata.batch_idx"] == "2"  # the queue's STARTED carries these
    assert json.loads(task.metadata["agentlightning.metadata.tag"]) == {"a": 1}


def queued(*rids: str, book: ClaimBook | None = None) -> ClaimBook:
    """A replica's book with the tasks of 1.x rollouts (and one of 0.3's queue) read from rb.tasks."""
    book = book or ClaimBook(600.0)
    for i, rid in enumerate(rids):
        (req,) = check_rollout_creates([{"input": {"data_id": "s-1"}, "rollout_id": rid}])
        book.add(0, i, task_from_create(new_rollout(req, rid, now=float(i)), resource_version=1, now_ns=i), now=0.0)
    book.add(0, len(rids), Task(task_id="t-03", input="{}", metadata={"agl.rollout_id": "ro-03"}), now=0.0)
    return book


def test_a_replica_offers_its_controllers_rollouts_and_running_is_the_claim() -> None:
    book = queued("ro-1", "ro-2", "ro-3")
    offered = [(s.rollout_id, s.task) for s in book.offered_slots(agl1=True)]
    assert [rid for rid, _ in offered] == ["ro-1", "ro-2", "ro-3"], "0.3's rollouts are not its controllers'"
    claim = book.take(None, now=5.0, rollout_id="ro-2", attempt_id="0", agl1=True)
    assert claim is not None and claim.attempt_id == "0" and claim.deadline == 5.0 + 3600 + 30
    assert book.take(None, now=5.0, rollout_id="ro-2", attempt_id="0", agl1=True) is None, "one live claim per rollout"
    assert [s.rollout_id for s in book.offered_slots(agl1=True)] == ["ro-1", "ro-3"], "a claimed one is not offered"
    # 0.3's dequeue hands out its own only; the claim of a 1.x rollout ends by rollout and attempt "0".
    taken = book.take("w", now=6.0)
    assert taken is not None and taken.slot.rollout_id == "ro-03"
    assert book.claim_of("0", "ro-2") is claim
    assert book.end(claim, "failed") is False, "never retried"
    assert [s.rollout_id for s in book.offered_slots(agl1=True)] == ["ro-1", "ro-3"]


@pytest.mark.parametrize("states, limit, reason", [
    ([], None, "state_in is required"),
    (["queued"], None, "not one of"),
    (["queuing"], "ten", "not an integer"),
])
def test_a_list_query_that_is_not_its_own_says_why(states: list[str], limit: str | None, reason: str) -> None:
    with pytest.raises(MappingError, match=reason):
        check_list_query(states, limit)


def test_a_list_query_has_its_defaults() -> None:
    assert check_list_query(["queuing", "running", "queuing"], None) == (("queuing", "running"), 500)
    assert check_list_query(["succeeded"], "50") == (("succeeded",), 50)


@pytest.mark.parametrize("body, reason", [
    ({"input": 1}, "JSON list"),
    ([1], "item 0 is not a JSON object"),
    ([{"is_train": True}], "item 0 has no input"),
    ([{"input": 1, "is_train": "yes"}], "is_train"),
    ([{"input": 1, "metadata": []}], "metadata"),
    ([{"input": 1, "rollout_id": 5}], "rollout_id"),
    ([{"input": 1, "rollout_id": "a/b"}], "without '/'"),
    ([{"input": 1, "config": {"timeout_seconds": "soon"}}], "timeout_seconds"),
    ([{"input": 1, "config": {"local": {"env_map": {"A": 1}}}}], "env_map"),
])
def test_a_body_that_is_not_a_create_request_says_why(body: Any, reason: str) -> None:
    with pytest.raises(MappingError, match=reason):
        check_rollout_creates(body)


@pytest.mark.parametrize("state, status", [("succeeded", "succeeded"), ("failed", "failed")])
def test_a_terminal_patch_is_the_finished_event_with_no_reward_of_its_own(state: str, status: str) -> None:
    # What its local controller sends: RolloutPatch(status=...).model_dump(mode="json", exclude_unset=True).
    patch = check_rollout_patch({"status": {"state": state, "last_attempt_id": "0"}})
    ev = finished_from_patch("ro-a", patch, now_ns=9)
    assert ev is not None
    ev = roundtrip(ev)
    assert (ev.rollout_id, ev.attempt_id, ev.event, ev.status, ev.final_reward, ev.task_id) == ("ro-a", "0", "FINISHED", status, None, "")
    assert ev.metadata[SPANS_UNKNOWN] == "1", "the span stage waits its finish grace for events on their way"


def test_a_failed_patch_keeps_its_error_and_an_attempt_id_it_names() -> None:
    patch = check_rollout_patch({"status": {"state": "failed", "error_message": "subprocess exited with code 1",
                                            "last_attempt_id": "at-9"}})
    ev = finished_from_patch("ro-a", patch, now_ns=9)
    assert ev is not None and ev.attempt_id == "at-9" and ev.error == "subprocess exited with code 1"


@pytest.mark.parametrize("body", [None, {}, {"status": None}, {"status": {"state": "running", "last_attempt_id": "0"}},
                                  {"status": {"state": "queuing"}}])
def test_progress_publishes_nothing(body: Any) -> None:
    assert finished_from_patch("ro-a", check_rollout_patch(body), now_ns=1) is None


@pytest.mark.parametrize("body, reason", [
    ([], "JSON object"),
    ({"status": "succeeded"}, "status must be a JSON object"),
    ({"status": {"state": "done"}}, "not one of"),
    ({"status": {"state": "succeeded", "reward": 1.0}}, "cannot patch"),  # its RolloutStatusPatch forbids extras
    ({"status": {"error_message": 3}}, "error_message"),
    ({"status": {"last_attempt_id": ""}}, "last_attempt_id"),
])
def test_a_body_that_is_not_a_patch_says_why(body: Any, reason: str) -> None:
    with pytest.raises(MappingError, match=reason):
        check_rollout_patch(body)


def rv(name: str, version: int, kind: str = "model", **config: str) -> ResourceVersion:
    return ResourceVersion(name=name, version=version, kind=kind, uri=f"/ckpt/{name}-{version}", base_model="Qwen/Qwen2.5-0.5B",
                           created_ns=version, config=config)


def test_models_are_the_model_versions_latest_first_in_its_model_shape() -> None:
    current = {"policy": rv("policy", 4, endpoint="http://proxy:8081", model="policy"), "ref": rv("ref", 1),
               "prompt": rv("prompt", 9, kind="prompt_template", template="{q}")}
    assert models_reply(current) == [{"model": "policy", "endpoint": "http://proxy:8081", "version": 4},
                                     {"model": "Qwen/Qwen2.5-0.5B", "endpoint": "/ckpt/ref-1", "version": 1}]
    assert models_reply({}) == []
    assert policy_version(current) == 4 and policy_version(None) is None and policy_version({}, "policy") is None


def test_its_agents_llm_calls_go_to_the_proxy_route_of_their_attempt() -> None:
    current = {"policy": rv("policy", 4, endpoint="http://proxy:8788/v1"), "ref": rv("ref", 9, endpoint="http://other:1")}
    assert llm_upstream(current, "policy", "ro-1", "0", "chat/completions") == \
        "http://proxy:8788/rollout/ro-1/attempt/0/v1/chat/completions"
    assert llm_upstream({"ref": rv("ref", 9, endpoint="http://other:1/")}, "policy", "ro-1", "0", "completions") == \
        "http://other:1/rollout/ro-1/attempt/0/v1/completions", "no policy: the newest model that names an endpoint"
    assert llm_upstream({"policy": rv("policy", 4)}, "policy", "ro-1", "0", "completions") is None
    assert llm_upstream(None, "policy", "ro-1", "0", "completions") is None


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    deep: Any = 1
    for _ in range(65):
        deep = [deep]
    with pytest.raises(MappingError, match="nested deeper than 64"):
        check_depth(deep)
    check_depth([[{"a": [1]}]])
