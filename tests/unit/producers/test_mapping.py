"""OTel attributes → our Span: GenAI conventions and Agent Lightning's names."""

from __future__ import annotations

from typing import Any

import pytest

from producers.mapping import Attribution, MappingError, otel_to_span
from schemas.codec import decode, encode_raw, unpack_floats, unpack_tokens

AL = {"agentlightning.rollout_id": "ro-1", "agentlightning.attempt_id": "at-1", "agentlightning.span_sequence_id": 4}


def _map(attrs: dict[str, Any], **kw: Any) -> dict[str, Any]:
    span = otel_to_span(name=kw.pop("name", "s"), span_id="00" * 8, trace_id="11" * 16, parent_id=None,
                        start_ns=1, end_ns=2, attributes=attrs, **kw)
    decode(encode_raw("rolloutbus.Span", span))  # fits the schema and the validators
    return span


@pytest.mark.parametrize(
    "attrs, kind",
    [
        ({**AL, "agentlightning.reward.0.name": "r", "agentlightning.reward.0.value": 1.0}, "reward"),
        ({**AL, "gen_ai.request.model": "m", "prompt_token_ids": [1], "response_token_ids": [2]}, "llm"),
        ({**AL, "gen_ai.tool.name": "calc"}, "tool"),
        ({**AL, "exception.type": "ValueError"}, "exception"),
        ({**AL, "agentlightning.message.body": "hi"}, "message"),
        ({**AL, "agentlightning.object.json": "{}"}, "object"),
        ({**AL, "anything": 1}, "span"),
        ({**AL, "rolloutbus.kind": "state"}, "state"),
    ],
)
def test_kind_is_inferred(attrs: dict[str, Any], kind: str) -> None:
    assert _map(attrs)["kind"] == kind


def test_agent_lightning_llm_span() -> None:
    s = _map({**AL, "gen_ai.response.model": "qwen", "prompt_token_ids": (1, 2, 3), "response_token_ids": "[9, 8]",
              "response_logprobs": [-0.5, -0.25], "gen_ai.response.finish_reasons": ("stop",), "gen_ai.response.id": "c1"})
    llm = s["llm"]
    assert unpack_tokens(llm["prompt_token_ids"]) == [1, 2, 3] and unpack_tokens(llm["response_token_ids"]) == [9, 8]
    assert unpack_floats(llm["response_logprobs"]) == [-0.5, -0.25]
    assert (llm["model"], llm["finish_reason"], llm["request_id"]) == ("qwen", "stop", "c1")
    assert "prompt_token_ids" not in s["attributes"], "token ids are first-class, not repeated as attributes"
    assert (s["rollout_id"], s["attempt_id"], s["sequence_id"]) == ("ro-1", "at-1", 4)


def test_multi_dimensional_reward_primary_is_the_first() -> None:
    s = _map({**AL, "agentlightning.reward.0.name": "task", "agentlightning.reward.0.value": 0.5,
              "agentlightning.reward.1.name": "fmt", "agentlightning.reward.1.value": "1"})
    assert s["reward"] == {"value": 0.5, "primary": "task", "dimensions": {"task": 0.5, "fmt": 1.0}}


def test_attribution_fills_what_attributes_do_not_say() -> None:
    s = _map({"x": True}, attribution=Attribution("ro-2", "at-2", 7, agent_name="a"))
    assert (s["rollout_id"], s["sequence_id"], s["agent_name"], s["attributes"]["x"]) == ("ro-2", 7, "a", "true")


@pytest.mark.parametrize(
    "attrs, reason",
    [
        ({"x": 1}, "names no rollout"),
        ({**AL, "agentlightning.span_sequence_id": "abc"}, "not an integer"),
        ({**AL, "prompt_token_ids": [-1]}, "outside"),
        ({**AL, "agentlightning.reward.0.name": "r", "agentlightning.reward.0.value": "nan"}, "non-finite"),
    ],
)
def test_bad_spans_are_refused_with_a_reason(attrs: dict[str, Any], reason: str) -> None:
    with pytest.raises(MappingError, match=reason):
        _map(attrs)


def test_the_proxy_keeps_the_prompt_as_text_cut_to_its_latest_turns() -> None:
    from producers.ingest.llm_proxy import prompt_text

    body = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+2?"}]},
                         {"role": "assistant", "content": None}]}
    assert prompt_text(body, chat=True) == "system: Be brief.\nuser: What is 2+2?\nassistant: "
    assert prompt_text({"prompt": "Q: 1+1\nA:"}, chat=False) == "Q: 1+1\nA:"
    assert prompt_text({"prompt": [1, 2, 3]}, chat=False) == "[1, 2, 3]"
    long = prompt_text({"messages": [{"role": "user", "content": "x" * 50 + "THE END"}]}, chat=True, limit=20)
    assert len(long) == 20 and long.startswith("…") and long.endswith("THE END")
