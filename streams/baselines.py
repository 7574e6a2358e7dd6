"""Baselines for rollouts that no task replays: production traffic, rewarded once, often late. Pure.

GRPO compares ``group_size`` rollouts of one task; a production agent serves each request once. These
estimators give such a rollout an advantage without a replay (docs/architecture.md, "Training on task-less traffic",
says which to use when):

* :func:`prompt_key_advantages` — rollouts that share a *prompt key* (the same user request or template
  seen more than once) form a group, and GRPO's group-relative advantage applies to it unchanged
  (Shao et al. 2024, DeepSeekMath, §4.1.2);
* :class:`LeaveOneOutBaseline` — a per-agent running baseline: a rollout's advantage is its reward minus
  the mean of the last ``window`` rewards of the same agent, itself left out (RLOO: Kool et al. 2019,
  "Buy 4 REINFORCE samples, get a baseline for free"; Ahmadian et al. 2024, "Back to basics"). Over a
  window rather than a group: the others are earlier rollouts of the same agent, not replays;

The off-policy correction of a rollout served by an older version lives in the trainer's loss (the
``decoupled`` policy loss of :mod:`trainer.grpo`: a truncated importance weight per token).
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from foundation.registry import Registry
from streams.grouping import advantages

# What the feedback stage's --feedback-baseline takes: each entry names the running window a rollout's reward is
# compared with, from its feedback topic partition, its agent and its prompt key — ``(table entry, window key)``, the
# window kept in the stage's table under that entry — or None: no baseline, the advantage is the reward. A new
# baseline is one function here (or in a plugin module, ROLLOUTBUS_PLUGINS) under @FEEDBACK_BASELINES.register("name").
Window = Callable[[int, str, str], "tuple[str, str] | None"]
FEEDBACK_BASELINES: Registry[Window] = Registry("feedback baseline")


@FEEDBACK_BASELINES.register("none")
def no_baseline(partition: int, agent: str, prompt: str) -> tuple[str, str] | None:
    """the advantage is the feedback's reward"""
    return None


@FEEDBACK_BASELINES.register("loo")
def agent_window(partition: int, agent: str, prompt: str) -> tuple[str, str] | None:
    """the reward minus the agent's running leave-one-out mean (its last feedback rewards in the partition)"""
    return f"\x1fbaseline\x1f{partition}", agent  # not a rollout id (ids are printable)


@FEEDBACK_BASELINES.register("prompt")
def prompt_window(partition: int, agent: str, prompt: str) -> tuple[str, str] | None:
    """the reward minus the running mean of the earlier feedback on the same prompt (its prompt key)"""
    return f"\x1fprompt\x1f{partition}\x1f{prompt}", prompt  # an entry per key, as small as one rollout's


def prompt_key(steps: Sequence[Mapping[str, object]]) -> str:
    """A rollout's prompt key: a digest of its first turn's prompt token ids (the same user request, or the
    same template filled alike, gives the same key); "" when it has no step."""
    if not steps:
        return ""
    ids = steps[0].get("prompt_token_ids") or []
    return hashlib.blake2b(",".join(str(int(i)) for i in ids).encode(), digest_size=12).hexdigest()  # type: ignore[union-attr]


def prompt_key_advantages(rollouts: Iterable[tuple[str, str, float]], *, scale_by_std: bool = True, eps: float = 1e-6,
                          min_size: int = 2) -> dict[str, float]:
    """``(rollout_id, prompt_key, reward)`` → each rollout's advantage within the group of its prompt key.

    A key seen fewer than ``min_size`` times carries no comparison: its rollouts are left out (not given 0,
    which would train them as "average")."""
    groups: dict[str, list[tuple[str, float]]] = {}
    for rid, key, reward in rollouts:
        groups.setdefault(key, []).append((rid, reward))
    out: dict[str, float] = {}
    for members in groups.values():
        if len(members) < min_size:
            continue
        members.sort()
        adv = advantages([r for _, r in members], scale_by_std, eps)
        out.update((rid, a) for (rid, _), a in zip(members, adv.values))
    return out


@dataclass
class LeaveOneOutBaseline:
    """Per-key (per agent) running leave-one-out baseline over the last ``window`` rewards."""

    window: int = 64
    history: dict[str, deque[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")

    def baseline(self, key: str) -> float | None:
        """The mean of ``key``'s last ``window`` rewards (None: none seen yet)."""
        seen = self.history.get(key)
        return math.fsum(seen) / len(seen) if seen else None

    def advantage(self, key: str, reward: float) -> float:
        """``reward`` minus the baseline of the rewards before it (0 for the first: no baseline, no signal);
        then ``reward`` joins the window."""
        b = self.baseline(key)
        seen = self.history.setdefault(key, deque(maxlen=self.window))
        seen.append(reward)
        return 0.0 if b is None else reward - b

    def state(self) -> dict[str, list[float]]:
        """The windows as plain lists (for a table entry)."""
        return {k: list(v) for k, v in self.history.items()}

    @classmethod
    def from_state(cls, state: Mapping[str, Sequence[float]], window: int) -> LeaveOneOutBaseline:
        return cls(window, {k: deque(v, maxlen=window) for k, v in state.items()})


def leave_one_out(rewards: Sequence[float]) -> list[float]:
    """RLOO within a set: ``r_i − mean(r_j, j ≠ i)``; one reward alone gets 0."""
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    total = math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


__all__ = ["FEEDBACK_BASELINES", "LeaveOneOutBaseline", "leave_one_out", "prompt_key", "prompt_key_advantages"]
