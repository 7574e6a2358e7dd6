"""Agent Lightning-style traces through our mapping and pure core: the behaviours of its adapter
(0.3.0 ``TracerTraceToTriplet`` and ``emitter/reward.py``'s ``get_reward_value``) that decide which spans
are steps and which are rewards. No network; the spans are what its tracers write."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from producers.mapping import otel_to_span
from schemas.codec import decode, encode_raw
from schemas.models import Span
from streams.assembly import assemble
from streams.rollout import Settings, finish_attempt
from streams.transitions import extract_transitions
from tests.unit.streams.spans import finished

_ids = itertools.count(1)


def al(name: str, attrs: dict[str, Any], parent: Span | None = None, seq: int | None = None, span_id: str | None = None) -> Span:
    """One span as Agent Lightning's tracer exports it (ids on the resource), through our mapping."""
    n = next(_ids)
    d = otel_to_span(
        name=name, span_id=span_id or f"{n:016x}", trace_id="ab" * 16, parent_id=parent.span_id if parent else None,
        start_ns=1000 * n, end_ns=1000 * n + 500, attributes=attrs,
        resource={"agentlightning.rollout_id": "ro", "agentlightning.attempt_id": "at",
                  "agentlightning.span_sequence_id": str(seq if seq is not None else n)},
    )
    rec = decode(encode_raw("rolloutbus.Span", d))  # the real codec and the validators
    assert isinstance(rec, Span)
    return rec


def chat(parent: Span | None = None, rid: str | None = "resp-1", prompt: list[int] | None = None,
         response: list[int] | None = None, name: str = "openai.chat.completion", **extra: Any) -> Span:
    attrs: dict[str, Any] = {"gen_ai.request.model": "m", **extra}
    if rid is not None:
        attrs["gen_ai.response.id"] = rid
    if prompt is not None:
        attrs["prompt_token_ids"] = prompt
    if response is not None:
        attrs["response_token_ids"] = response
    return al(name, attrs, parent)


def steps_of(spans: list[Span], **kw: Any) -> list[Any]:
    return extract_transitions(assemble(spans), "task", **kw)


# --------------------------------------------------------------------------- rewards, every encoding


@pytest.mark.parametrize(
    "name, attrs, value",
    [
        ("agentlightning.annotation", {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 0.5,
                                       "agentlightning.reward.1.name": "style", "agentlightning.reward.1.value": 1.0}, 0.5),
        ("op", {"agentops.task.output": '{"type": "reward", "value": 0.25}'}, 0.25),
        ("op", {"agentops.entity.output": '{"type": "reward", "value": 1.0}'}, 1.0),
        ("op", {"agentops.entity.output": '{"type": "reward", "value": null}'}, None),
        ("op", {"agentops.entity.output": '{"type": "answer", "value": 3}'}, None),
        ("agentlightning.annotation", {"reward": 0.75}, 0.75),  # 0.2's legacy annotation
        ("some.span", {"reward": 0.75}, None),  # a bare `reward` elsewhere is not one (as in get_reward_value)
    ],
)
def test_rewards_in_every_encoding_agent_lightning_reads(name: str, attrs: dict[str, Any], value: float | None) -> None:
    s = al(name, attrs)
    assert (None if s.reward is None else s.reward.value) == value
    assert (s.kind == "reward") == (value is not None)


def test_primary_reward_is_index_0() -> None:
    s = al("agentlightning.annotation", {"agentlightning.reward.0.name": "task", "agentlightning.reward.0.value": 1.0,
                                         "agentlightning.reward.1.name": "fmt", "agentlightning.reward.1.value": 0.0})
    assert s.reward is not None and (s.reward.primary, s.reward.value, s.reward.dimensions) == ("task", 1.0, {"task": 1.0, "fmt": 0.0})


# --------------------------------------------------------------------------- Weave tracer keys


def test_weave_token_ids_and_response_id_are_read() -> None:
    s = al("openai.chat.completions.create", {
        "agentlightning.operation.output.prompt_token_ids": [1, 2, 3],
        "agentlightning.operation.output.choices.0.token_ids": [9, 8],
        "agentlightning.operation.output.id": "chatcmpl-w"})
    assert s.kind == "llm" and s.llm is not None
    assert (list(s.llm.prompt_token_ids), list(s.llm.response_token_ids), s.llm.request_id) == ([1, 2, 3], [9, 8], "chatcmpl-w")
    s2 = al("openai.chat.completions.create", {"agentlightning.operation.output.response_token_ids.0": [5]})
    assert s2.llm is not None and list(s2.llm.response_token_ids) == [5]
    s3 = al("openai.chat.completions.create", {
        "agentlightning.operation.output.choices.0.provider_specific_fields.token_ids": [6]})
    assert s3.llm is not None and list(s3.llm.response_token_ids) == [6]
    assert "agentlightning.operation.output.prompt_token_ids" not in s.attributes, "token ids are first-class"


