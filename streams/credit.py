"""Credit assignment: per-turn rewards + the final reward → a return per turn. Pure.

The reward vector is ``r_t`` = the intermediate reward landed on turn ``t``, with the rollout's
final reward ``R`` added to the last turn. Then:

* ``identical``  — every turn gets the whole trajectory's reward ``Σ r`` (with no intermediate
  rewards: every turn gets ``R``, the usual GRPO outcome reward).
* ``discounted`` — ``G_t = r_t + γ G_{t+1}``: γ = 1 credits each turn with everything from it on;
  γ = 0 is ``per-turn``.
* ``per-turn``   — ``G_t = r_t``: each turn only its own reward (the last turn also the outcome).
"""

from __future__ import annotations

from collections.abc import Sequence

MODES = ("identical", "discounted", "per-turn")


def reward_vector(intermediate: Sequence[float], final_reward: float) -> list[float]:
    """``r_t``: intermediate rewards with the final reward on the last turn."""
    r = [float(x) for x in intermediate]
    if r:
        r[-1] += final_reward
    return r


def returns(intermediate: Sequence[float], final_reward: float, mode: str = "identical", gamma: float = 1.0) -> list[float]:
    """A return per turn under ``mode`` (see module docstring). No turns: an empty list."""
    if mode not in MODES:
        raise ValueError(f"credit mode {mode!r} is not one of {', '.join(MODES)}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    r = reward_vector(intermediate, final_reward)
    if mode == "identical":
        total = sum(r)
        return [total] * len(r)
    if mode == "per-turn":
        return r
    out = [0.0] * len(r)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):
        acc = r[t] + gamma * acc
        out[t] = acc
    return out


__all__ = ["MODES", "reward_vector", "returns"]
