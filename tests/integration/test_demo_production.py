"""`rolloutbus demo --production --quick` end to end: task-less requests, the simulated user's late feedback
through the real broker, applied once by the stream worker into the real ClickHouse engine, versions trained
from those rollouts alone, and the report a user reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900), pytest.mark.skipif(bool(os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")),
                                                          reason="the demo runs on the local stack only")]


def test_production_demo_trains_on_late_feedback_for_taskless_traffic(tmp_path: Path) -> None:
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"), ROLLOUTBUS_KAFKA_PORT=str(free_port_run((0, 1))),
               PYTHONUNBUFFERED="1", ROLLOUTBUS_STORE_PORT=str(free_port_run()))
    env.pop("ROLLOUTBUS_CLICKHOUSE_DSN", None)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "demo", "--production", "--quick", "--no-dashboard",
                           "--held-out", "12", "--out", str(out)], env=env, capture_output=True, text=True, timeout=900)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted((out / "logs").glob("*.log"))) \
        if (out / "logs").exists() else ""
    try:
        assert proc.returncode == 0, f"demo failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{logs}"
        text = proc.stdout
        assert "production traffic: no task ids, late feedback" in text
        assert "held-out success rate on 12 problems" in text
        assert re.search(r"version +\d+ \(after feedback\): +[\d.]+%\s+\([+-][\d.]+ points, paired standard error [\d.]+\)", text), text[-3000:]
        served = re.search(r"traffic +(\d+) requests served without a task id \((\d+) failed\), feedback sent on (\d+)", text)
        assert served is not None, text[-3000:]
        n_served, n_failed, n_sent = map(int, served.groups())
        assert n_served > 0 and n_sent > 0 and n_failed < n_served
        fb = re.search(r"(\d+) rollouts without a task id stored; (\d+) got the user's feedback, applied once; (\d+) trained on it "
                       r"\(one-rollout batches, served by (\d+) versions\); (\d+) optimiser steps", text)
        assert fb is not None, text[-3000:]
        stored, judged, trained, versions, steps = map(int, fb.groups())
        # every request answered is stored; every feedback sent lands once (the user's feedback comes 2-8 s after
        # the answer, well after its row is written, and well inside the window: nothing dead-lettered)
        assert stored >= n_served - n_failed and judged == n_sent and trained == judged, text[-3000:]
        assert steps >= 1 and versions >= 1
        assert "dead-lettered feedback: none" in text
        assert re.search(r"the trainer's steps took \d+ of those batches", text), text[-3000:]

        def query(sql: str) -> list[str]:
            q = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "query", sql], env=env, capture_output=True, text=True, timeout=120)
            assert q.returncode == 0, q.stderr
            return [line.strip() for line in q.stdout.splitlines()[2:]]

        # nothing was grouped or replayed: every training rollout is task-less, and the published versions came from them
        assert query("SELECT count() FROM rollouts FINAL WHERE mode = 'train' AND task_id != ''") == ["0"]
        assert int(query("SELECT count() FROM groups FINAL WHERE NOT startsWith(group_id, 'feedback:')")[0]) == 0
        assert int(query("SELECT max(version) FROM resource_versions FINAL")[0]) >= 1
        # the stored reward of a judged rollout is the user's value, and the feedback that set it is named on the row
        rows = query("SELECT count() FROM rollouts FINAL WHERE task_id = '' AND metadata['rolloutbus.feedback_id'] != '' "
                     "AND final_reward IN (0, 1) AND metadata['rolloutbus.feedback_source'] != ''")
        assert int(rows[0]) == judged
    finally:
        subprocess.run([sys.executable, "-m", "rolloutbus.cli", "down"], env=env, capture_output=True, text=True, timeout=120)
