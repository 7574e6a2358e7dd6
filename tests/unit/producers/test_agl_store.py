"""Agent Lightning 0.3's LightningStore calls → our records (producers/ingest/agl/v0_3_store.py); no network."""

from __future__ import annotations

from typing import Any

import pytest

from producers.ingest.agl.v0_3_store import attempt_reply, check_attempt_update, finished_from_update, resources_update, span_from_agl
from producers.mapping import MappingError
from schemas.codec import decode, encode, encode_raw
from schemas.models import ResourceVersion, Span

# What its runner sends for a rollout that returned 0.5: Span.from_core_fields(emit_reward(0.5, propagate=False),
# ...).model_dump(mode="json"), captured from agentlightning 0.3.0.
REWARD = {"rollout_id": "ro-1", "attempt_id": "at-1", "sequence_id": 0, "trace_id": "932b80eaf7b949439da9a67c7d6bdf6d",
          "span_id": "d71aba97775a5473", "parent_id": None, "name": "agentlightning.annotation",
          "status": {"status_code": "OK", "description": None},
          "attributes": {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 0.5},
          "events": [], "links": [], "start_time": 1795471492.221811, "end_time": 1795471492.221811,
          "context": {"trace_id": "932b80eaf7b949439da9a67c7d6bdf6d", "span_id": "d71aba97775a5473", "is_remote": False,
                      "trace_state": {}},
          "parent": None, "resource": {"attributes": {}, "schema_url": ""}}


def roundtrip(d: dict[str, Any]) -> Span:
    rec = decode(encode_raw("rolloutbus.Span", d))  # the real codec and its checks
    assert isinstance(rec, Span)
    return rec


def test_its_reward_span_is_a_reward_span_left_for_the_stream_to_number() -> None:
    s = roundtrip(span_from_agl(REWARD, now_ns=1))
    assert (s.rollout_id, s.attempt_id, s.sequence_id, s.kind) == ("ro-1", "at-1", 0, "reward")
    assert s.reward is not None and s.reward.value == 0.5
    assert (s.span_id, s.trace_id, s.status_code) == ("d71aba97775a5473", "932b80eaf7b949439da9a67c7d6bdf6d", "OK")
    assert s.start_time_ns == int(1795471492.221811 * 1e9)


def test_an_llm_span_keeps_its_token_ids_and_its_own_ids_win() -> None:
    body = {**REWARD, "name": "openai.chat.completion", "sequence_id": 7, "parent_id": "aa" * 8,
            "attributes": {"gen_ai.request.model": "m", "prompt_token_ids": [1, 2], "response_token_ids": [3],
                           "agentlightning.rollout_id": "elsewhere"},
            "events": [{"name": "exception", "attributes": {"exception.type": "E"}, "timestamp": 1.5}],
            "resource": {"attributes": {"service.name": "agent", "agentlightning.attempt_id": "other"}, "schema_url": ""},
            "start_time": None, "end_time": None}
    s = roundtrip(span_from_agl(body, now_ns=42))
    assert (s.rollout_id, s.attempt_id, s.sequence_id, s.kind, s.parent_id) == ("ro-1", "at-1", 7, "llm", "aa" * 8)
    assert s.llm is not None and (list(s.llm.prompt_token_ids), list(s.llm.response_token_ids)) == ([1, 2], [3])
    assert (s.start_time_ns, s.end_time_ns, s.resource) == (42, 42, {"service.name": "agent"})
    assert s.events[0].time_ns == 1_500_000_000


