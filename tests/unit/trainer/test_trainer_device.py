"""``train --device``: where the trainer runs, and one line when it cannot.

On this kind of machine (no GPU) the CUDA cases must end in exit status 2 with one line
naming what is missing, before anything is loaded, bound or connected. The placement test runs on every
device this machine has (the CPU here; a GPU as well where there is one).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from foundation.errors import ConfigError
from trainer.device import resolve_device

NO_CUDA = not torch.cuda.is_available()
DEVICES = ["cpu"] + ([] if NO_CUDA else ["cuda"])


@pytest.fixture
def no_io(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A clean ROLLOUTBUS_* environment; binding or connecting a socket fails the test."""
    import os

    for key in list(os.environ):
        if key.startswith("ROLLOUTBUS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("ROLLOUTBUS_DATA_DIR", str(tmp_path / "data"))

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("bound or connected a socket before rejecting the command")

    monkeypatch.setattr(socket.socket, "bind", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def _train(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from rolloutbus.cli import main

    try:
        code = main(["train", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    return code, lines[0]


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
@pytest.mark.parametrize("how", [["--device", "cuda"], ["--device", "cuda:0"], "env"])
def test_cuda_asked_for_and_absent_is_one_line_exit_2(how: Any, no_io: None, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    if how == "env":
        monkeypatch.setenv("ROLLOUTBUS_TRAIN_DEVICE", "cuda")
    code, line = _train([] if how == "env" else how, capsys)
    assert code == 2
    assert line.startswith("rolloutbus train: ")
    assert "CUDA is not available" in line and "ROLLOUTBUS_TRAIN_DEVICE" in line and "--device" in line, line


@pytest.mark.skipif(NO_CUDA, reason="needs CUDA")
def test_a_device_index_past_the_visible_gpus_is_one_line(no_io: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = _train(["--device", f"cuda:{torch.cuda.device_count()}"], capsys)
    assert code == 2 and "CUDA device" in line and "visible" in line, line


def test_a_device_that_is_no_device_is_a_bad_value(no_io: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = _train(["--device", "gpu0"], capsys)
    assert code == 2 and "--device" in line and "must be cpu, cuda, cuda:N or auto" in line, line


def test_auto_and_cpu_resolve_here() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cpu" if NO_CUDA else "cuda")


# ------------------------------------------------------------------------------------------ placement


@pytest.mark.parametrize("device", DEVICES)
def test_model_reference_and_batches_live_on_the_device(device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer built for ``device`` holds the policy and the KL reference there and trains a step there."""
    from trainer.loop import Trainer
    from trainer.model import build_tiny
    from trainer.settings import TrainerSettings
    from trainer.synthetic import sample_groups

    monkeypatch.setattr("trainer.resources.read_latest", lambda conf, topic: {})  # no broker: nothing published yet
    settings = TrainerSettings(data_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt", kl_beta=0.05, train_device=device,
                               kafka_bootstrap="127.0.0.1:1")
    trainer = Trainer(settings)
    want = resolve_device(device)
    assert trainer.device == want
    assert {p.device for p in trainer.model.parameters()} == {want}
    assert trainer.backend.ref_model is not None and {p.device for p in trainer.backend.ref_model.parameters()} == {want}

    seen: set[torch.device] = set()  # the devices of the tensors the decoder is called with
    monkeypatch.setattr(trainer.model.get_decoder(), "forward", _recording(trainer.model.get_decoder().forward, seen))
    model, tok = build_tiny(seed=0)
    groups = sample_groups(model, tok, n_groups=2, group_size=2, max_new_tokens=4, seed=3)
    metrics = trainer.backend.step(groups)
    assert metrics["samples"] > 0 and seen == {want}


def _recording(forward: Any, seen: set[Any]) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        seen.update(v.device for v in [*args, *kwargs.values()] if isinstance(v, torch.Tensor))
        return forward(*args, **kwargs)

    return wrapped


def test_precision_and_micro_batch_defaults_follow_the_device() -> None:
    """auto: bf16-mixed and 16384-token micro-batches on a GPU (measured: bench/results/gpu-2026-11-27.md),
    float32 and 4096 on the CPU; an explicit setting wins; a bad one is a ConfigError."""
    from trainer.device import micro_batch_tokens, resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) is None and resolve_precision("fp32", cpu) is None
    assert resolve_precision("bf16-mixed", cpu) is torch.bfloat16
    assert micro_batch_tokens(0, cpu) == 4096 and micro_batch_tokens(1000, cpu) == 1000
    with pytest.raises(ConfigError, match="must be auto, fp32 or bf16-mixed"):
        resolve_precision("fp16", cpu)
    if not NO_CUDA:
        gpu = torch.device("cuda")
        assert micro_batch_tokens(0, gpu) == 16384
        assert resolve_precision("auto", gpu) is (torch.bfloat16 if torch.cuda.is_bf16_supported() else None)


def test_the_precision_flag_reaches_the_settings_and_refuses_others(no_io: None) -> None:
    import argparse

    from trainer.cli import add_arguments
    from trainer.cli import settings_from_args as trainer_settings

    p = argparse.ArgumentParser()
    add_arguments(p)
    from foundation.errors import SettingError

    # the values are the settings model's (one Literal): shown as the flag's choices, refused by the settings in one line
    with pytest.raises(SettingError, match="--precision.*ROLLOUTBUS_TRAIN_PRECISION.*'auto', 'fp32' or 'bf16-mixed'"):
        trainer_settings(p.parse_args(["--precision", "fp16"]))
    assert "{auto,fp32,bf16-mixed}" in p.format_help()
    assert trainer_settings(p.parse_args(["--precision", "bf16-mixed"])).train_precision == "bf16-mixed"
