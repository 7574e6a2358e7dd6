"""Late feedback: a reward for a rollout that ended earlier → its new final reward, and training once. Pure.

A :class:`~schemas.models.Feedback` names a rollout by id. :func:`verdict` decides what happens to it from
the rollout as stored (ClickHouse's ``rollouts`` row, or None) and the feedback already applied to it (the
feedback stage's table entry), in this order:

* ``feedback.unknown_rollout`` — no such rollout is stored (yet: feedback sent before the rollout's row was
  written is unknown too; the dead letter keeps it for a replay);
* **again** — this very feedback (same ``feedback_id``) was applied already: a re-delivery or a replay after
  a crash. Done again with the same rows and the same batch id (the trainer drops a batch it has seen), so
  it counts once;
* ``feedback.duplicate`` — another feedback was applied to this rollout: the first one wins;
* ``feedback.after_window`` — given more than the operator's window after the rollout finished;
* ``feedback.group_open`` — the rollout is in a GRPO group not emitted yet: the group stage writes the rollout's
  row again when it emits the group, with the reward it trains on, which would undo this one (send it again
  once the group is emitted: the dead letter keeps its bytes);
* **apply** — the rollout's final reward becomes ``value``.

Every outcome but apply/again is dead-lettered with its reason; all are counted. What was applied is kept in
the rollout's row itself (``metadata['rolloutbus.feedback_id']``, the reward before it, the advantage it
trained with), so a replay that finds the row but not the table entry redoes exactly the same thing.

Late reward spans: a span that gives a reward (any encoding :mod:`producers.mapping` reads: Agent Lightning's
``agentlightning.reward.{i}.*``, its 0.2 annotation ``reward``, AgentOps' reward output, 1.x ``reward`` events,
ours) and that the span stage reads after its attempt completed is feedback too (:func:`from_late_span`): the
span stage sends it on the feedback topic and it is decided here like any other. A reward span of an attempt
still open stays part of its trajectory (the last one is the final reward when the FINISHED names none).

Training: a train rollout that joined no GRPO group (a task-less one: production traffic) is trained once,
as a one-rollout ``GroupBatch`` with group id ``feedback:<rollout_id>`` and the advantage of the baseline
estimator (:mod:`streams.baselines`). A rollout that was in a group trained with its first reward; its
feedback updates the stored reward and is not trained again (a second gradient for one sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from schemas.models import Feedback, GroupBatch, Transition

APPLY = "apply"
AGAIN = "again"
UNKNOWN = "feedback.unknown_rollout"
DUPLICATE = "feedback.duplicate"
AFTER_WINDOW = "feedback.after_window"
GROUP_OPEN = "feedback.group_open"

FEEDBACK_ID = "rolloutbus.feedback_id"
REWARD_BEFORE = "rolloutbus.reward_before_feedback"
ADVANTAGE = "rolloutbus.feedback_advantage"
GROUP_PREFIX = "feedback:"
LATE_SPAN = "late_span"  # Feedback.source of a reward span that came after its attempt completed


@dataclass(frozen=True)
class StoredRollout:
    """The columns of a ``rollouts`` row that feedback reads (its latest attempt)."""

    row: dict[str, Any]

    @property
    def rollout_id(self) -> str:
        return str(self.row["rollout_id"])

    @property
    def finished_ns(self) -> int:
        return int(self.row["finished_ns"])

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self.row.get("metadata") or {})

    @property
    def applied(self) -> str | None:
        return self.metadata.get(FEEDBACK_ID)

    @property
    def grpo_group(self) -> str:
        """The GRPO group the rollout joined ("" for none, or its own feedback group)."""
        group = str(self.row.get("group_id") or "")
        return "" if group.startswith(GROUP_PREFIX) else group

    @property
    def trains(self) -> bool:
        """A train rollout in no GRPO group (or in its own feedback group: applied before, done again)."""
        group = str(self.row.get("group_id") or "")
        return self.row.get("mode") == "train" and (not group or group == GROUP_PREFIX + self.rollout_id)


def verdict(fb: Feedback, rollout: StoredRollout | None, applied: str | None, window_s: float,
            group_emitted: bool = True) -> str:
    """What to do with ``fb``: :data:`APPLY`, :data:`AGAIN`, or the dead-letter reason (see the module).
    ``group_emitted``: the rollout's GRPO group (if it has one) is emitted."""
    if rollout is None:
        return UNKNOWN
    first = applied or rollout.applied
    if first == fb.feedback_id:
        return AGAIN
    if first is not None:
        return DUPLICATE
    if fb.time_ns - rollout.finished_ns > window_s * 1e9:
        return AFTER_WINDOW
    if rollout.grpo_group and not group_emitted:
        return GROUP_OPEN
    return APPLY


@dataclass
class Applied:
    """The rows and the batch one applied feedback produces."""

    rollout_row: dict[str, Any]
    transition_rows: list[dict[str, Any]] = field(default_factory=list)
    batch: GroupBatch | None = None


