"""``--report-to``: the run's configuration and each step's metrics in the trackers a team already uses, read back
as TensorBoard reads them; an unknown tracker is one line; what cannot be plotted is left out."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from foundation.errors import ConfigError
from tests.installs import installed
from trainer.trackers import TRACKERS, Trackers, finite


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = installed("tensorboard.backend.event_processing.event_accumulator", "pip install -e '.[all]'")
    ea = accumulator.EventAccumulator(str(run_dir))
    ea.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def test_tensorboard_gets_every_steps_metrics_and_the_config(tmp_path: Path) -> None:
    installed("tensorboard", "pip install -e '.[all]'")
    trackers = Trackers.open("tensorboard", tmp_path, "policy-abc123", {"lr": "0.0005", "policy_loss": "ppo-clip"})
    trackers.log(1, {"loss": 0.5, "kl": 0.01, "reward_mean": 0.25, "skipped": math.nan})
    trackers.log(2, {"loss": 0.25, "kl": 0.02, "reward_mean": 0.5})
    trackers.log(2, {"validation/mean_reward": 0.75})
    trackers.close()
    run = tmp_path / "tensorboard" / "policy-abc123"
    got = _scalars(run)
    assert got["train/loss"] == [(1, 0.5), (2, 0.25)] and got["train/reward_mean"] == [(1, 0.25), (2, 0.5)]
    assert got["validation/mean_reward"] == [(2, 0.75)] and "train/skipped" not in got


def test_no_tracker_named_is_none_and_an_unknown_one_is_one_line(tmp_path: Path) -> None:
    assert Trackers.open("", tmp_path, "r", {}).trackers == []
    with pytest.raises(ConfigError, match="tracker 'mlflw' is not one of: tensorboard"):
        Trackers.open("tensorboard,mlflw", tmp_path, "r", {})
    from trainer.settings import TrainerSettings

    with pytest.raises(Exception, match="not a registered tracker: mlflw"):
        TrainerSettings(report_to="mlflw")
    assert "tensorboard" in TRACKERS


def test_only_finite_numbers_are_plotted() -> None:
    assert finite({"a": 1, "b": 2.5, "c": math.inf, "d": "x", "e": True, "f": math.nan}) == {"a": 1.0, "b": 2.5}
