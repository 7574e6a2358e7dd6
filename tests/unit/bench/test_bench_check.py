"""bench/check.py (make bench-check): the medians it compares and its verdict (pure; the runs are the bench's)."""

from __future__ import annotations

from bench.check import LIMITS, medians, verdicts


def test_a_figure_past_its_tolerance_fails_and_one_within_passes() -> None:
    recorded = {"us_per_span": 140.0, "p99_s": 3.5, "paced_p99_s": 1.2}
    ok = verdicts(recorded, {"us_per_span": 160.0, "p99_s": 5.0, "paced_p99_s": 1.5})
    assert [r[4] for r in ok] == [True, True, True]
    # the 2.3x of issue 58 (main at 9fd8877: 308-338 us per span) fails; its better-looking p99 does not hide it
    bad = verdicts(recorded, {"us_per_span": 310.0, "p99_s": 1.3, "paced_p99_s": 1.3})
    assert [(r[0].key, r[4]) for r in bad] == [("us_per_span", False), ("p99_s", True), ("paced_p99_s", True)]
    assert bad[0][3] == 168.0
    # the paced p99 gets at least 0.3 s of room (a short figure's 30% is below the bench's 0.2 s poll)
    assert verdicts({"paced_p99_s": 0.5}, {"paced_p99_s": 0.79})[0][4]
    assert not verdicts({"paced_p99_s": 0.5}, {"paced_p99_s": 0.81})[0][4]


def test_medians_leave_failed_runs_out_and_compare_only_what_both_sides_have() -> None:
    fast = [{"us_per_span": 120.0, "finished_to_queryable_p99_s": 3.0}, {"error": "the store exited"},
            {"us_per_span": 150.0, "finished_to_queryable_p99_s": 4.0}, {"us_per_span": 130.0, "finished_to_queryable_p99_s": 5.0}]
    got = medians(fast, [])
    assert got == {"us_per_span": 130.0, "p99_s": 4.0}
    assert [r[0].key for r in verdicts({"us_per_span": 1.0, "paced_p99_s": 1.0}, got)] == ["us_per_span"]
    assert {lim.key for lim in LIMITS} == {"us_per_span", "p99_s", "paced_p99_s"}
