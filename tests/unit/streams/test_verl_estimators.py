"""verl's advantage estimators through the stream worker's registry (``verl:<name>``): verl's own numbers, each step a
row of one group; on one-step rollouts verl's grpo is the built-in grpo but for the std's n − 1; the stream worker's
CLI takes the names. verl is installed by ``make setup``."""

from __future__ import annotations

import math
import random

import pytest

from tests.installs import installed
from streams.grouping import ESTIMATORS, GroupPolicy

installed("verl.trainer.ppo.core_algos", "make verl-core (make setup installs it)")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from streams import verl_estimators  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402


@pytest.mark.parametrize("name", verl_estimators.NAMES)
def test_each_estimator_gives_verls_numbers_step_by_step(name: str) -> None:
    rng = random.Random(name)
    returns = [[rng.choice([0.0, 0.3, 1.0]) for _ in range(rng.randint(1, 3))] for _ in range(4)]
    returns[0][0] = 2.0  # never all equal
    flat = [g for steps in returns for g in steps]
    rewards = torch.tensor(flat).unsqueeze(-1)
    want, _ = core_algos.get_adv_estimator_fn(name)(token_level_rewards=rewards, response_mask=torch.ones_like(rewards),
                                                    index=np.zeros(len(flat), dtype=object))
    got = ESTIMATORS.get(f"verl:{name}")(returns, GroupPolicy(group_size=4, estimator=f"verl:{name}"))
    assert [a for steps in got.steps for a in steps] == pytest.approx(want[:, 0].tolist(), abs=1e-6)
    assert [len(s) for s in got.steps] == [len(r) for r in returns] and not got.zero_variance


def test_verl_grpo_on_one_step_rollouts_is_grpo_with_the_sample_std() -> None:
    returns = [[1.0], [0.0], [0.0], [1.0], [1.0]]
    policy = GroupPolicy(group_size=5)
    ours = ESTIMATORS.get("grpo")(returns, policy)
    verl = ESTIMATORS.get("verl:grpo")(returns, policy)
    n = len(returns)
    for a, b in zip(ours.rollouts, verl.rollouts):
        assert b == pytest.approx(a * math.sqrt((n - 1) / n), rel=1e-5)


def test_a_group_with_equal_returns_teaches_nothing() -> None:
    out = ESTIMATORS.get("verl:rloo")([[1.0], [1.0, 1.0]], GroupPolicy(group_size=2))
    assert out.zero_variance and out.steps == [[0.0], [0.0, 0.0]]


def test_the_stream_worker_takes_verl_names() -> None:
    import argparse

    from streams.cli import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--advantage-estimator", "verl:opo"])
    assert settings_from_args(args).advantage_estimator == "verl:opo"
    with pytest.raises(SystemExit):
        parser.parse_args(["--advantage-estimator", "verl:gae"])
