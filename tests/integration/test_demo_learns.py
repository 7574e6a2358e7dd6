"""The calculator demo learns: at a fixed seed and a step budget, held-out success after GRPO ends above version 0's
(the supervised warm-up) by several paired standard errors. `make test`'s one check that training improves anything:
a change that breaks learning (a trainer step that changes nothing, advantages of the wrong sign, a policy server
that never loads the new weights) fails here, where the other demo tests only see that a run completes.

The budget and the margin come from runs on this machine kind (bench/results/learning-test-2026-12-02.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port_run

pytestmark = [pytest.mark.integration, pytest.mark.solo, pytest.mark.timeout(1200),
              pytest.mark.skipif(bool(os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")), reason="the demo runs on the local stack only")]

STEPS = 150  # optimiser steps (about half of what the default 6-minute run takes here)
MINUTES = 6  # a cap: a machine too slow to take STEPS steps in it fails the margin, not the time limit
HELD_OUT = 150
SEED = 3
MARGIN_SE = 3.0  # gain ≥ this many paired standard errors
MIN_GAIN_POINTS = 15.0


def test_the_calculator_demo_learns_by_several_paired_standard_errors(tmp_path: Path) -> None:
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"), ROLLOUTBUS_KAFKA_PORT=str(free_port_run((0, 1))),
               PYTHONUNBUFFERED="1", ROLLOUTBUS_STORE_PORT=str(free_port_run()))
    env.pop("ROLLOUTBUS_CLICKHOUSE_DSN", None)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "demo", "--max-steps", str(STEPS), "--minutes", str(MINUTES),
                           "--held-out", str(HELD_OUT), "--seed", str(SEED), "--no-dashboard", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=1100)
    subprocess.run([sys.executable, "-m", "rolloutbus.cli", "down"], env=env, capture_output=True, timeout=120)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted((out / "logs").glob("*.log"))) \
        if (out / "logs").exists() else ""
    assert proc.returncode == 0, f"demo failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{logs}"
    text = proc.stdout
    first = re.search(r"version +0 \(supervised warm-up only\): +([\d.]+)%", text)
    final = re.search(r"version +(\d+) \(after GRPO\): +([\d.]+)% +\(([+-][\d.]+) points, paired standard error ([\d.]+)\)", text)
    assert first is not None and final is not None, text[-3000:]
    version, gain, se = int(final.group(1)), float(final.group(3)), float(final.group(4))
    print(f"FIGURES learning: v0 {first.group(1)}% -> v{version} {final.group(2)}% ({gain:+.1f} points, paired SE {se:.1f})")
    assert version >= STEPS // 2, f"only {version} versions in {MINUTES} minutes:\n{text[-3000:]}"
    assert gain >= MIN_GAIN_POINTS and gain >= MARGIN_SE * se, \
        f"held-out {first.group(1)}% -> {final.group(2)}%: {gain:+.1f} points, paired SE {se:.1f} (wanted ≥ {MIN_GAIN_POINTS:g} " \
        f"and ≥ {MARGIN_SE:g} SE)\n{text[-3000:]}"
