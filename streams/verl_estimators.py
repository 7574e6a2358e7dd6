"""verl's outcome advantage estimators (``verl.trainer.ppo.core_algos``) as this stream worker's, under
``verl:<name>`` (``rolloutbus process --advantage-estimator verl:grpo``; ``GRPO(advantage_estimator="verl:rloo")``).
Imported by :data:`streams.grouping.ESTIMATORS` the first time such a name is asked for; verl is installed by
``make setup`` (``deploy/python/verl-core.txt``, without its dependency pins).

verl sees one score per row and a group index. Here each step of a rollout is a row, its score the step's return
under the credit mode, every row of the group under one index: Agent Lightning's own layout for verl (each LLM
call a sample, the trajectory's reward on each). So with several steps per rollout a rollout weighs by its
steps (the built-in ``grpo`` weighs rollouts alike), and verl's ``grpo`` divides by the sample std (n − 1; the
built-in, like :func:`streams.grouping.advantages`, by the population std): on one-step rollouts the two differ
by the factor √((n − 1) / n) and nothing else (``tests/unit/streams/test_verl_estimators.py``).

Registered: the estimators whose inputs are rewards, a mask and the group index (grpo, grpo_vectorized, rloo,
rloo_vectorized, opo, reinforce_plus_plus_baseline, gpg). Not: gae (a value model), remax (a greedy baseline
rollout), reinforce_plus_plus (discounted over tokens), grpo_passk and gdpo (inputs this batch does not carry).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from streams.grouping import ESTIMATORS, ZERO_VARIANCE_STD, Estimator, GroupAdvantages, GroupPolicy

NAMES = ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "reinforce_plus_plus_baseline", "gpg")


def rows_advantages(name: str, scores: list[float], policy: GroupPolicy) -> list[float]:
    """verl's estimator ``name`` over ``scores``, one group (one index), one token per row."""
    fn = core_algos.get_adv_estimator_fn(name)
    rewards = torch.tensor(scores, dtype=torch.float32).unsqueeze(-1)
    kwargs = {"token_level_rewards": rewards, "response_mask": torch.ones_like(rewards),
              "index": np.zeros(len(scores), dtype=object), "epsilon": policy.eps}
    if name in ("grpo", "grpo_vectorized"):
        kwargs["norm_adv_by_std_in_grpo"] = policy.scale_by_std
    advantages, _ = fn(**kwargs)
    return [float(a) for a in advantages[:, 0].tolist()]


def _estimator(name: str) -> Estimator:
    def estimate(returns: list[list[float]], policy: GroupPolicy) -> GroupAdvantages:
        if not returns:
            return GroupAdvantages([], [], 0.0, 0.0, True)
        flat = [g for steps in returns for g in steps]
        mean = math.fsum(flat) / len(flat)
        std = math.sqrt(math.fsum((g - mean) ** 2 for g in flat) / len(flat))
        if std < ZERO_VARIANCE_STD:
            return GroupAdvantages([[0.0] * len(p) for p in returns], [0.0] * len(returns), mean, std, True)
        rows = iter(rows_advantages(name, flat, policy))
        steps = [[next(rows) for _ in p] for p in returns]
        return GroupAdvantages(steps, [math.fsum(s) / len(s) for s in steps], mean, std, False)

    estimate.__doc__ = f"verl's {name} (core_algos), each step a row of one group"
    return estimate


for _name in NAMES:
    ESTIMATORS.register(f"verl:{_name}")(_estimator(_name))

__all__ = ["NAMES", "rows_advantages"]
