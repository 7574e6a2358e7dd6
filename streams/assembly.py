"""Trajectory assembly: the spans of one attempt → one ordered trajectory. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas.models import Span


@dataclass
class Trajectory:
    """The spans of one rollout attempt in ``sequence_id`` order, with what is known to be missing."""

    rollout_id: str
    attempt_id: str
    spans: list[Span] = field(default_factory=list)
    duplicates: int = 0
    missing_sequence_ids: list[int] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing_sequence_ids


def missing_ids(seen: Iterable[int], span_count: int | None = None) -> list[int]:
    """Sequence ids in ``1..max(span_count, max seen)`` that never arrived.

    Producers number spans 1, 2, ... within an attempt and the FINISHED event carries the last one as
    ``span_count``; a span numbered 0 is accepted but never counted missing.
    """
    present = set(seen)
    top = max([span_count or 0, *present]) if present or span_count else 0
    return [i for i in range(1, top + 1) if i not in present]


def assemble(spans: Iterable[Span], span_count: int | None = None) -> Trajectory:
    """Order one attempt's spans by ``sequence_id``; a repeated ``span_id`` is kept once (the first)."""
    kept: dict[str, Span] = {}
    duplicates = 0
    rollout_id = attempt_id = ""
    for span in spans:
        if not rollout_id:
            rollout_id, attempt_id = span.rollout_id, span.attempt_id
        elif (span.rollout_id, span.attempt_id) != (rollout_id, attempt_id):
            raise ValueError(
                f"span {span.span_id} belongs to {span.rollout_id}/{span.attempt_id}, not {rollout_id}/{attempt_id}: "
                "assemble one attempt at a time"
            )
        if span.span_id in kept:
            duplicates += 1
            continue
        kept[span.span_id] = span
    # start time breaks ties so two spans claiming one sequence id still come out in a stable order.
    ordered = sorted(kept.values(), key=lambda s: (s.sequence_id, s.start_time_ns, s.span_id))
    return Trajectory(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        spans=ordered,
        duplicates=duplicates,
        missing_sequence_ids=missing_ids((s.sequence_id for s in ordered), span_count),
    )


__all__ = ["Trajectory", "assemble", "missing_ids"]