def apply(fb: Feedback, rollout: StoredRollout, steps: list[dict[str, Any]], advantage: float) -> Applied:
    """``fb`` applied to ``rollout`` (whose ``transitions`` rows are ``steps``, by turn): the rollout's row
    with its new final reward, and — for a rollout that trains on it — its steps' rows and the batch.

    A step's return moves by the change of the final reward (exact for ``identical`` credit, where every
    step's return is the final reward plus the intermediate ones). Deterministic: done again (a replay)
    it gives the same rows, with the advantage recorded the first time."""
    meta = rollout.metadata
    again = meta.get(FEEDBACK_ID) == fb.feedback_id
    before = float(meta[REWARD_BEFORE]) if again and meta.get(REWARD_BEFORE) not in (None, "") else rollout.row.get("final_reward")
    adv = float(meta[ADVANTAGE]) if again and ADVANTAGE in meta else advantage
    # updated_ns: above the row it replaces (ReplacingMergeTree keeps the highest), the same when done again.
    updated = int(rollout.row["updated_ns"]) if again else max(int(rollout.row["updated_ns"]) + 1, fb.time_ns)
    meta.update({FEEDBACK_ID: fb.feedback_id, REWARD_BEFORE: "" if before is None else repr(float(before)),
                 ADVANTAGE: repr(adv), "rolloutbus.feedback_source": fb.source})
    row = {**rollout.row, "final_reward": fb.value, "metadata": meta, "updated_ns": updated}
    out = Applied(row)
    if not rollout.trains or not steps:
        return out
    gid = GROUP_PREFIX + rollout.rollout_id
    row["group_id"] = gid
    delta = fb.value - (float(before) if before is not None else 0.0)
    transitions = []
    for s in steps:
        ret = float(s["return_"]) if again else float(s["return_"]) + delta
        out.transition_rows.append({**s, "return_": ret, "advantage": adv, "group_id": gid, "updated_ns": updated})
        if s.get("trained", True):
            transitions.append(Transition(
                rollout_id=s["rollout_id"], attempt_id=s["attempt_id"], task_id=s["task_id"], span_id=s["span_id"],
                turn=s["turn"], agent_name=s.get("agent_name"), resource_version=s.get("resource_version"),
                prompt_token_ids=list(s["prompt_token_ids"]), response_token_ids=list(s["response_token_ids"]),
                response_logprobs=list(s.get("response_logprobs") or []), response_mask=list(s.get("response_mask") or []),
                reward=float(s["reward"]), return_=ret, advantage=adv,
            ))
    if transitions:
        out.batch = GroupBatch(
            group_id=gid, task_id=str(rollout.row.get("task_id") or ""), resource_version=rollout.row.get("resource_version"),
            created_ns=fb.time_ns, group_size=1, complete=True, zero_variance=adv == 0.0,
            credit=str(steps[0].get("credit") or "identical"), rollout_ids=[rollout.rollout_id], rewards=[fb.value],
            advantages=[adv], transitions=transitions,
        )
    return out


def from_late_span(span: Any, late: bool, arrived_ns: int) -> dict[str, Any] | None:
    """The Feedback (its Avro dict) that ``span`` stands for, or None: a span the span stage read after its
    attempt completed (``late``) and that gives a reward (``span.reward``, as mapped from any encoding).

    Its id is the span's, ``span:<attempt id>:<span id>``: the same span delivered again (an exporter's retry, a
    replay after a restart) is the same feedback and counts once; a second reward span for the rollout is a
    second feedback (a duplicate). Its time is the span's end (when the reward was given, as
    ``/v1/feedback/traces`` takes it), else its start, else ``arrived_ns`` (the record's time on the bus)."""
    reward = getattr(span, "reward", None)
    if not late or reward is None:
        return None
    value = float(reward.value)
    if not math.isfinite(value):  # the mapping refuses these; a record of another writer may not have
        return None
    return {
        "feedback_id": f"span:{span.attempt_id}:{span.span_id}",
        "rollout_id": str(span.rollout_id),
        "value": value,
        "time_ns": int(span.end_time_ns or span.start_time_ns or arrived_ns),
        "source": LATE_SPAN,
        "metadata": {"rolloutbus.attempt_id": str(span.attempt_id), "rolloutbus.span_id": str(span.span_id),
                     "rolloutbus.span_name": str(span.name)},
    }


def agent_of(steps: list[dict[str, Any]]) -> str:
    """The key of a rollout's running baseline: the agent of its last step ("" when none names one)."""
    for s in reversed(steps):
        if s.get("agent_name"):
            return str(s["agent_name"])
    return ""


__all__ = ["ADVANTAGE", "AFTER_WINDOW", "AGAIN", "APPLY", "Applied", "DUPLICATE", "FEEDBACK_ID", "GROUP_OPEN", "GROUP_PREFIX",
           "LATE_SPAN", "REWARD_BEFORE", "StoredRollout", "UNKNOWN", "agent_of", "apply", "from_late_span", "verdict"]
