"""What ``rolloutbus process --report-to`` hands the trackers (streams/report.py): the groups of each window. Pure."""

from __future__ import annotations

import pytest

from schemas.models import GroupBatch
from streams.report import StreamReport


def batch(rewards: list[float], *, version: int | None = 3, complete: bool = True, steps_each: int = 2) -> GroupBatch:
    return GroupBatch(group_id=f"t@{version}", task_id="t", resource_version=version, created_ns=1, group_size=4,
                      complete=complete, zero_variance=len(set(rewards)) == 1, rollout_ids=[f"r{i}" for i in range(len(rewards))],
                      rewards=rewards, advantages=[0.0] * len(rewards), transitions=[])


def test_a_window_reports_its_groups_at_the_step_of_the_groups_emitted_so_far() -> None:
    report = StreamReport(now=0.0, spans=100.0)
    report.add(batch([1.0, 0.0, 0.0, 1.0], version=3))
    report.add(batch([0.0, 0.0, 0.0], version=5, complete=False))  # short and all wrong: teaches nothing
    step, got = report.take(now=30.0, spans=1300.0)
    assert step == 2
    assert got == pytest.approx({
        "stream/groups": 2, "stream/groups_per_min": 4.0, "stream/teaching_groups_per_min": 2.0,
        "stream/zero_variance_share": 0.5, "stream/short_group_share": 0.5, "stream/rollouts": 7,
        "stream/reward_mean": 2 / 7, "stream/success_rate": 2 / 7, "stream/steps_per_rollout": 0.0,
        "stream/resource_version": 5, "stream/spans_per_s": 40.0})
    assert report.take(now=60.0, spans=1400.0) is None, "no group since: nothing to report, the window goes on"
    report.add(batch([1.0, 1.0], version=None))
    step, got = report.take(now=90.0, spans=1600.0)
    assert step == 3 and got["stream/groups_per_min"] == pytest.approx(1.0) and "stream/resource_version" not in got
    assert got["stream/spans_per_s"] == pytest.approx((1600 - 1300) / 60), "over the whole window since the last report"