@pytest.mark.parametrize("change, reason", [
    ({"rollout_id": ""}, "rollout_id"),
    ({"sequence_id": -1}, "sequence_id"),
    ({"sequence_id": True}, "sequence_id"),
    ({"span_id": None}, "span_id"),
    ({"start_time": "noon"}, "start_time"),
    ({"attributes": [1]}, "attributes"),
    ({"attributes": {"agentlightning.reward.0.value": "x"}}, "not a number"),
])
def test_a_body_that_is_not_a_span_says_why(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(MappingError, match=reason):
        span_from_agl({**REWARD, **change}, now_ns=1)
    with pytest.raises(MappingError):
        span_from_agl([REWARD], now_ns=1)


def test_a_terminal_update_is_finished_without_reward_and_without_a_span_count() -> None:
    body = check_attempt_update({"status": "succeeded", "worker_id": "w-1"})
    ev = finished_from_update("ro-1", "at-1", body, now_ns=9)
    assert ev is not None and (ev.event.value, ev.status, ev.final_reward, ev.span_count, ev.task_id) == (
        "FINISHED", "succeeded", None, 0, "")
    assert ev.metadata == {"rolloutbus.spans_unknown": "1", "agentlightning.worker_id": "w-1"}
    assert finished_from_update("ro-1", "at-1", {"status": "timeout"}, now_ns=9).status == "timeout"  # type: ignore[union-attr]
    for progress in ({"status": "running"}, {"status": "unresponsive"}, {"last_heartbeat_time": 5.0}, {}):
        assert finished_from_update("ro-1", "at-1", check_attempt_update(progress), now_ns=9) is None
    reply = attempt_reply("ro-1", "at-1", body, now=3.0)
    assert (reply["status"], reply["end_time"], reply["worker_id"]) == ("succeeded", 3.0, "w-1")
    for bad in ("done", [], {}, 3):
        with pytest.raises(MappingError, match="status"):
            check_attempt_update({"status": bad})


def test_resources_are_its_resources_update() -> None:
    assert resources_update({}) is None
    current = {
        "policy": ResourceVersion(name="policy", version=3, kind="model", uri="/ckpt/3", base_model="tiny", created_ns=2 * 10**9,
                                  config={"endpoint": "http://proxy:8788/v1"}),
        "prompt": ResourceVersion(name="prompt", version=1, kind="prompt_template", created_ns=10**9,
                                  config={"template": "Q: {question}"}),
        "cfg": ResourceVersion(name="cfg", version=9, kind="config", created_ns=10**9),
    }
    up = resources_update(current)
    assert up is not None and up["resources_id"] == "policy=3,prompt=1" and up["version"] == 3 and up["create_time"] == 2.0
    assert up["resources"] == {
        "policy": {"resource_type": "proxy_llm", "endpoint": "http://proxy:8788/v1", "model": "tiny", "sampling_parameters": {}},
        "prompt": {"resource_type": "prompt_template", "template": "Q: {question}", "engine": "f-string"},
    }


def test_add_resources_is_the_next_version_of_each_name_and_reads_back_as_given() -> None:
    from producers.ingest.agl.v0_3_store import versions_from_agl
    from producers.ingest.resources import newest

    current = {"policy": ResourceVersion(name="policy", version=3, kind="model", uri="/ckpt/3", base_model="tiny", step=30,
                                         created_ns=1, config={"endpoint": "http://proxy:8788/v1"})}
    # What its client posts: TypeAdapter(NamedResources).dump_python(...), agentlightning 0.3.0.
    body = {"policy": {"resource_type": "proxy_llm", "endpoint": "http://vllm:8000/v1", "model": "tiny-2", "api_key": None,
                       "sampling_parameters": {"temperature": 0.7}},
            "judge": {"resource_type": "llm", "endpoint": "http://judge/v1", "model": "big", "api_key": "k",
                      "sampling_parameters": {}},
            "prompt": {"resource_type": "prompt_template", "template": "Q: {q}", "engine": "jinja"}}
    versions = versions_from_agl(body, current, now_ns=5 * 10**9)
    assert [(v.name, v.version, v.kind) for v in versions] == [("policy", 4, "model"), ("judge", 1, "model"),
                                                             ("prompt", 1, "prompt_template")]
    policy = versions[0]
    assert (policy.uri, policy.base_model, policy.step) == ("/ckpt/3", "tiny", 30), "its checkpoint is kept"
    up = resources_update(newest(current, versions))
    assert up is not None and up["resources_id"] == "judge=1,policy=4,prompt=1" and up["version"] == 4
    no_key = {k: v for k, v in body["policy"].items() if k != "api_key"}  # a null api_key is not stored (its default)
    assert up["resources"] == {**body, "policy": no_key}
    for rv in versions:  # through the real codec
        assert decode(encode(rv)) == rv


@pytest.mark.parametrize("body, reason", [
    ({}, "no resources"),
    ([], "JSON object"),
    ({"m": {"resource_type": "tool"}}, "resource_type 'tool'"),
    ({"m": {"resource_type": "llm", "endpoint": 1, "model": "x"}}, "string endpoint"),
    ({"m": {"resource_type": "llm", "endpoint": "e", "model": "x", "sampling_parameters": [1]}}, "sampling_parameters"),
    ({"p": {"resource_type": "prompt_template", "template": "t"}}, "engine"),
    ({"p": 3}, "resource 'p'"),
])
def test_resources_that_are_not_its_types_say_why(body: Any, reason: str) -> None:
    from producers.ingest.agl.v0_3_store import versions_from_agl

    with pytest.raises(MappingError, match=reason):
        versions_from_agl(body, {}, now_ns=1)


def test_a_wait_answers_the_finished_ones_in_the_order_asked_as_rollouts() -> None:
    from producers.ingest.agl.v0_3_store import WAIT_CAP_S, check_wait, finished_rollouts

    items = [{"rollout_id": "a", "status": "succeeded", "attempt": {}}, {"rollout_id": "b", "status": "running", "attempt": {}},
             {"rollout_id": "c", "status": "failed", "attempt": {}}]
    assert finished_rollouts(items, ["c", "x", "b", "a"]) == [{"rollout_id": "c", "status": "failed"},
                                                            {"rollout_id": "a", "status": "succeeded"}]
    assert check_wait({"rollout_ids": ["a"], "timeout": 0.1}) == (["a"], 0.1)
    assert check_wait({"rollout_ids": [], "timeout": None}) == ([], WAIT_CAP_S)
    assert check_wait({"rollout_ids": ["a"], "timeout": -1}) == (["a"], 0.0)
    for bad in ({"rollout_ids": "a"}, {"rollout_ids": ["a"], "timeout": "soon"}, {"rollout_ids": ["a"], "timeout": True}):
        with pytest.raises(MappingError):
            check_wait(bad)
