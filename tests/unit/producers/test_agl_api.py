"""Agent Lightning 1.x's server API → our records (producers/agl_api.py); no network."""

from __future__ import annotations

import json
from typing import Any

import pytest

from producers.agl_api import (
    check_depth,
    check_rollout_creates,
    check_rollout_patch,
    finished_from_patch,
    models_reply,
    new_rollout,
    patched_rollout,
    policy_version,
    started_from_create,
    task_id_of,
)
from producers.mapping import MappingError
from schemas.codec import decode, encode
from schemas.models import SPANS_UNKNOWN, ResourceVersion, RolloutEvent

# What its trainer's rollout manager posts (RolloutCreate.model_dump(mode="json", exclude_none=True)), 1.0.2.
CREATE = [{"input": {"question": "2+2?", "answer": "4"}, "is_train": True, "rollout_id": "ro-a",
           "config": {"timeout_seconds": 600, "local": {"agent_class": "pkg.mod:Agent", "env_map": {"Q": "input.question"}}},
           "metadata": {}}]


def roundtrip(ev: RolloutEvent) -> RolloutEvent:
    back = decode(encode(ev))  # the real codec and its checks
    assert isinstance(back, RolloutEvent)
    return back


def test_a_created_rollout_is_queuing_as_its_server_answers_and_its_attempt_0_is_started() -> None:
    (req,) = check_rollout_creates(CREATE)
    rollout = new_rollout(req, "ro-a", now=100.0)
    assert rollout["status"] == {"state": "queuing", "k8s_job_name": None, "last_attempt_id": None, "error_message": None,
                                 "version": 1, "created_at": 100.0, "updated_at": 100.0}
    assert rollout["config"] == {"timeout_seconds": 600, "k8s": None,
                                 "local": {"agent_class": "pkg.mod:Agent", "env_map": {"Q": "input.question"}}}
    assert rollout["metadata"] == {"batch_idx": None, "sample_idx_in_batch": None}
    ev = roundtrip(started_from_create(rollout, resource_version=3, now_ns=7))
    assert (ev.rollout_id, ev.attempt_id, ev.event, ev.mode, ev.attempt, ev.resource_version) == ("ro-a", "0", "STARTED", "train", 1, 3)
    assert ev.task_id == task_id_of(CREATE[0]["input"]) and ev.task_id.startswith("agl1-")


def test_defaults_are_its_own_and_a_val_rollout_is_not_trained() -> None:
    (req,) = check_rollout_creates([{"input": "just text", "is_train": False}])
    rollout = new_rollout(req, "ro-b", now=1.0)
    assert rollout["config"] == {"timeout_seconds": 3600, "local": None, "k8s": None}
    assert req["rollout_id"] is None  # the route makes one, as its server does
    assert roundtrip(started_from_create(rollout, resource_version=None, now_ns=1)).mode == "val"


def test_the_rollouts_of_one_sample_are_one_task_so_one_group() -> None:
    a, b = {"q": "x", "n": [1, 2]}, {"n": [1, 2], "q": "x"}
    assert task_id_of(a) == task_id_of(b) != task_id_of({"q": "y", "n": [1, 2]})
    assert task_id_of({"data_id": "d-7", "q": "x"}) == "d-7"
    assert task_id_of({"instance_id": 12}) == "12"


def test_its_metadata_is_kept_on_the_started_event() -> None:
    (req,) = check_rollout_creates([{"input": 1, "metadata": {"batch_idx": 2, "tag": {"a": 1}}}])
    ev = roundtrip(started_from_create(new_rollout(req, "ro-c", now=1.0), resource_version=None, now_ns=1))
    assert ev.metadata["agentlightning.metadata.batch_idx"] == "2"
    assert json.loads(ev.metadata["agentlightning.metadata.tag"]) == {"a": 1}


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


def test_the_patch_reply_is_a_rollout_with_the_patched_status() -> None:
    reply = patched_rollout("ro-a", {"state": "succeeded", "last_attempt_id": "0"}, now=5.0)
    assert reply["rollout_id"] == "ro-a" and reply["status"]["state"] == "succeeded"
    assert reply["status"]["last_attempt_id"] == "0" and reply["status"]["updated_at"] == 5.0


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


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    deep: Any = 1
    for _ in range(65):
        deep = [deep]
    with pytest.raises(MappingError, match="nested deeper than 64"):
        check_depth(deep)
    check_depth([[{"a": [1]}]])
