"""Credit assignment: per-turn rewards + the final reward → a return per turn. Pure.

The reward vector is ``r_t`` = the intermediate reward landed on turn ``t``, with the rollout's
final reward ``R`` added to the last turn. A credit mode is a function of ``(r, gamma)`` registered in
:data:`CREDIT` (``@CREDIT.register("name")``); the stream worker's ``--credit`` takes any registered name. Built in:

* ``identical``  — every turn gets the whole trajectory's reward ``Σ r`` (with no intermediate
  rewards: every turn gets ``R``, the usual GRPO outcome reward; LightningRL's choice).
* ``discounted`` — ``G_t = r_t + γ G_{t+1}``: γ = 1 credits each turn with everything from it on;
  γ = 0 is ``per-turn``.
* ``per-turn``   — ``G_t = r_t``: each turn only its own reward (the last turn also the outcome).

The group's advantage estimator (:mod:`streams.grouping`) turns these returns into each step's advantage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from foundation.registry import Registry

CreditFn = Callable[[list[float], float], list[float]]
CREDIT: Registry[CreditFn] = Registry("credit mode")


@CREDIT.register("identical")
def identical(r: list[float], gamma: float) -> list[float]:
    """every turn gets the trajectory's whole reward (Σ of the turns' rewards and the final one)"""
    total = sum(r)
    return [total] * len(r)


@CREDIT.register("discounted")
def discounted(r: list[float], gamma: float) -> list[float]:
    """G_t = r_t + γ G_(t+1): each turn everything from it on, discounted by --gamma"""
    out = [0.0] * len(r)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):
        acc = r[t] + gamma * acc
        out[t] = acc
    return out


@CREDIT.register("per-turn")
def per_turn(r: list[float], gamma: float) -> list[float]:
    """G_t = r_t: each turn only its own reward (the last turn also the final reward)"""
    return list(r)


def reward_vector(intermediate: Sequence[float], final_reward: float) -> list[float]:
    """``r_t``: intermediate rewards with the final reward on the last turn."""
    r = [float(x) for x in intermediate]
    if r:
        r[-1] += final_reward
    return r


def returns(intermediate: Sequence[float], final_reward: float, mode: str = "identical", gamma: float = 1.0) -> list[float]:
    """A return per turn under ``mode`` (see module docstring). No turns: an empty list."""
    fn = CREDIT.get(mode)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out = fn(reward_vector(intermediate, final_reward), gamma)
    if len(out) != len(intermediate) or not all(math.isfinite(g) for g in out):
        raise ValueError(f"credit mode {mode!r} gave {len(out)} returns for {len(intermediate)} turns, or a non-finite one")
    return out


def __getattr__(name: str) -> object:
    if name == "MODES":  # the registered names, as they are now
        return tuple(CREDIT.names())
    raise AttributeError(name)


__all__ = ["CREDIT", "reward_vector", "returns"]
