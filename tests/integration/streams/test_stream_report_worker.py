"""``rolloutbus process --report-to``: the stream worker reports the groups it emitted to TensorBoard and MLflow, read
back as their own tools read them, on the real broker and the real ClickHouse engine (chDB)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import tracker_files
from tests.integration.streams.helpers import batches, encoded, produce, rollout, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_the_worker_reports_its_groups_to_the_trackers(kafka_conf: Any, topics: Any, test_env: Any, tmp_path: Path) -> None:
    # Two groups of two under version 1: t1 teaches (rewards 1 and 0), t2 does not (both 0).
    inputs = [rollout(f"{task}-r{i}", task, reward=1.0 if (task, i) == ("t1", 0) else 0.0) for task in ("t1", "t2")
              for i in range(2)]
    produce(kafka_conf, topics.spans, [kv for spans, ev in inputs for kv in encoded(spans, ev)])
    proc = start_worker(test_env, "--group-size", "2", "--report-to", "tensorboard,mlflow", "--tracker-dir", str(tmp_path),
                        "--report-interval", "1")
    got = batches(kafka_conf, topics.batches, 2, proc)
    rc, out = stop_worker(proc)  # the last window is reported as it stops
    assert rc == 0 and len(got) == 2, out[-3000:]
    assert "reporting to tensorboard,mlflow as" in out, out[-3000:]
    (run_dir,) = (tmp_path / "tensorboard").iterdir()
    run = run_dir.name
    assert run.startswith(f"{topics.prefix}streams-"), run

    for tracker in (tracker_files.tensorboard, tracker_files.mlflow):
        series, params = tracker(tmp_path, run)
        points = sorted(p for name, pts in series.items() if name == "stream/groups" for p in pts)
        assert sum(v for _step, v in points) == 2 and points[-1][0] == 2, (tracker.__name__, series)
        # every window's reward and success are over its rollouts; over the run, 1 of 4 succeeded
        rollouts = dict(series["stream/rollouts"])
        reward = sum(rollouts[s] * v for s, v in series["stream/reward_mean"]) / sum(rollouts.values())
        assert reward == pytest.approx(0.25) and sum(rollouts.values()) == 4, (tracker.__name__, series)
        zero = sum(dict(series["stream/groups"])[s] * v for s, v in series["stream/zero_variance_share"])
        assert zero == pytest.approx(1.0), "one group of two taught nothing"
        assert {v for _s, v in series["stream/resource_version"]} == {1.0}
        if tracker is tracker_files.mlflow:
            assert params["group_size"] == "2" and params["credit"] == "identical", params
