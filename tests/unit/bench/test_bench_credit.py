"""The credit bench reads the demo's held-out lines and tables the runs against final-only on the same seeds."""

from __future__ import annotations

import pytest

from bench.bench_credit import parse, table

OUT = """
held-out success rate (150 problems, greedy):
  version  0 (supervised warm-up only):  34.0%
  version 150 (after GRPO):               91.3%  (+57.3 points, paired standard error 4.1)
"""


def test_parse_reads_the_held_out_lines() -> None:
    assert parse(OUT) == {"first": 34.0, "final": 91.3, "gain": 57.3, "se": 4.1, "version": 150, "staleness": None}
    stale = "staleness  the batches trained on were 4.21 versions old on average (the steps' means from 4.0 to 5.0)\n" + OUT
    assert parse(stale)["staleness"] == 4.21
    with pytest.raises(ValueError, match="no held-out lines"):
        parse("the demo stopped early")


def test_table_compares_each_setting_with_final_only_on_the_same_seeds() -> None:
    runs = [{"setting": "final-only", "seed": 1, "first": 30.0, "final": 80.0, "gain": 50.0, "se": 4.0},
            {"setting": "final-only", "seed": 2, "first": 30.0, "final": 70.0, "gain": 40.0, "se": 4.0},
            {"setting": "discounted+air", "seed": 1, "first": 30.0, "final": 84.0, "gain": 54.0, "se": 3.0},
            {"setting": "discounted+air", "seed": 2, "first": 30.0, "final": 78.0, "gain": 48.0, "se": 3.5}]
    lines = table(runs).splitlines()
    assert lines[2].startswith("| final-only | 2 | — | 30.0% → 75.0% | +45.0 (+50.0, +40.0) | 4.0, 4.0 | — |")
    assert lines[3] == ("| discounted+air | 2 | — | 30.0% → 81.0% | +51.0 (+54.0, +48.0) | 3.0, 3.5 | "
                        "+6.0 ± 2.0 (2 seeds, vs final-only) |")


def test_a_decoupled_row_is_compared_with_ppo_clip_at_the_same_lag() -> None:
    runs = [{"setting": "stale4-ppo-clip", "seed": 1, "first": 30.0, "final": 60.0, "gain": 30.0, "se": 4.0, "staleness": 4.2},
            {"setting": "stale4-decoupled", "seed": 1, "first": 30.0, "final": 70.0, "gain": 40.0, "se": 4.0, "staleness": 4.4},
            {"setting": "final-only", "seed": 1, "first": 30.0, "final": 90.0, "gain": 60.0, "se": 4.0}]
    rows = {line.split(" | ")[0][2:]: line for line in table(runs).splitlines()[2:]}
    assert rows["stale4-ppo-clip"] == "| stale4-ppo-clip | 1 | 4.20 | 30.0% → 60.0% | +30.0 (+30.0) | 4.0 | — |"  # no stale0 run
    assert rows["stale4-decoupled"].endswith("| 4.40 | 30.0% → 70.0% | +40.0 (+40.0) | 4.0 | +10.0 ± 0.0 (1 seeds, vs stale4-ppo-clip) |")
