"""Training algorithms are registered in one place (``trainer.algorithms.TRAIN_ALGORITHMS``): ``rolloutbus train
--algorithm`` lists them in its help, runs the one named (a plugin's too, loaded from ``ROLLOUTBUS_PLUGINS``), and
refuses an unknown name in one line that lists the known ones."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from foundation.errors import ConfigError
from trainer.algorithms import TRAIN_ALGORITHMS


def test_grpo_and_sft_are_registered_and_the_help_lists_them() -> None:
    assert TRAIN_ALGORITHMS.names()[:2] == ["grpo", "sft"]
    out = subprocess.run([sys.executable, "-m", "trainer.cli", "--help"], capture_output=True, text=True, timeout=60).stdout
    flat = " ".join(out.split())
    assert "grpo: GRPO on the stream worker's groups" in flat and "sft: supervised fine-tuning" in flat


def test_an_unknown_algorithm_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="training algorithm 'ppo' is not one of: grpo, sft"):
        TRAIN_ALGORITHMS.get("ppo")
    r = subprocess.run([sys.executable, "-m", "trainer.cli", "--algorithm", "ppo"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "training algorithm 'ppo' is not one of: grpo, sft" in r.stderr


def test_a_plugins_algorithm_runs_with_the_trainers_settings(tmp_path: Path) -> None:
    (tmp_path / "my_algo.py").write_text(textwrap.dedent('''
        from trainer.algorithms import TRAIN_ALGORITHMS

        @TRAIN_ALGORITHMS.register("echo")
        def echo(settings):
            """prints the settings it was given"""
            print("echo trains", settings.resource_name, settings.groups_per_step)
            return 3
    '''))
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path), "ROLLOUTBUS_PLUGINS": "my_algo",
           "ROLLOUTBUS_DATA_DIR": str(tmp_path / "data")}
    r = subprocess.run([sys.executable, "-m", "trainer.cli", "--algorithm", "echo", "--resource-name", "mine",
                        "--groups-per-step", "5"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "echo trains mine 5" in r.stdout
