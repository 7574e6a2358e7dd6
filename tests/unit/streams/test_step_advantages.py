"""Each step's advantage comes from its return under the credit mode, through the group's registered estimator
(:mod:`streams.grouping`): ``identical`` credit with no intermediate rewards stays GRPO bit for bit; intermediate
rewards and the other credit modes change the advantages of the steps they reach; a registered estimator and a
registered credit mode are used by name."""

from __future__ import annotations

import random

import pytest

from foundation.errors import ConfigError
from streams.credit import CREDIT, returns
from streams.grouping import ESTIMATORS, GroupAdvantages, GroupPolicy, advantages, build_batch, group_advantages
from streams.rollout import Settings, finish_attempt
from tests.unit.streams.spans import finished, llm


def _result(rid: str, final: float, turns: int = 1, inter: list[float] | None = None, credit: str = "identical",
            gamma: float = 1.0):
    """A rollout of ``turns`` trained LLM calls, its final reward ``final``, ``inter`` landed on its turns."""
    spans = [llm(i + 1, rid=rid, att=f"{rid}-1", agent="solver") for i in range(turns)]
    ev = finished(rid, f"{rid}-1", task="t", reward_=final, span_count=turns, resource_version=2, attempt=1, time_ns=10_000)
    result = finish_attempt(spans, ev, Settings(credit=credit, gamma=gamma))
    inter = inter or [0.0] * turns
    for step, r, g in zip(result.steps, inter, returns(inter, final, credit, gamma), strict=True):
        step.reward, step.return_ = r, g
    return result


def test_identical_credit_without_intermediate_rewards_is_grpo_bit_for_bit() -> None:
    rng = random.Random(7)
    for case in range(300):
        n = rng.randint(1, 8)
        finals = [rng.choice([0.0, 1.0, rng.random(), -rng.random() * 3, 1e-7 * rng.random()]) for _ in range(n)]
        turns = [rng.randint(1, 5) for _ in range(n)]
        scale = case % 2 == 0
        members = [_result(f"r{i:02d}", f, t) for i, (f, t) in enumerate(zip(finals, turns))]
        batch = build_batch(members, GroupPolicy(group_size=n, min_rollouts=1, scale_by_std=scale), 1, True)
        grpo = advantages(finals, scale)  # members are in rollout-id order already
        assert batch.advantages == grpo.values
        assert batch.zero_variance == grpo.zero_variance
        by_rollout = {r: a for r, a in zip(batch.rollout_ids, grpo.values)}
        assert [t.advantage for t in batch.transitions] == [by_rollout[t.rollout_id] for t in batch.transitions]


def test_discounted_with_gamma_one_and_no_intermediate_rewards_equals_identical() -> None:
    finals, turns = [1.0, 0.0, 0.5, 0.0], [3, 1, 2, 4]
    same = [build_batch([_result(f"r{i}", f, t, credit=mode) for i, (f, t) in enumerate(zip(finals, turns))],
                        GroupPolicy(group_size=4), 1, True) for mode in ("identical", "discounted")]
    assert [t.advantage for t in same[0].transitions] == [t.advantage for t in same[1].transitions]


def test_intermediate_rewards_reach_the_steps_they_land_on() -> None:
    """Two rollouts of two turns, both failing the task (final 0): one had a tool call that worked on its first
    turn (+0.2). Under GRPO's final reward alone the group teaches nothing; with the intermediate reward it does."""
    policy = GroupPolicy(group_size=2, scale_by_std=False)
    plain = build_batch([_result("a", 0.0, 2), _result("b", 0.0, 2)], policy, 1, True)
    assert plain.zero_variance and {t.advantage for t in plain.transitions} == {0.0}

    def advs(mode: str) -> dict[tuple[str, int], float]:
        batch = build_batch([_result("a", 0.0, 2, [0.2, 0.0], mode), _result("b", 0.0, 2, [0.0, 0.0], mode)], policy, 1, True)
        return {(t.rollout_id, t.turn): round(t.advantage, 12) for t in batch.transitions}

    # identical: each of a's steps gets its total 0.2; the group mean is 0.1 → +0.1 / -0.1 for every step
    assert advs("identical") == {("a", 0): 0.1, ("a", 1): 0.1, ("b", 0): -0.1, ("b", 1): -0.1}
    # per-turn: a's returns [0.2, 0], b's [0, 0]; the group mean (rollouts weighted alike) is 0.05
    assert advs("per-turn") == {("a", 0): 0.15, ("a", 1): -0.05, ("b", 0): -0.05, ("b", 1): -0.05}
    # discounted (gamma 1): a's returns [0.2, 0] too (the reward came on its first turn)
    assert advs("discounted") == advs("per-turn")


def test_each_rollout_weighs_alike_whatever_its_length() -> None:
    """A five-turn success and a one-turn failure: the baseline is the two rollouts' mean, not the steps' (which
    the long rollout would pull to 5/6)."""
    out = group_advantages([_result("a", 1.0, 5), _result("b", 0.0, 1)], GroupPolicy(group_size=2, scale_by_std=False))
    assert out.mean == 0.5 and out.steps == [[0.5] * 5, [-0.5]]


def test_rloo_is_registered_and_leaves_each_rollout_out_of_its_own_baseline() -> None:
    out = group_advantages([_result("a", 1.0), _result("b", 0.0), _result("c", 0.0)],
                           GroupPolicy(group_size=3, estimator="rloo"))
    assert out.rollouts == [1.0, -0.5, -0.5] and out.steps == [[1.0], [-0.5], [-0.5]]


def test_a_registered_estimator_and_credit_mode_are_used_by_name() -> None:
    @ESTIMATORS.register("sign-test")
    def sign(returns: list[list[float]], policy: GroupPolicy) -> GroupAdvantages:
        """+1 for a step with a positive return, -1 otherwise"""
        steps = [[1.0 if g > 0 else -1.0 for g in p] for p in returns]
        return GroupAdvantages(steps, [s[0] for s in steps], 0.0, 1.0, False)

    @CREDIT.register("last-only-test")
    def last_only(r: list[float], gamma: float) -> list[float]:
        """the whole reward on the last turn, nothing before"""
        return [0.0] * (len(r) - 1) + [sum(r)]

    try:
        batch = build_batch([_result("a", 1.0, 3, credit="last-only-test")], GroupPolicy(group_size=1, min_rollouts=1,
                                                                                     estimator="sign-test"), 1, True)
        assert [t.advantage for t in batch.transitions] == [-1.0, -1.0, 1.0]
        assert "sign-test" in ESTIMATORS.table() and "last-only-test" in CREDIT.names()
    finally:
        ESTIMATORS.unregister("sign-test")
        CREDIT.unregister("last-only-test")
    with pytest.raises(ConfigError, match="advantage estimator 'sign-test' is not one of: grpo, rloo"):
        GroupPolicy(estimator="sign-test")


def test_an_estimator_that_loses_a_step_is_refused() -> None:
    @ESTIMATORS.register("short-test")
    def short(returns: list[list[float]], policy: GroupPolicy) -> GroupAdvantages:
        """drops every rollout's last step"""
        return GroupAdvantages([p[:-1] for p in returns], [0.0] * len(returns), 0.0, 1.0, False)

    try:
        with pytest.raises(ValueError, match="did not give one advantage per step"):
            group_advantages([_result("a", 1.0, 2)], GroupPolicy(group_size=1, min_rollouts=1, estimator="short-test"))
    finally:
        ESTIMATORS.unregister("short-test")
