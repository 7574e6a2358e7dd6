from typing import Any

import pytest

from schemas.models import Span
from streams.assembly import assemble
from streams.transitions import extract_transitions
from tests.unit.streams.spans import llm, span, tool


def test_each_llm_span_becomes_a_transition_in_order():
    traj = assemble([llm(3, prompt=[7, 8], response=[9]), span(1), llm(1 + 1, response=[4, 5]), tool(4, ok=True)])
    steps = extract_transitions(traj, "task1")
    assert [(s.turn, s.sequence_id) for s in steps] == [(0, 2), (1, 3)]
    assert steps[1].prompt_token_ids == [7, 8] and steps[1].response_token_ids == [9]
    assert steps[0].response_logprobs == [-0.5, -0.5]
    assert steps[0].response_mask == [1, 1]  # empty mask on the wire = all policy tokens
    assert steps[0].resource_version == 3 and steps[0].agent_name == "solver" and steps[0].task_id == "task1"


def test_agent_match_marks_other_agents_untrained_but_keeps_them():
    traj = assemble([llm(1, agent="solver"), llm(2, agent="critic"), llm(3, agent=None)])
    steps = extract_transitions(traj, "t", agent_match="^solv")
    assert [s.trained for s in steps] == [True, False, False]
    assert all(s.trained for s in extract_transitions(traj, "t", agent_match=None))


def test_bad_agent_match_is_a_clear_error():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        extract_transitions(assemble([llm(1)]), "t", agent_match="(")


def call(seq: int, span_id: str, rid: str | None = None, **kw: Any) -> Span:
    """An LLM call's span, with response id ``rid`` (None: the instrumentation recorded none)."""
    s = llm(seq, span_id=span_id, **kw)
    assert s.llm is not None
    return s.model_copy(update={"llm": s.llm.model_copy(update={"request_id": rid})})


def test_concurrent_calls_whose_spans_end_out_of_order_come_out_in_sequence_order() -> None:
    # Two calls of one agent at once: B started after A (start 1010 > 1005) but ended first, so it was
    # exported and numbered first (seq 2). Steps follow the numbering, each with its own tokens.
    agent = span(4, span_id="agent", name="agent", agent_name="solver")
    a = call(3, "A", "resp-a", prompt=[1, 2], response=[10], parent_id="agent", start_time_ns=1005)
    b = call(2, "B", "resp-b", prompt=[1, 3], response=[20], parent_id="agent", start_time_ns=1010)
    steps = extract_transitions(assemble([a, agent, b]), "t")
    assert [(s.span_id, s.turn, s.sequence_id) for s in steps] == [("B", 0, 2), ("A", 1, 3)]
    assert [list(s.response_token_ids) for s in steps] == [[20], [10]]
    # Numbered when they started (the proxy with its sequence header): start order, by the same rule.
    a2, b2 = a.model_copy(update={"sequence_id": 2}), b.model_copy(update={"sequence_id": 3})
    assert [s.span_id for s in extract_transitions(assemble([a2, agent, b2]), "t")] == ["A", "B"]


@pytest.mark.parametrize("parent_is_llm_call", [False, True])
def test_sibling_calls_without_a_response_id_are_neither_merged_nor_dropped(parent_is_llm_call: bool) -> None:
    parent = call(9, "turn", "resp-turn") if parent_is_llm_call else span(9, span_id="turn", name="agent.turn")
    calls = [call(seq, f"c{seq}", prompt=[1, 2], response=[7], parent_id="turn") for seq in (1, 2, 3)]
    steps = extract_transitions(assemble([*calls, parent]), "t")
    if parent_is_llm_call:  # nested in a call: that call, as its adapter counts them (within_llm_call)
        assert [s.span_id for s in steps] == ["turn"]
    else:
        assert [s.span_id for s in steps] == ["c1", "c2", "c3"], "the same tokens, three calls"


def test_a_nested_span_of_one_call_is_that_call_even_when_it_was_numbered_first() -> None:
    # The instrumented client's span (no response id) inside the framework's span of the call: it ends, so it
    # is numbered, before its parent; it is still one call, the outer span's, filled in with the inner's tokens.
    inner = call(3, "inner", None, prompt=[5, 6], response=[8, 9], parent_id="outer")
    outer = call(4, "outer", "resp-1", prompt=[], response=[])
    sibling = call(5, "next", "resp-2")
    steps = extract_transitions(assemble([inner, outer, sibling]), "t")
    assert [(s.span_id, s.sequence_id, s.turn) for s in steps] == [("outer", 4, 0), ("next", 5, 1)]
    assert (list(steps[0].prompt_token_ids), list(steps[0].response_token_ids)) == ([5, 6], [8, 9])
    assert steps[0].response_mask == [1, 1]


def test_a_nested_span_with_a_response_id_of_its_own_is_its_own_call() -> None:
    outer = call(2, "outer", None)
    inner = call(1, "inner", "resp-in", parent_id="outer")
    assert [s.span_id for s in extract_transitions(assemble([inner, outer]), "t")] == ["inner", "outer"]


def test_spans_whose_parents_form_a_cycle_end_without_recursing_forever() -> None:
    a, b = call(1, "x", None, parent_id="y"), call(2, "y", None, parent_id="x")
    # One step, whatever order the spans arrive in: the earlier call, the other (its parent and its child at once)
    # folded into it as a nested span of the same response is.
    for spans in ([a, b], [b, a]):
        assert [(s.span_id, s.sequence_id, s.turn) for s in extract_transitions(assemble(spans), "t")] == [("x", 1, 0)]


def test_a_call_seen_twice_takes_its_agent_from_the_view_that_names_one() -> None:
    """The instrumentation's span of a call (no agent named) numbered before the proxy's (the agent from its
    header): one step, the proxy's agent, trained by that agent's match."""
    traj = assemble([call(1, "inst", rid="resp-1", agent=None), call(2, "proxy", rid="resp-1", agent="writer"),
                     call(3, "inst2", rid="resp-2", agent=None), call(4, "proxy2", rid="resp-2", agent="critic")])
    steps = extract_transitions(traj, "t", agent_match="^writer$")
    assert [(s.span_id, s.agent_name, s.trained) for s in steps] == [("inst", "writer", True), ("inst2", "critic", False)]
