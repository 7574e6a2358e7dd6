"""``SFT(...)`` in the Python API: its settings become the ``rolloutbus train --algorithm sft`` command fit
starts, read by the trainer's own parser into the settings SFT runs with; bad values are one line."""

from __future__ import annotations

import argparse

import pytest

from foundation.errors import ConfigError
from rolloutbus import GRPO, SFT, Trainer


def _settings(argv: list[str]) -> object:
    from trainer.cli import add_arguments, settings_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(argv)
    assert args.algorithm == "sft"
    return settings_from_args(args)


def test_sft_becomes_the_train_command_and_its_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    algo = SFT(top_k=2, min_reward=0.5, where="r.task_id != ''", key="prompt", epochs=3, lr=1e-4, batch_size=8, seed=4,
               train_args=["--train-layers", "2"])
    cmd = algo.command(str(tmp_path))
    assert cmd[:5] == ["train", "--algorithm", "sft", "--model", str(tmp_path)]
    s = _settings(cmd[1:])
    assert (s.sft_top_k, s.sft_min_reward, s.sft_where, s.sft_key, s.sft_epochs, s.sft_lr, s.sft_batch_size) == \
        (2, 0.5, "r.task_id != ''", "prompt", 3, 1e-4, 8)
    assert (str(s.train_model), s.train_seed, s.train_layers) == (str(tmp_path), 4, 2)
    # None keeps every rollout: no filter flag at all
    every = _settings(SFT(top_k=None, min_reward=None).command("tiny")[1:])
    assert (every.sft_top_k, every.sft_min_reward, every.sft_where) == (None, None, None)
    assert SFT().command("tiny").count("--sft-top-k") == 1 and "--sft-min-reward" in SFT().command("tiny")


def test_bad_sft_settings_are_one_line() -> None:
    for bad in (dict(samples_per_task=0), dict(epochs=0), dict(top_k=0), dict(batch_size=0)):
        with pytest.raises(ConfigError, match="at least 1"):
            SFT(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="key"):
        SFT(key="rollout")
    with pytest.raises(ConfigError, match="greater than 0"):
        SFT(collect_minutes=0)


def test_fit_takes_grpo_or_sft_and_refuses_anything_else() -> None:
    from rolloutbus.trainer_api.fit import run_fit

    class Other:
        pass

    with pytest.raises(ConfigError, match=r"algorithm Other is not one fit runs: one of GRPO\(...\), SFT\(...\), APO\(...\)"):
        Trainer(algorithm=Other())  # type: ignore[arg-type]
    t = Trainer()
    t.algorithm = Other()  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"is not one fit runs: GRPO\(...\), SFT\(...\) or APO\(...\)"):
        run_fit(t, object(), ["{}"], [])
    assert isinstance(GRPO(), GRPO) and isinstance(SFT(), SFT)
