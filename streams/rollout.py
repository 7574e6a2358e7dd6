"""One finished (or timed-out) attempt → its result: trajectory, transitions, rewards, returns. Pure.

This is the whole per-rollout computation the stream worker runs; tests call it on the same input
to check what lands in ClickHouse.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, fields
from typing import Any

from schemas.codec import PACKED_FIELDS, pack_array, unpack_array
from schemas.models import RolloutEvent, Span
from streams.assembly import assemble
from streams.credit import returns
from streams.rewards import RewardRules, assign, find_final_reward, signals
from streams.transitions import Step, extract_transitions

TIMED_OUT = "timed_out"
# rollouts.metadata key: the reward span whose value became the final reward (none was reported)
FINAL_REWARD_SPAN = "rolloutbus.final_reward_span"
SUMMARY_MAGIC = b"RS2"
_RS1 = b"RS1"  # the format before RS2, still read
_LEN = struct.Struct("<I")


@dataclass
class Settings:
    """What the per-rollout computation needs (a plain value object, not read from the environment)."""

    credit: str = "identical"
    gamma: float = 1.0
    agent_match: str | None = None
    llm_call_match: str | None = None
    exclude_llm_call_in_reward: bool = True
    rules: RewardRules = field(default_factory=RewardRules)


@dataclass
class RolloutResult:
    """A completed attempt, as stored in ``rollouts``/``transitions`` and sent to the group stage."""

    rollout_id: str
    attempt_id: str
    task_id: str
    mode: str
    attempt: int
    resource_version: int | None
    status: str
    final_reward: float | None
    started_ns: int
    finished_ns: int
    span_count: int
    spans_seen: int
    missing_sequence_ids: list[int]
    duplicates: int
    error: str | None
    metadata: dict[str, str]
    credit: str
    steps: list[Step]
    unassigned_reward: float = 0.0

    @property
    def reward(self) -> float:
        """The score the group compares: the final reward, 0 when there is none (failed, timed out)."""
        return self.final_reward if self.final_reward is not None else 0.0

    def to_bytes(self) -> bytes:
        """The summary the span stage sends to the group stage: ``RS2``, a 4-byte little-endian
        length, a JSON header, then each step's token ids, logprobs and mask as their packed wire
        bytes. The header holds the attempt's fields and its steps as columns (``steps``: one list
        per field of :class:`Step`, and ``packed``: each packed field's length, steps in order, fields
        as :data:`PACKED_FIELDS`); a step's rollout, attempt and task id are left out where they are
        the attempt's. JSON-encoding thousands of token ids per rollout, even as base64, would cost
        more than all the other work on it; a header per step (``RS1``) cost more than its columns."""
        steps = self.steps
        head = dict(vars(self))
        cols: dict[str, Any] = {name: [getattr(s, name) for s in steps] for name in _STEP_SCALARS}
        for name in _STEP_IDS:
            own = head[name]
            if all(v == own for v in cols[name]):
                del cols[name]
        blobs = [pack_array(code, getattr(s, name)) for s in steps for name, code in PACKED_FIELDS.items()]
        cols["packed"] = [len(b) for b in blobs]
        head["steps"] = cols
        header = json.dumps(head, separators=(",", ":")).encode()
        return b"".join((SUMMARY_MAGIC, _LEN.pack(len(header)), header, *blobs))

    @classmethod
    def from_bytes(cls, data: bytes) -> RolloutResult:
        """Inverse of :meth:`to_bytes`, and reads the ``RS1`` summaries written before it (still on the
        done topic and in the group tables after an upgrade); ValueError when ``data`` is neither."""
        magic = data[:3]
        if magic not in (SUMMARY_MAGIC, _RS1) or len(data) < 7:
            raise ValueError("not a rollout summary (expected the RS2 or RS1 marker)")
        (n,) = _LEN.unpack_from(data, 3)
        if 7 + n > len(data):
            raise ValueError(f"rollout summary is truncated ({len(data)} bytes, header of {n})")
        try:
            d: dict[str, Any] = json.loads(data[7:7 + n])
            view, pos = memoryview(data), 7 + n
            steps, pos = (_rs2_steps if magic == SUMMARY_MAGIC else _rs1_steps)(d, view, pos)
            if pos != len(data):
                raise ValueError(f"{len(data) - pos} trailing bytes after a rollout summary")
            d["steps"] = steps
            return cls(**d)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"rollout summary header is not valid: {exc!r}") from exc


_STEP_IDS = ("rollout_id", "attempt_id", "task_id")
_STEP_SCALARS = tuple(f.name for f in fields(Step) if f.name not in PACKED_FIELDS)


def _packed(view: memoryview, pos: int, size: int, code: str) -> tuple[Any, int]:
    end = pos + size
    if size < 0 or end > len(view):
        raise ValueError(f"rollout summary is truncated ({len(view)} bytes)")
    return unpack_array(code, view[pos:end]), end


def _rs2_steps(d: dict[str, Any], view: memoryview, pos: int) -> tuple[list[Step], int]:
    cols: dict[str, list[Any]] = d["steps"]
    sizes = cols.pop("packed")
    n, rest = divmod(len(sizes), len(PACKED_FIELDS))
    if rest or any(len(col) != n for col in cols.values()):
        raise ValueError("rollout summary header is not valid: its step columns differ in length")
    for name in _STEP_IDS:
        if name not in cols:
            cols[name] = [d[name]] * n
    sizes_at = iter(sizes)
    steps = []
    for i in range(n):
        kw = {name: col[i] for name, col in cols.items()}
        for name, code in PACKED_FIELDS.items():
            kw[name], pos = _packed(view, pos, next(sizes_at), code)
        steps.append(Step(**kw))
    return steps, pos


def _rs1_steps(d: dict[str, Any], view: memoryview, pos: int) -> tuple[list[Step], int]:
    """``RS1``: the header lists each step as an object, each packed field as its length."""
    steps = []
    for sd in d["steps"]:
        for name, code in PACKED_FIELDS.items():
            sd[name], pos = _packed(view, pos, sd[name], code)
        steps.append(Step(**sd))
    return steps, pos


def finish_attempt(
    spans: list[Span],
    event: RolloutEvent | None,
    settings: Settings,
    *,
    rollout_id: str | None = None,
    attempt_id: str | None = None,
    task_id: str = "",
    mode: str = "train",
    attempt: int = 1,
    started_ns: int = 0,
    finished_ns: int = 0,
) -> RolloutResult:
    """Assemble, extract transitions, land intermediate rewards, assign credit.

    ``event`` is the FINISHED event; ``None`` means the attempt timed out (status ``timed_out``)
    and the keyword arguments say what is known about it. The final reward is the FINISHED event's,
    else the attempt's last reward span's (:func:`streams.rewards.find_final_reward`).
    """
    span_count = event.span_count if event is not None else None
    traj = assemble(spans, span_count or None)
    if event is not None:
        rollout_id, attempt_id, task_id, mode, attempt = (
            event.rollout_id, event.attempt_id, event.task_id, event.mode, event.attempt,
        )
        finished_ns = event.time_ns
    reported = event.final_reward if event is not None else None
    fin = find_final_reward(traj, reported)
    final = fin.value
    steps = extract_transitions(traj, task_id, settings.agent_match, llm_call_match=settings.llm_call_match,
                                exclude_llm_call_in_reward=settings.exclude_llm_call_in_reward)
    inter, unassigned = assign(steps, signals(traj, settings.rules, reported))
    rets = returns(inter, final if final is not None else 0.0, settings.credit, settings.gamma)
    for step, r, g in zip(steps, inter, rets, strict=True):
        step.reward, step.return_ = r, g
    metadata = dict(event.metadata) if event is not None else {}
    if fin.from_span and fin.span_id is not None:
        metadata[FINAL_REWARD_SPAN] = fin.span_id  # where an analyst finds the reward that was not reported
    rv = event.resource_version if event is not None else None
    if rv is None:
        rv = next((s.resource_version for s in steps if s.resource_version is not None), None)
    return RolloutResult(
        rollout_id=rollout_id or traj.rollout_id,
        attempt_id=attempt_id or traj.attempt_id,
        task_id=task_id,
        mode=mode,
        attempt=attempt,
        resource_version=rv,
        status=(event.status or "finished") if event is not None else TIMED_OUT,
        final_reward=final,
        started_ns=started_ns or min((s.start_time_ns for s in traj.spans), default=finished_ns),
        finished_ns=finished_ns,
        span_count=span_count if span_count is not None else max((s.sequence_id for s in traj.spans), default=0),
        spans_seen=len(traj.spans),
        missing_sequence_ids=traj.missing_sequence_ids,
        duplicates=traj.duplicates,
        error=event.error if event is not None else "no FINISHED event before the inactivity timeout",
        metadata=metadata,
        credit=settings.credit,
        steps=steps,
        unassigned_reward=sum(s.value for s in unassigned),
    )


__all__ = ["Settings", "RolloutResult", "finish_attempt", "TIMED_OUT", "FINAL_REWARD_SPAN"]
