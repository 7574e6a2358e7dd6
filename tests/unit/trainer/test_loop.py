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


def test_zero_bound_only_trains_on_policy() -> None:
    assert staleness_weight(5, 5, 0, 0.5) == 1.0
    assert staleness_weight(4, 5, 0, 0.5) is None
