import pytest

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
