"""Off-policy control and the crash hook, as plain functions."""

from __future__ import annotations

import pytest

from trainer.loop import staleness_weight


@pytest.mark.parametrize(
    ("batch_version", "current", "expected"),
    [
        (5, 5, 1.0),  # on-policy
        (4, 5, 1.0),  # lag 1 < bound 2
        (3, 5, 0.5),  # lag == bound: down-weighted
        (2, 5, None),  # lag 3 > bound: dropped
        (None, 5, 1.0),  # unversioned: trained on, counted separately
    ],
)
def test_staleness_weight(batch_version: int | None, current: int, expected: float | None) -> None:
    assert staleness_weight(batch_version, current, max_staleness=2, stale_weight=0.5) == expected


def test_a_version_below_the_minimum_is_dropped_whatever_its_lag() -> None:
    assert staleness_weight(2, 3, 8, 0.5, min_version=3) is None
    assert staleness_weight(3, 3, 8, 0.5, min_version=3) == 1.0
    assert staleness_weight(4, 9, 8, 0.5, min_version=3) == 1.0  # lag 5 within the bound
    assert staleness_weight(None, 3, 8, 0.5, min_version=3) == 1.0  # unversioned: as before


def test_zero_bound_only_trains_on_policy() -> None:
    assert staleness_weight(5, 5, 0, 0.5) == 1.0
    assert staleness_weight(4, 5, 0, 0.5) is None


def _admitted(skip_zero_variance: bool) -> tuple[list[str], dict[str, float], dict[str, dict[str, int]]]:
    """Feed two groups, one whose rewards are all equal, through Trainer.handle (no model, no broker)."""
    from types import SimpleNamespace

    from schemas import GroupBatch, encode
    from trainer.loop import Counters, LoopState, Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.s = SimpleNamespace(max_staleness=4, min_version=0, stale_weight=0.5, skip_zero_variance=skip_zero_variance)
    trainer.state, trainer.pending, trainer.counters, trainer.published_version = LoopState(0, 0, "run"), [], Counters(), None
    for offset, (gid, rewards, zero) in enumerate([("flat", [0.0, 0.0], True), ("mixed", [1.0, 0.0], False)]):
        batch = GroupBatch(group_id=gid, task_id="t", resource_version=0, created_ns=1, group_size=2, rollout_ids=["a", "b"],
                           rewards=rewards, advantages=[0.0, 0.0] if zero else [0.7, -0.7], transitions=[], zero_variance=zero)
        msg = SimpleNamespace(topic=lambda: "rb.batches", partition=lambda: 0, offset=lambda o=offset: o,
                              value=lambda b=batch: encode(b), key=lambda: b"t")
        trainer.handle(msg)  # type: ignore[arg-type]
    return [b.group_id for b, _ in trainer.pending], trainer.counters.as_metrics(), trainer.state.offsets


def test_groups_that_cannot_teach_are_dropped_only_when_asked() -> None:
    pending, metrics, offsets = _admitted(skip_zero_variance=True)
    assert pending == ["mixed"] and metrics["batches_dropped_zero_variance"] == 1.0
    assert offsets == {"rb.batches": {"0": 2}}  # the dropped group is consumed all the same
    pending, metrics, _ = _admitted(skip_zero_variance=False)
    assert pending == ["flat", "mixed"] and metrics["batches_dropped_zero_variance"] == 0.0
