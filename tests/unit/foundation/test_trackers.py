"""``--report-to``: the run's configuration and each step's metrics in the trackers a team already uses (TensorBoard,
MLflow's file store, W&B offline), read back from their files as their own tools read them; an unknown tracker is one
line; what cannot be plotted is left out."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from foundation.errors import ConfigError
from tests.installs import installed
from tests.tracker_files import READERS
from foundation.trackers import TRACKERS, Trackers, finite


@pytest.mark.parametrize("name", ["tensorboard", "mlflow", "wandb"])
def test_each_tracker_gets_every_steps_metrics_and_the_config(name: str, tmp_path: Path, monkeypatch: Any,
                                                               caplog: Any) -> None:
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    installed(name, "pip install -e '.[trackers]'")
    config = {"lr": "0.0005", "policy_loss": "ppo-clip"}
    trackers = Trackers.open(name, tmp_path, "policy-abc123", config)
    trackers.log(1, {"loss": 0.5, "kl": 0.01, "reward_mean": 0.25, "skipped": math.nan})
    trackers.log(2, {"loss": 0.25, "kl": 0.02, "reward_mean": 0.5})
    trackers.log(1, {"validation/mean_reward": 0.75})  # a version's score at the earlier step that made it
    trackers.close()
    got, params = READERS[name](tmp_path, "policy-abc123")
    assert got["train/loss"] == [(1, 0.5), (2, 0.25)] and got["train/reward_mean"] == [(1, 0.25), (2, 0.5)]
    assert got["validation/mean_reward"] == [(1, 0.75)] and "train/skipped" not in got
    if name != "tensorboard":  # TensorBoard keeps the configuration as text
        assert params == config
    if name == "wandb":  # no WANDB_API_KEY: offline, and it says so
        assert "W&B runs offline" in caplog.text and "wandb sync" in caplog.text


def test_no_tracker_named_is_none_and_an_unknown_one_is_one_line(tmp_path: Path) -> None:
    assert Trackers.open("", tmp_path, "r", {}).trackers == []
    with pytest.raises(ConfigError, match="tracker 'mlflw' is not one of: "):
        Trackers.open("tensorboard,mlflw", tmp_path, "r", {})
    from trainer.settings import TrainerSettings

    with pytest.raises(Exception, match="not a registered tracker: mlflw"):
        TrainerSettings(report_to="mlflw")
    assert {"tensorboard", "mlflow", "wandb"} <= set(TRACKERS.names())


def test_only_finite_numbers_are_plotted() -> None:
    assert finite({"a": 1, "b": 2.5, "c": math.inf, "d": "x", "e": True, "f": math.nan}) == {"a": 1.0, "b": 2.5}


def test_wandb_goes_offline_without_a_key_or_without_a_network_to_its_server(tmp_path: Path, monkeypatch: Any,
                                                                              caplog: Any) -> None:
    """The mode is WANDB_MODE as given; else offline without WANDB_API_KEY or when its server cannot be reached (this
    machine reaches no W&B: a key alone must not hang or fail the run), and the warning says which."""
    from rolloutbus.localproc import free_port
    from foundation.trackers import wandb_mode

    never, always = (lambda url: False), (lambda url: True)
    assert wandb_mode({}, always) == ("offline", "no WANDB_API_KEY")
    assert wandb_mode({"WANDB_API_KEY": "k"}, always) == ("online", "WANDB_API_KEY")
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_BASE_URL": "http://w.example:8080"}, never) == (
        "offline", "http://w.example:8080 cannot be reached")
    assert wandb_mode({"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}, never) == ("disabled", "WANDB_MODE")
    installed("wandb", "pip install -e '.[trackers]'")
    for var in ("WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    trackers = Trackers.open("wandb", tmp_path, "policy-offline", {"lr": "1"})
    trackers.log(1, {"loss": 0.5})
    trackers.close()
    got, _params = READERS["wandb"](tmp_path, "policy-offline")
    assert got["train/loss"] == [(1, 0.5)]
    assert "W&B runs offline (http://127.0.0.1:" in caplog.text and "cannot be reached" in caplog.text
