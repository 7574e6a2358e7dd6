"""GRPO groups: the train rollouts of one task under one resource version. Pure.

A group's id is ``f"{task_id}@{resource_version}"`` (deterministic, so a re-delivered rollout lands
in the same group and a consumer can dedupe batches by it).

Each step's advantage comes from its return under the credit mode (:mod:`streams.credit`: the final reward,
the intermediate rewards the rules landed on the steps, or both) through the group's advantage estimator,
registered in :data:`ESTIMATORS` (``@ESTIMATORS.register("name")``; the stream worker's ``--advantage-estimator``).
Built in:

* ``grpo`` — ``(G_t − μ) / (σ + ε)`` (``G_t − μ`` without std scaling), where μ and σ are the mean and the
  population std over the group's steps with **each rollout weighted equally** (a rollout's steps share its
  weight; a rollout without steps counts with its final reward). With ``identical`` credit and no
  intermediate rewards every step of a rollout has ``G = R``, and this is GRPO's ``(R − mean) / (std + ε)``
  bit for bit (:func:`advantages`). Why this normalisation: rollouts of one task take different paths, so
  turn ``t`` of one is rarely comparable with turn ``t`` of another (normalising per turn index, as some
  multi-turn trainers do, compares unrelated states and leaves late turns with groups of one); GiGPO's
  anchor-state groups need environment states that repeat exactly, which free-text tool calls rarely do;
  equal rollout weights keep a long trajectory from setting the baseline of a short one.
* ``rloo`` — ``G_t`` minus the mean of the *other* rollouts' mean returns (leave-one-out; no std scaling).

A group whose returns are all equal is marked ``zero_variance`` (its advantages are all 0), not dropped:
the trainer decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from foundation.registry import Registry
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
    estimator: str = "grpo"  # a name in ESTIMATORS

    def __post_init__(self) -> None:
        ESTIMATORS.check(self.estimator)
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


@dataclass(frozen=True)
class GroupAdvantages:
    """An estimator's answer for one group: each rollout's steps' advantages, each rollout's own (its mean
    return's: ``GroupBatch.advantages``), the baseline and scale used, and whether the group teaches nothing."""

    steps: list[list[float]]
    rollouts: list[float]
    mean: float
    std: float
    zero_variance: bool


Estimator = Callable[[list[list[float]], GroupPolicy], GroupAdvantages]
ESTIMATORS: Registry[Estimator] = Registry("advantage estimator", providers={"verl:": "streams.verl_estimators"})


def _mean_of(points: Sequence[float]) -> float:
    """A rollout's mean return; exactly its value when all its steps share one (no rounding of ``n·R / n``)."""
    first = points[0]
    return first if all(p == first for p in points) else math.fsum(points) / len(points)


def _spread_of(points: Sequence[float], mean: float) -> float:
    """A rollout's mean squared distance from ``mean`` (as :func:`advantages` computes it for one value)."""
    first = points[0]
    return (first - mean) ** 2 if all(p == first for p in points) else math.fsum((p - mean) ** 2 for p in points) / len(points)


@ESTIMATORS.register("grpo")
def grpo_estimator(returns: list[list[float]], policy: GroupPolicy) -> GroupAdvantages:
    """(G_t − μ) / (σ + ε) over the group's steps, each rollout weighted equally (GRPO's with outcome rewards)"""
    if not returns:
        return GroupAdvantages([], [], 0.0, 0.0, True)
    means = [_mean_of(p) for p in returns]
    mean = math.fsum(means) / len(means)
    std = math.sqrt(math.fsum(_spread_of(p, mean) for p in returns) / len(returns))
    zero = std < ZERO_VARIANCE_STD

    def adv(g: float) -> float:
        if zero:
            return 0.0
        return (g - mean) / (std + policy.eps) if policy.scale_by_std else g - mean

    return GroupAdvantages([[adv(g) for g in p] for p in returns], [adv(m) for m in means], mean, std, zero)


@ESTIMATORS.register("rloo")
def rloo_estimator(returns: list[list[float]], policy: GroupPolicy) -> GroupAdvantages:
    """G_t minus the mean of the other rollouts' mean returns (leave-one-out, no std scaling)"""
    base = grpo_estimator(returns, policy)
    n = len(returns)
    if n < 2 or base.zero_variance:
        return GroupAdvantages([[0.0] * len(p) for p in returns], [0.0] * n, base.mean, base.std, True)
    means = [_mean_of(p) for p in returns]
    total = math.fsum(means)
    others = [(total - m) / (n - 1) for m in means]
    return GroupAdvantages([[g - o for g in p] for p, o in zip(returns, others)], [m - o for m, o in zip(means, others)],
                           base.mean, base.std, False)


def step_returns(result: RolloutResult) -> list[float]:
    """What a rollout brings to its group's estimator: its steps' returns under the credit mode, or, without a
    step (it failed before its first LLM call, say), its final reward."""
    return [float(s.return_) for s in result.steps] if result.steps else [result.reward]


def group_advantages(members: Sequence[RolloutResult], policy: GroupPolicy) -> GroupAdvantages:
    """The estimator's advantages of ``members`` (ordered by rollout id, as the batch lists them)."""
    ordered = sorted(members, key=lambda r: r.rollout_id)
    out = ESTIMATORS.get(policy.estimator)([step_returns(r) for r in ordered], policy)
    if len(out.steps) != len(ordered) or any(len(a) != len(step_returns(r)) for a, r in zip(out.steps, ordered)):
        raise ValueError(f"advantage estimator {policy.estimator!r} did not give one advantage per step")
    return out


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
    """The GroupBatch of these rollouts; also fills each step's ``advantage`` in place (the estimator's, from
    the step's return)."""
    ordered = sorted(members, key=lambda r: r.rollout_id)
    adv = group_advantages(ordered, policy)
    transitions: list[Transition] = []
    for result, step_adv in zip(ordered, adv.steps, strict=True):
        for step, a in zip(result.steps, step_adv):
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
        advantages=adv.rollouts,
        transitions=transitions,
    )


__all__ = ["group_id", "group_of", "GroupPolicy", "Advantages", "advantages", "ESTIMATORS", "GroupAdvantages",
           "group_advantages", "grpo_estimator", "rloo_estimator", "step_returns", "ready", "short_at_timeout", "short_group_line",
           "ShortGroupWarnings", "merge", "build_batch"]
