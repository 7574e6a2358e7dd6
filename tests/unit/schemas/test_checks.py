"""check_span rejects exactly what the Span model rejects, with the field named."""

from __future__ import annotations

import math
from typing import Any

import pytest

from foundation.errors import ValidationError
from schemas import codec
from schemas.checks import check_span
from schemas.models import MAX_ATTRIBUTES, LLMCall, Reward, Span


def _span(**kw: Any) -> Span:
    base: dict[str, Any] = dict(span_id="s1", trace_id="t" * 32, rollout_id="r1", attempt_id="a1", sequence_id=1,
                                name="n", start_time_ns=1, end_time_ns=2)
    base.update(kw)
    return Span.model_construct(**base)  # unvalidated: some of these are bad on purpose


def _wire(span: Span) -> dict[str, Any]:
    """What the stream worker decodes: the Avro dict, token ids packed."""
    return codec.decode_raw(codec.encode_raw("rolloutbus.Span", codec.to_avro(span)))[1]


GOOD = [
    _span(),
    _span(sequence_id=0),
    _span(llm=LLMCall(prompt_token_ids=[0, 2**32 - 1], response_token_ids=[5], response_logprobs=[-0.25], response_mask=[1])),
    _span(reward=Reward(value=0.5, dimensions={"style": -1.0})),
    _span(attributes={f"k{i}": "v" for i in range(MAX_ATTRIBUTES)}),
]

BAD = [
    (_span(rollout_id=""), "rollout_id"),
    (_span(attempt_id=""), "attempt_id"),
    (_span(span_id=""), "span_id"),
    (_span(sequence_id=-1), "sequence_id"),
    (_span(attributes={f"k{i}": "v" for i in range(MAX_ATTRIBUTES + 1)}), "attributes"),
    (_span(resource={"big": "x" * ((1 << 20) + 1)}), "resource"),
    (_span(llm=LLMCall.model_construct(prompt_token_ids=[], response_token_ids=[1], response_logprobs=[0.5], response_mask=[])), "response_logprobs"),
    (_span(llm=LLMCall.model_construct(prompt_token_ids=[], response_token_ids=[1], response_logprobs=[math.nan], response_mask=[])), "response_logprobs"),
    (_span(reward=Reward.model_construct(value=math.inf, primary="reward", dimensions={})), "reward.value"),
    (_span(reward=Reward.model_construct(value=1.0, primary="reward", dimensions={"x": math.nan})), "reward.dimensions"),
]


@pytest.mark.parametrize("span", GOOD)
def test_good_spans_pass_both(span: Span) -> None:
    d = _wire(span)
    check_span(d)
    assert codec.from_avro("rolloutbus.Span", _wire(span)) == span  # the model agrees, and reads the span back whole


@pytest.mark.parametrize(("span", "field"), BAD)
def test_bad_spans_fail_both_naming_the_field(span: Span, field: str) -> None:
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        check_span(_wire(span))
    with pytest.raises(ValidationError):
        codec.from_avro("rolloutbus.Span", _wire(span))


def test_a_packed_field_of_a_partial_item_is_rejected() -> None:
    d = _wire(_span(llm=LLMCall(prompt_token_ids=[1, 2])))
    d["llm"]["prompt_token_ids"] = d["llm"]["prompt_token_ids"][:-1]
    with pytest.raises(ValidationError, match=r"llm\.prompt_token_ids: packed field of 7 bytes"):
        check_span(d)
