"""Agent Lightning 1.x events → our spans, as plain functions (no network)."""

from __future__ import annotations

from typing import Any

import pytest

from producers.ingest.agl.v1_events import attempt_trace_id, event_to_span
from producers.mapping import MappingError
from producers.transport import SPAN
from schemas.codec import encode_raw, unpack_floats, unpack_tokens


def _span(event: Any) -> dict[str, Any]:
    span = event_to_span("ro", "at", event, sequence_id=1, span_id="ab" * 8, time_ns=2_000_000_000)
    encode_raw(SPAN, span)  # always a valid Avro span
    return span


CHAT = {"id": "c1", "model": "m", "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": "stop",
                     "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]}}]}
COMPLETION = {"id": "t1", "choices": [{"index": 0, "prompt_token_ids": [1, 2], "token_ids": [5, 6],
                                       "logprobs": {"token_logprobs": [-0.5, -0.25]}}]}
CHUNKS = [{"id": "s1", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "token_ids": [5]}]},
          {"id": "s1", "choices": [{"index": 0, "token_ids": [6], "finish_reason": "stop"}]}]


@pytest.mark.parametrize(("response", "logprobs", "request_id"), [
    (CHAT, [-0.5, -0.25], "c1"),          # chat: prompt ids at the top level
    (COMPLETION, [-0.5, -0.25], "t1"),    # completions: prompt ids on the choice
    (CHUNKS, [], "s1"),                   # legacy: the raw SSE chunks
])
def test_model_request_is_an_llm_span_with_its_token_ids(response: Any, logprobs: list[float], request_id: str) -> None:
    span = _span({"event_type": "model_request", "data": {"model_version": 3, "latency_ms": 500, "response": response}})
    llm = span["llm"]
    assert span["kind"] == "llm" and span["start_time_ns"] == 1_500_000_000 and span["end_time_ns"] == 2_000_000_000
    assert unpack_tokens(llm["prompt_token_ids"]) == [1, 2] and unpack_tokens(llm["response_token_ids"]) == [5, 6]
    assert unpack_floats(llm["response_logprobs"]) == logprobs
    assert llm["resource_version"] == 3 and llm["request_id"] == request_id


def test_failed_model_request_is_an_error_span() -> None:
    span = _span({"event_type": "model_request", "data": {"http_status": 429, "status": "error",
                                                          "response": {"error": {"message": "rate limited"}}}})
    assert span["status_code"] == "ERROR" and "rate limited" in span["status_message"]


def test_reward_and_user_defined_events() -> None:
    reward = _span({"event_type": "reward", "data": {"value": 0.5, "source": "agent"}})
    assert reward["kind"] == "reward" and reward["reward"] == {"value": 0.5, "primary": "reward", "dimensions": {"reward": 0.5}}
    assert reward["attributes"]["agentlightning.reward.source"] == "agent"
    other = _span({"event_type": "agent_output", "data": {"patch": "diff"}})
    assert other["kind"] == "object" and other["attributes"]["agentlightning.object.json"] == '{"patch": "diff"}'
    assert other["trace_id"] == reward["trace_id"] == attempt_trace_id("ro", "at"), "one trace per attempt"


@pytest.mark.parametrize(("event", "reason"), [
    ([], "JSON object"),
    ({"data": {}}, "event_type"),
    ({"event_type": "x", "data": [1]}, "must be a JSON object"),
    ({"event_type": "reward", "data": {"value": "high"}}, "finite number"),
    ({"event_type": "reward", "data": {}}, "finite number"),
    ({"event_type": "model_request", "data": {"response": {"choices": [{"token_ids": [-1]}]}}}, "token ids"),
])
def test_bad_events_say_why(event: Any, reason: str) -> None:
    with pytest.raises(MappingError, match=reason):
        _span(event)


@pytest.mark.parametrize("prompt", [None, [], [[1]], ["1"], [True], [1.0], "bad-ids", {"token": 1}, [-1]])
def test_a_model_request_with_unusable_prompt_ids_is_kept_without_them(prompt: Any) -> None:
    # Agent Lightning 1.0.2's server keeps such a request (it only skips deduplicating it by prompt).
    span = _span({"event_type": "model_request", "data": {"response": {"prompt_token_ids": prompt,
                                                                        "choices": [{"token_ids": [7]}]}}})
    assert unpack_tokens(span["llm"]["prompt_token_ids"]) == [] and unpack_tokens(span["llm"]["response_token_ids"]) == [7]


@pytest.mark.parametrize("data", [
    {"latency_ms": 10**400}, {"latency_ms": 1e305}, {"latency_ms": 5e12},  # before the epoch: not used
    {"model_version": 1e400}, {"model_version": float("nan")}, {"model_version": "v3"},
])
def test_numbers_out_of_range_in_a_model_request_are_left_out(data: dict[str, Any]) -> None:
    span = _span({"event_type": "model_request", "data": data})
    assert span["start_time_ns"] == span["end_time_ns"] == 2_000_000_000 and span["llm"]["resource_version"] is None


@pytest.mark.parametrize("response", [
    {"choices": {"": None}}, {"choices": 5}, {"choices": "abc"}, {"choices": [3]},
    [{"choices": {"0": {}}}], [{"choices": 7}], [5, "x"],
])
def test_choices_of_another_shape_give_a_span_without_response_ids(response: Any) -> None:
    span = _span({"event_type": "model_request", "data": {"response": response}})
    assert span["llm"]["response_token_ids"] == b""


@pytest.mark.parametrize("value", [10**400, float("inf"), float("nan"), True])
def test_a_reward_that_is_not_a_finite_number_says_why(value: Any) -> None:
    with pytest.raises(MappingError, match="finite number"):
        _span({"event_type": "reward", "data": {"value": value}})
