import json
from dataclasses import replace
from pathlib import Path

import pytest

from schemas.models import SpanEvent
from streams.assembly import assemble
from streams.rewards import RewardRules, assign, intermediate_rewards, signals
from streams.transitions import extract_transitions
from tests.unit.streams.spans import llm, reward, span, tool

RULES_DIR = Path(__file__).resolve().parents[3] / "deploy" / "rewards"
AIR = RewardRules.load(RULES_DIR / "air.toml")  # the automatic rules at their former defaults


def _rewards(spans, rules=AIR, final=None):
    traj = assemble(spans)
    steps = extract_transitions(traj, "t")
    return intermediate_rewards(traj, steps, rules, final)


def test_by_default_only_the_agents_own_rewards_are_intermediate() -> None:
    """Every automatic rule is off by default (measured: none beat the final reward alone); an explicit
    emit_reward before the last one still counts, and air.toml restores the former defaults."""
    spans = [llm(1), tool(2, ok=False), span(3, kind="exception"), reward(4, 0.25), llm(5),
             span(6, kind="validator", attributes={"validator.verdict": "pass"})]
    assert _rewards(spans, RewardRules(), final=1.0) == pytest.approx([0.25, 0.0])
    assert _rewards(spans, AIR, final=1.0) == pytest.approx([-0.1 - 0.2 + 0.25, 0.1])
    assert _rewards(spans, RewardRules.load(RULES_DIR / "final-only.toml"), final=1.0) == [0.0, 0.0]


def test_tool_failure_lands_on_the_llm_turn_that_called_it():
    assert _rewards([llm(1), tool(2, ok=False), llm(3), tool(4, ok=True)]) == pytest.approx([-0.1, 0.0])


def test_exception_validator_and_explicit_rewards():
    spans = [
        llm(1),
        span(2, kind="exception"),
        llm(3),
        span(4, kind="validator", attributes={"validator.verdict": "pass"}),
        reward(5, 0.25),
        llm(6),
        span(7, kind="validator", status_code="ERROR"),
        span(8, events=[SpanEvent(name="exception", time_ns=1)]),
    ]
    # the agent reported its own final reward: the reward span is an intermediate one
    assert _rewards(spans, final=1.0) == pytest.approx([-0.2, 0.1 + 0.25, -0.1 - 0.2])


def test_final_reward_span_is_not_counted_twice():
    spans = [llm(1), reward(2, 0.3), llm(3), reward(4, 1.0)]
    assert _rewards(spans, final=1.0) == pytest.approx([0.3, 0.0])
    # a different final reward: the last reward span was a genuine intermediate one
    assert _rewards(spans, final=0.0) == pytest.approx([0.3, 1.0])


def test_signals_before_the_first_turn_are_unassigned():
    traj = assemble([tool(1, ok=False), llm(2)])
    steps = extract_transitions(traj, "t")
    rewards, unassigned = assign(steps, signals(traj, AIR))
    assert rewards == [0.0] and [s.rule for s in unassigned] == ["tool_failed"]


def test_rules_are_configurable_and_zero_turns_a_rule_off(tmp_path):
    toml = tmp_path / "r.toml"
    toml.write_text("[rewards]\ntool_failed = -1.0\nexception = 0\nintermediate_cap = 0\n")
    rules = RewardRules.load(toml)
    assert _rewards([llm(1), tool(2, ok=False), span(3, kind="exception")], rules) == [-1.0]
    js = tmp_path / "r.json"
    js.write_text(json.dumps({"explicit_scale": 2}))
    assert _rewards([llm(1), reward(2, 0.5)], RewardRules.load(js), final=0.0) == [1.0]


def test_the_cap_keeps_the_final_reward_dominant() -> None:
    """Six failed calls at -0.1 each (-0.6) are scaled to the cap of 0.5 together, each keeping its share; an
    explicit emit_reward is not scaled (the agent chose its size)."""
    spans = [llm(1), tool(2, ok=False), tool(3, ok=False), llm(4), tool(5, ok=False), tool(6, ok=False), tool(7, ok=False),
             tool(8, ok=False), reward(9, 0.25)]
    got = _rewards(spans, AIR, final=1.0)
    assert got == pytest.approx([-0.5 * 2 / 6, -0.5 * 4 / 6 + 0.25])
    assert _rewards(spans, replace(AIR, intermediate_cap=0.0), final=1.0) == pytest.approx([-0.2, -0.4 + 0.25])


def test_a_tool_call_that_recovers_from_a_failed_one_is_its_own_signal() -> None:
    """The SQL agent's rewrite that fixes a failing query: failed call, then a successful call of the same tool."""
    rules = RewardRules(tool_failed=-0.1, tool_succeeded=0.05, tool_recovered=0.2)
    spans = [llm(1), tool(2, ok=False), llm(3), tool(4, ok=True), llm(5), tool(6, ok=True)]
    assert _rewards(spans, rules) == pytest.approx([-0.1, 0.05 + 0.2, 0.05])


def test_the_demos_rule_files_load() -> None:
    calc, sql = RewardRules.load(RULES_DIR / "calc.toml"), RewardRules.load(RULES_DIR / "sql.toml")
    assert calc.tool_failed < 0 and sql.tool_recovered > 0 and sql.intermediate_cap <= 0.5


@pytest.mark.parametrize(
    "content, match",
    [('{"tool_fail": 1}', "unknown reward rule"), ('{"exception": "x"}', "finite number"), ("{", "not valid json")],
)
def test_bad_rules_file_says_what_is_wrong(tmp_path, content, match):
    p = tmp_path / "r.json"
    p.write_text(content)
    with pytest.raises(ValueError, match=match):
        RewardRules.load(p)


# --------------------------------------------------------------------------- the final reward


def test_without_a_reported_final_reward_the_last_reward_span_is_it():
    from streams.rewards import find_final_reward

    traj = assemble([llm(1), reward(2, 0.3), llm(3), reward(4, 0.7), llm(5)])
    fin = find_final_reward(traj, None)
    assert (fin.value, fin.span_id, fin.from_span) == (0.7, "r1-a1-4", True)
    # ... counted once: not also an intermediate reward (the 0.3 before it still is)
    assert _rewards(traj.spans, final=None) == pytest.approx([0.3, 0.0, 0.0])
    assert find_final_reward(assemble([llm(1)]), None).value is None


def test_a_mid_run_reward_that_is_the_reported_final_reward_counts_once():
    # emit_reward(1.0) before a last LLM call, and the agent reports 1.0: one reward, not two
    spans = [llm(1), reward(2, 1.0), llm(3)]
    assert _rewards(spans, final=1.0) == pytest.approx([0.0, 0.0])
    assert _rewards(spans, final=0.5) == pytest.approx([1.0, 0.0])  # the agent said otherwise: an intermediate one


def test_the_last_reward_span_is_last_by_sequence_id_not_by_arrival():
    from streams.rewards import find_final_reward

    traj = assemble([reward(4, 0.9), llm(1), reward(2, 0.1)])
    assert find_final_reward(traj, None).value == 0.9