def test_plain_token_keys_win_over_weave_keys() -> None:
    s = al("openai.chat.completion", {"prompt_token_ids": [1], "agentlightning.operation.output.prompt_token_ids": [2],
                                      "response_token_ids": [3], "agentlightning.operation.output.choices.0.token_ids": [4],
                                      "gen_ai.response.id": "plain", "agentlightning.operation.output.id": "weave"})
    assert s.llm is not None
    assert (list(s.llm.prompt_token_ids), list(s.llm.response_token_ids), s.llm.request_id) == ([1], [3], "plain")


# --------------------------------------------------------------------------- which LLM spans are steps


def test_llm_call_inside_a_reward_operation_is_not_a_policy_step() -> None:
    root = al("agent.run", {})
    policy = chat(root, rid="p1", prompt=[1], response=[2])
    judge_op = al("agentlightning.operation", {"agentlightning.operation.name": "agentlightning.reward"}, root)
    judge = chat(judge_op, rid="j1", prompt=[7], response=[8])
    agentops_reward = al("reward_fn", {"agentops.entity.output": '{"type": "reward", "value": 1.0}'}, root)
    judge2 = chat(agentops_reward, rid="j2", prompt=[7], response=[9])
    spans = [root, policy, judge_op, judge, agentops_reward, judge2]
    assert [s.span_id for s in steps_of(spans)] == [policy.span_id]
    kept = steps_of(spans, exclude_llm_call_in_reward=False)
    assert [s.span_id for s in kept] == [policy.span_id, judge.span_id, judge2.span_id]


def test_one_step_per_response_id_duplicates_fill_in_token_ids() -> None:
    # The instrumentation's span (no token ids) and the proxy's span (token ids) of one call, plus a re-export.
    instr = chat(rid="c1")
    proxy = chat(rid="c1", prompt=[1, 2], response=[3])
    again = chat(rid="c1", prompt=[1, 2], response=[3])
    other = chat(rid="c2", prompt=[4], response=[5])
    steps = steps_of([instr, proxy, again, other])
    assert [(s.span_id, list(s.prompt_token_ids), list(s.response_token_ids)) for s in steps] == [
        (instr.span_id, [1, 2], [3]), (other.span_id, [4], [5])]
    assert [s.turn for s in steps] == [0, 1]


def test_nested_llm_spans_of_one_call_count_once() -> None:
    outer = chat(rid="c1", prompt=[1], response=[2])
    inner = chat(outer, rid=None, name="openai.chat.completion.raw")
    inner_new_call = chat(outer, rid="c9", prompt=[5], response=[6])  # its own response id: its own call
    assert [s.span_id for s in steps_of([outer, inner, inner_new_call])] == [outer.span_id, inner_new_call.span_id]


def test_llm_call_match_selects_span_names() -> None:
    a = chat(rid="a", prompt=[1], response=[2], name="openai.chat.completion")
    b = chat(rid="b", prompt=[1], response=[2], name="chat gpt-4o")
    assert len(steps_of([a, b])) == 2
    assert [s.span_id for s in steps_of([a, b], llm_call_match=r"openai\.chat\.completion")] == [a.span_id]
    with pytest.raises(ValueError, match="llm_call_match"):
        steps_of([a], llm_call_match="(")


@pytest.mark.parametrize(
    "agent_attrs",
    [
        {"agent.name": "planner"},  # OpenAI Agents SDK
        {"agentops.span.kind": "agent", "operation.name": "planner"},  # AgentOps @agent
        {"recipient_agent_type": "planner"},  # AutoGen
        {"langchain.chain.type": "planner"},  # LangGraph
        {"executor.id": "planner"},  # agent-framework
        {"type": "agent", "agentlightning.operation.input.name": "planner"},  # Weave
    ],
)
def test_agent_match_by_the_enclosing_agent_span(agent_attrs: dict[str, Any]) -> None:
    root = al("session", {})
    planner = al("agent", agent_attrs, root)
    step = al("step", {}, planner)
    p_call = chat(step, rid="p", prompt=[1], response=[2])
    coder = al("agent", {**{k: v for k, v in agent_attrs.items()}, **{k: "coder" for k, v in agent_attrs.items() if v == "planner"}}, root)
    c_call = chat(coder, rid="c", prompt=[3], response=[4])
    outside = chat(root, rid="o", prompt=[5], response=[6])
    steps = steps_of([root, planner, step, p_call, coder, c_call, outside], agent_match="plan")
    assert [(s.span_id, s.agent_name, s.trained) for s in steps] == [
        (p_call.span_id, "planner", True), (c_call.span_id, "coder", False), (outside.span_id, None, False)]


