"""The task-less baselines against references worked out by hand."""

from __future__ import annotations


import pytest

from streams.baselines import LeaveOneOutBaseline, leave_one_out, prompt_key_advantages


def test_prompt_key_groups_are_grpo_groups_and_a_lone_key_is_left_out() -> None:
    got = prompt_key_advantages([("a", "k1", 1.0), ("b", "k1", 0.0), ("c", "k2", 5.0), ("d", "k3", 2.0), ("e", "k3", 2.0)],
                                scale_by_std=False)
    # k1: mean 0.5 → +0.5, -0.5; k2 seen once: no comparison; k3: equal rewards → 0, 0
    assert got == {"a": 0.5, "b": -0.5, "d": 0.0, "e": 0.0}
    scaled = prompt_key_advantages([("a", "k", 3.0), ("b", "k", 1.0)], eps=0.0)
    assert scaled == {"a": pytest.approx(1.0), "b": pytest.approx(-1.0)}  # mean 2, population std 1


def test_running_leave_one_out_baseline_by_hand() -> None:
    loo = LeaveOneOutBaseline(window=2)
    assert loo.advantage("solver", 1.0) == 0.0  # nothing to compare with yet
    assert loo.advantage("solver", 0.0) == -1.0  # 0 − mean(1)
    assert loo.advantage("solver", 1.0) == 0.5  # 1 − mean(1, 0)
    assert loo.advantage("solver", 1.0) == 0.5  # the window is 2: 1 − mean(0, 1)
    assert loo.advantage("judge", 3.0) == 0.0  # per agent
    again = LeaveOneOutBaseline.from_state(loo.state(), 2)
    assert again.advantage("solver", 0.0) == -1.0  # 0 − mean(1, 1): the state survives a round trip
    with pytest.raises(ValueError):
        LeaveOneOutBaseline(window=0)


def test_leave_one_out_within_a_set() -> None:
    assert leave_one_out([1.0, 0.0, 0.0, 1.0]) == [pytest.approx(x) for x in (1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3)]
    assert leave_one_out([4.0]) == [0.0]


