"""``rolloutbus export``: a finished run's metrics, read from the real ClickHouse engine, written to TensorBoard as a
live ``--report-to`` run writes them (TensorBoard, MLflow, W&B offline): every step's metrics at its step, each version's validation score
and its training rollouts' reward and success at the step that published it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rolloutbus.runs.export import export
from tests.installs import installed
from tests.tracker_files import READERS

pytestmark = pytest.mark.integration


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    return READERS["tensorboard"](run_dir.parent.parent, run_dir.name)[0]


def _rollout(rid: str, mode: str, version: int, reward: float, task: str = "") -> dict[str, Any]:
    return {"rollout_id": rid, "attempt_id": f"{rid}-a", "task_id": task or f"t-{rid}", "mode": mode, "resource_version": version,
            "status": "succeeded", "final_reward": reward}


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow", "wandb"])
def test_export_replays_steps_and_versions_to_each_tracker(tracker: str, ch: Any, tmp_path: Path, monkeypatch: Any) -> None:
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    installed(tracker, "pip install -e '.[trackers]'")
    steps = [["run1", 1, 1_000, 1, [], {"loss": 0.5, "kl": 0.01}], ["run1", 2, 2_000, 2, [], {"loss": 0.25, "kl": 0.02}]]
    ch.insert("train_steps", steps * 2,  # a row written twice (a redelivery) counts once: FINAL
              column_names=["run_id", "step", "time_ns", "resource_version", "group_ids", "metrics"])
    rows = [_rollout("r1", "train", 0, 0.0), _rollout("r2", "train", 0, 1.0), _rollout("r3", "train", 1, 1.0),
            _rollout("v1", "val", 0, 0.0), _rollout("v2", "val", 2, 1.0), _rollout("v3", "test", 2, 0.5),
            # the held-out evaluation (fit's test_dataset, the demo's): version 0 and the version kept, a series apart
            _rollout("h1", "test", 0, 0.0, "heldout-0000"), _rollout("h2", "test", 0, 1.0, "heldout-0001"),
            _rollout("h3", "test", 2, 1.0, "heldout-0000"), _rollout("h4", "test", 2, 1.0, "heldout-0001")]
    cols = list(rows[0])
    ch.insert("rollouts", [[r[c] for c in cols] for r in rows], column_names=cols)

    written = export(ch, tracker, tmp_path, "policy", database=ch.database)

    assert written == {"policy-run1": 2}
    scalars, _config = READERS[tracker](tmp_path, "policy-run1")
    assert scalars["train/loss"] == [(1, 0.5), (2, 0.25)] and scalars["train/kl"] == [(1, 0.01), (2, 0.02)]
    # version 0 at step 0, version 1 at step 1 (the step that published it), version 2 at step 2
    assert scalars["rollouts/reward_mean"] == [(0, 0.5), (1, 1.0)]
    assert scalars["rollouts/success"] == [(0, 0.5), (1, 1.0)] and scalars["rollouts/count"] == [(0, 2.0), (1, 1.0)]
    assert scalars["validation/mean_reward"] == [(0, 0.0), (2, 0.75)]
    assert scalars["heldout/mean_reward"] == [(0, 0.5), (2, 1.0)] and scalars["heldout/count"] == [(0, 2.0), (2, 2.0)]


def test_export_of_one_run_id_and_of_nothing(ch: Any, tmp_path: Path) -> None:
    installed("tensorboard", "pip install -e '.[all]'")
    assert export(ch, "tensorboard", tmp_path, "policy") == {}
    ch.insert("train_steps", [["a", 1, 1, 1, [], {"loss": 1.0}], ["b", 1, 1, 1, [], {"loss": 2.0}]],
              column_names=["run_id", "step", "time_ns", "resource_version", "group_ids", "metrics"])
    assert export(ch, "tensorboard", tmp_path, "mine", run_id="b") == {"mine-b": 1}
    assert _scalars(tmp_path / "tensorboard" / "mine-b")["train/loss"] == [(1, 2.0)]
    assert not (tmp_path / "tensorboard" / "mine-a").exists()


def test_the_command_reads_the_store_it_is_given_and_says_what_it_wrote(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    installed("tensorboard", "pip install -e '.[all]'")
    env = {**os.environ, "ROLLOUTBUS_DATA_DIR": str(tmp_path / "data"), "ROLLOUTBUS_CLICKHOUSE_DSN": f"chdb://{tmp_path / 'ch'}"}
    cmd = [sys.executable, "-m", "rolloutbus.cli", "export"]
    missing = subprocess.run([*cmd, "--report-to", "tensorboard"], env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "cannot read the run's metrics from rolloutbus" in missing.stderr
    assert "Traceback" not in missing.stderr
    seed = ("from foundation.clickhouse import connect, migrate\n"
            f"c = connect('chdb://{tmp_path / 'ch'}', database='rolloutbus')\nmigrate(c, 'rolloutbus')\n"
            "c.insert('train_steps', [['r9', 3, 1, 1, [], {'loss': 0.125}]], "
            "column_names=['run_id', 'step', 'time_ns', 'resource_version', 'group_ids', 'metrics'])\n")
    subprocess.run([sys.executable, "-c", seed], env=env, check=True, timeout=120)
    out = subprocess.run([*cmd, "--report-to", "tensorboard"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    root = tmp_path / "data" / "trackers"
    assert f"policy-r9: 1 steps to tensorboard under {root}" in out.stdout
    assert _scalars(root / "tensorboard" / "policy-r9")["train/loss"] == [(3, 0.125)]
    bad = subprocess.run([*cmd, "--report-to", "neptune"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "not a registered tracker: neptune (registered: tensorboard, mlflow, wandb)" in bad.stderr
