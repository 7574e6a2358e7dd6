"""GRPO groups: the train rollouts of one task under one resource version. Pure.

A group's id is ``f"{task_id}@{resource_version}"`` (deterministic, so a re-delivered rollout lands
in the same group and a consumer can dedupe batches by it). Each rollout's advantage is
``(R − mean) / (std + ε)`` over the group (population std), or ``R − mean`` when not scaling by std,
and is copied to each of that rollout's transitions. A group whose rewards are all equal is marked
``zero_variance`` (its advantages are all 0), not dropped: the trainer decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schemas.models import GroupBatch, Transition
from streams.rollout import RolloutResult

ZERO_VARIANCE_STD = 1e-9


def group_id(task_id: str, resource_version: int | None) -> str:
    return f"{task_id}@{resource_version}"


def group_of(mode: str, task_id: str, resource_version: int | None) -> str:
    """The group a completed rollout joins, or ``""`` when it joins none: a ``test`` rollout, and a rollout
    that names no task (GRPO compares rollouts of one task; under the empty task every such rollout
    would share one group)."""
    return group_id(task_id, resource_version) if mode == "train" and task_id else ""


@dataclass(frozen=True)
class GroupPolicy:
    """When a group is emitted and how its advantages are scaled."""

    group_size: int = 4
    min_rollouts: int = 2
    timeout_s: float = 300.0
    scale_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if not 1 <= self.min_rollouts <= self.group_size:
            raise ValueError(f"min_rollouts must be in 1..group_size ({self.group_size}), got {self.min_rollouts}")


@dataclass(frozen=True)
class Advantages:
    values: list[float]
    mean: float
    std: float
    zero_variance: bool


def advantages(rewards: Sequence[float], scale_by_std: bool = True, eps: float = 1e-6) -> Advantages:
    """Group-relative advantages of ``rewards``."""
    if not rewards:
        return Advantages([], 0.0, 0.0, True)
    mean = math.fsum(rewards) / len(rewards)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
    zero = std < ZERO_VARIANCE_STD
    if zero:
        vals = [0.0] * len(rewards)
    elif scale_by_std:
        vals = [(r - mean) / (std + eps) for r in rewards]
    else:
        vals = [r - mean for r in rewards]
    return Advantages(vals, mean, std, zero)


def ready(n_done: int, first_ns: int, now_ns: int, policy: GroupPolicy) -> str | None:
    """``"complete"`` when group_size rollouts are done, ``"timeout"`` when the group waited
    ``timeout_s`` since its first rollout and has at least ``min_rollouts``, else ``None``."""
    if n_done >= policy.group_size:
        return "complete"
    if n_done >= policy.min_rollouts and now_ns - first_ns >= policy.timeout_s * 1e9:
        return "timeout"
    return None


def short_at_timeout(n_done: int, first_ns: int, now_ns: int, policy: GroupPolicy) -> bool:
    """Whether a group is past its timeout with fewer than ``min_rollouts``: :func:`ready` never emits it
    unless more rollouts of its task come (the usual cause: tasks published without ``group_size``, which
    defaults to 1, so the runners run each task once while the worker waits for ``group_size``)."""
    return n_done < policy.min_rollouts and now_ns - first_ns >= policy.timeout_s * 1e9


def sibling_groups(gid: str, span: int = 2) -> list[str]:
    """The same task's group ids at the ``span`` versions either side of ``gid``'s (none for a group of no version)."""
    task, _, version = gid.rpartition("@")
    if not version.lstrip("-").isdigit():
        return []
    v = int(version)
    return [group_id(task, w) for w in range(max(0, v - span), v + span + 1) if w != v]


def short_group_line(gid: str, n_done: int, waited_s: float, policy: GroupPolicy, others: int = 0,
                     split: bool = False) -> str:
    """The one line that says why such a group trains nothing, and what to set. ``split``: the same task has a
    group at a nearby version, so the task did run a group, whose rollouts were answered by two versions."""
    task = gid.rsplit("@", 1)[0]
    more = f" ({others} more groups like it since the last such line)" if others else ""
    head = (f"group {gid} (task {task!r}) has {n_done} rollout{'s' if n_done != 1 else ''} {waited_s:.0f} s after its first "
            f"and needs {policy.min_rollouts} to be emitted (group size {policy.group_size}): nothing trains on it{more}. ")
    if split:
        return head + ("The task's other rollouts were answered by another policy version (a group is one task at one "
                       "version: a version published while a task's group runs splits it). Now and then this is "
                       "expected; if most groups split, publish versions less often (--groups-per-step) or lower "
                       "--group-min-rollouts (ROLLOUTBUS_GROUP_MIN_ROLLOUTS)")
    return head + (f"Tasks published without group_size run once (Task.group_size defaults to 1): publish train tasks with "
                   f"group_size={policy.group_size} (`rolloutbus tasks --group-size {policy.group_size}`, "
                   f"Task(..., group_size={policy.group_size})), or lower this worker's --group-min-rollouts / --group-size "
                   f"(ROLLOUTBUS_GROUP_MIN_ROLLOUTS, ROLLOUTBUS_GROUP_SIZE)")


class ShortGroupWarnings:
    """At most one :func:`short_group_line` per ``every_s``: the first short group at once, then the next one
    seen after the window, counting the others met meanwhile."""

    def __init__(self, policy: GroupPolicy, every_s: float = 300.0) -> None:
        self.policy, self.every_s = policy, every_s
        self._last_ns: int | None = None
        self._others: set[str] = set()

    def note(self, gid: str, n_done: int, first_ns: int, now_ns: int, split: Callable[[], bool] | None = None) -> str | None:
        """A group still open at ``now_ns``: the line to log now, or None (not short, or said within the window).
        ``split`` (asked only when a line is due) says whether the task's group was split across versions."""
        if not short_at_timeout(n_done, first_ns, now_ns, self.policy):
            return None
        if self._last_ns is not None and now_ns - self._last_ns < self.every_s * 1e9:
            self._others.add(gid)
            return None
        self._others.discard(gid)
        line = short_group_line(gid, n_done, (now_ns - first_ns) / 1e9, self.policy, len(self._others),
                                split=bool(split and split()))
        self._last_ns, self._others = now_ns, set()
        return line