def test_identical_credit_gives_every_step_the_final_reward() -> None:
    root = al("agent.run", {})
    calls = [chat(root, rid=f"r{i}", prompt=[i], response=[i + 1]) for i in range(3)]
    rew = al("agentlightning.annotation", {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 1.0}, root)
    res = finish_attempt([root, *calls, rew], finished("ro", "at", reward_=1.0), Settings(credit="identical"))
    assert [(s.span_id, s.return_) for s in res.steps] == [(c.span_id, 1.0) for c in calls]


# --------------------------------------------------------------------------- the final reward: find_final_reward


REWARD_ENCODINGS = [
    ("agentlightning.annotation", lambda v: {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": v}),
    ("reward_op", lambda v: {"agentops.task.output": f'{{"type": "reward", "value": {v}}}'}),
    ("reward_op", lambda v: {"agentops.entity.output": f'{{"type": "reward", "value": {v}}}'}),
    ("agentlightning.annotation", lambda v: {"reward": v}),
]


@pytest.mark.parametrize("name, attrs", REWARD_ENCODINGS)
@pytest.mark.parametrize("with_finished", [True, False], ids=["finished-without-reward", "no-finished"])
def test_the_last_reward_span_is_the_rollouts_reward(name: str, attrs: Any, with_finished: bool) -> None:
    from streams.grouping import GroupPolicy, build_batch

    def attempt(rollout: str, first: float, last: float) -> Any:
        root = al("agent.run", {})
        spans = [root, chat(root, rid=f"{rollout}-1", prompt=[1], response=[2]), al(name, attrs(first), root),
                 chat(root, rid=f"{rollout}-2", prompt=[3], response=[4]), al(name, attrs(last), root)]
        spans = [s.model_copy(update={"rollout_id": rollout}) for s in spans]
        if with_finished:  # e.g. Agent Lightning's runner: status, no reward
            return finish_attempt(spans, finished(rollout, "at", reward_=None, status="succeeded"), Settings())
        return finish_attempt(spans, None, Settings(), rollout_id=rollout, attempt_id="at", task_id="task1")

    a, b = attempt("ro-a", 0.5, 1.0), attempt("ro-b", 0.5, 0.0)
    assert (a.final_reward, b.final_reward) == (1.0, 0.0), "find_final_reward: the last reward span"
    assert a.status == ("succeeded" if with_finished else "timed_out")
    # the first reward span is an intermediate reward on the step before it; the last one is not counted again
    assert [s.reward for s in a.steps] == [0.5, 0.0] and [s.return_ for s in a.steps] == [1.5, 1.5]
    batch = build_batch([a, b], GroupPolicy(group_size=2), created_ns=1, complete=True)
    assert batch.rewards == [1.0, 0.0] and batch.advantages == pytest.approx([1.0, -1.0], abs=1e-5)
    assert {t.rollout_id: t.advantage for t in batch.transitions} == pytest.approx({"ro-a": 1.0, "ro-b": -1.0}, abs=1e-5)


def test_a_1x_reward_event_is_the_final_reward() -> None:
    from producers.ingest.agl.v1_events import event_to_span

    def ev(seq: int, body: dict[str, Any]) -> Span:
        rec = decode(encode_raw("rolloutbus.Span", event_to_span("ro", "at", body, sequence_id=seq, span_id=f"e{seq}", time_ns=seq)))
        assert isinstance(rec, Span)
        return rec

    spans = [ev(1, {"event_type": "model_request", "data": {"response": {"id": "c1", "prompt_token_ids": [1],
                                                                          "choices": [{"token_ids": [2]}]}}}),
             ev(2, {"event_type": "reward", "data": {"value": 0.8}})]
    res = finish_attempt(spans, None, Settings(), rollout_id="ro", attempt_id="at", task_id="t")
    assert res.final_reward == 0.8 and [s.return_ for s in res.steps] == [0.8]
