"""The bench workload is fixed by its spec, has the sizes the bench claims, and converts losslessly to
both sides of the comparison (our Avro span, Agent Lightning's event body). No network."""

from __future__ import annotations

import json

import pytest

from bench.workload import WorkloadSpec, generate, size_summary, to_agentlightning, to_avro
from schemas.codec import decode, encode_raw

SMALL = WorkloadSpec(seed=3, rollouts=6, spans_per_rollout=12, llm_fraction=0.4)


def test_same_spec_same_workload_and_another_seed_differs() -> None:
    a, b = generate(SMALL), generate(SMALL)
    assert a == b
    assert [encode_raw("rolloutbus.Span", to_avro(s)) for r in a for s in r] == [
        encode_raw("rolloutbus.Span", to_avro(s)) for r in b for s in r
    ]
    other = generate(WorkloadSpec(seed=4, rollouts=6, spans_per_rollout=12, llm_fraction=0.4))
    assert [s.prompt_token_ids for r in other for s in r] != [s.prompt_token_ids for r in a for s in r]


def test_rollout_i_does_not_depend_on_how_many_rollouts_are_generated() -> None:
    few = generate(WorkloadSpec(seed=3, rollouts=2, spans_per_rollout=12, llm_fraction=0.4))
    assert few == generate(SMALL)[:2]


def test_shape_and_sizes() -> None:
    rollouts = generate(SMALL)
    assert len(rollouts) == 6 and all(len(r) == 12 for r in rollouts)
    for r in rollouts:
        assert [s.sequence_id for s in r] == list(range(12))
        assert len({s.rollout_id for s in r}) == 1 and len({s.trace_id for s in r}) == 1
        assert r[0].kind == "message" and r[-1].kind == "reward"
        assert all(s.end_time_ns > s.start_time_ns for s in r)
        assert all(b.start_time_ns > a.end_time_ns for a, b in zip(r, r[1:]))
    llm = [s for r in rollouts for s in r if s.kind == "llm"]
    assert llm, "llm_fraction 0.4 over 60 middle spans must give LLM spans"
    for s in llm:
        assert len(s.prompt_token_ids) == 1000
        assert 40 <= len(s.response_token_ids) <= 60
        assert len(s.response_logprobs) == len(s.response_token_ids)
        assert all(lp <= 0 for lp in s.response_logprobs)
    summary = size_summary(rollouts)
    assert summary["spans"] == 72 == sum(summary[k] for k in ("llm", "tool", "message", "reward"))
    assert summary["prompt_tokens"] == 1000 * summary["llm"]


def test_no_llm_spans_at_fraction_zero() -> None:
    rollouts = generate(WorkloadSpec(seed=1, rollouts=3, spans_per_rollout=8, llm_fraction=0.0))
    assert size_summary(rollouts)["llm"] == 0


@pytest.mark.parametrize(
    "bad", [dict(rollouts=0), dict(spans_per_rollout=1), dict(llm_fraction=1.5), dict(prompt_tokens=0)]
)
def test_bad_spec_is_a_clear_error(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(**bad)  # type: ignore[arg-type]


def test_avro_side_round_trips_through_our_codec() -> None:
    for s in (s for r in generate(SMALL) for s in r):
        span = decode(encode_raw("rolloutbus.Span", to_avro(s)))
        assert (span.rollout_id, span.sequence_id, span.kind, span.attributes) == (
            s.rollout_id, s.sequence_id, s.kind, s.attributes)
        if s.kind == "llm":
            assert span.llm is not None
            assert span.llm.prompt_token_ids == s.prompt_token_ids
            assert span.llm.response_token_ids == s.response_token_ids
            assert span.llm.response_logprobs == pytest.approx(s.response_logprobs, abs=1e-6)
        if s.kind == "reward":
            assert span.reward is not None and span.reward.value == s.reward


def test_agentlightning_side_carries_the_same_content() -> None:
    for s in (s for r in generate(SMALL) for s in r):
        body = json.loads(json.dumps(to_agentlightning(s)))  # what goes over the wire
        data = body["data"]
        assert (data["span_id"], data["sequence_id"], data["attributes"]) == (s.span_id, s.sequence_id, s.attributes)
        if s.kind == "llm":
            assert body["event_type"] == "model_request"
            assert data["response"]["prompt_token_ids"] == s.prompt_token_ids
            choice = data["response"]["choices"][0]
            assert choice["token_ids"] == s.response_token_ids
            assert [c["logprob"] for c in choice["logprobs"]["content"]] == s.response_logprobs
        elif s.kind == "reward":
            assert body == {"event_type": "reward", "data": {**data, "value": s.reward}}