def merge(members: dict[str, RolloutResult], result: RolloutResult) -> bool:
    """Add ``result`` to ``members`` (by rollout id): a later attempt replaces an earlier one, a
    re-delivered or older attempt is ignored. Returns whether anything changed."""
    current = members.get(result.rollout_id)
    if current is not None and (current.attempt, current.finished_ns) >= (result.attempt, result.finished_ns):
        return False
    members[result.rollout_id] = result
    return True


def build_batch(members: Sequence[RolloutResult], policy: GroupPolicy, created_ns: int, complete: bool) -> GroupBatch:
    """The GroupBatch of these rollouts; also fills each step's ``advantage`` in place."""
    ordered = sorted(members, key=lambda r: r.rollout_id)
    adv = advantages([r.reward for r in ordered], policy.scale_by_std, policy.eps)
    transitions: list[Transition] = []
    for result, a in zip(ordered, adv.values, strict=True):
        for step in result.steps:
            step.advantage = a
            if step.trained:
                # Built from the validated core's own values: no re-validation of every token id.
                transitions.append(
                    Transition.model_construct(
                        rollout_id=step.rollout_id,
                        attempt_id=step.attempt_id,
                        task_id=step.task_id,
                        span_id=step.span_id,
                        turn=step.turn,
                        agent_name=step.agent_name,
                        resource_version=step.resource_version,
                        prompt_token_ids=step.prompt_token_ids,
                        response_token_ids=step.response_token_ids,
                        response_logprobs=step.response_logprobs,
                        response_mask=step.response_mask,
                        reward=step.reward,
                        return_=step.return_,
                        advantage=a,
                    )
                )
    first = ordered[0]
    return GroupBatch(
        group_id=group_id(first.task_id, first.resource_version),
        task_id=first.task_id,
        resource_version=first.resource_version,
        created_ns=created_ns,
        group_size=policy.group_size,
        complete=complete,
        zero_variance=adv.zero_variance,
        credit=first.credit,
        rollout_ids=[r.rollout_id for r in ordered],
        rewards=[r.reward for r in ordered],
        advantages=adv.values,
        transitions=transitions,
    )


__all__ = ["group_id", "group_of", "GroupPolicy", "Advantages", "advantages", "ready", "short_at_timeout", "short_group_line",
           "ShortGroupWarnings", "merge", "build_batch"]
