"""The vLLM path's pure pieces: the venv recipe's requirement filter, checkpoint checks, version stamping, the
engine's command line and environment. The engine itself: tests/integration/trainer/test_vllm_serve.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from foundation.venvs import ensure_venv, marker
from trainer.vllm_serve import (EXTENSION, checkpoint_problem, checkpoint_shapes, engine_command, engine_env, manifest_version,
                                safetensors_shapes, shape_problem, stamp_sse_line)
from trainer.vllm_venv import requirement_name, requirements_less_torch


def test_requirements_drop_only_the_torch_family() -> None:
    reqs = ["torch==2.13.0+cpu", "torchaudio==2.13.0+cpu; platform_machine == 'x86_64'", "torchvision", "torchcodec>=0.1",
            "transformers<5.20.0,>=5.16.1", "torch_geometric", "fastapi[standard]<0.137.0,>=0.133.0", "zentorch==2.13.0.1; extra == \"zen\""]
    assert requirements_less_torch(reqs) == ["transformers<5.20.0,>=5.16.1", "torch_geometric",
                                             "fastapi[standard]<0.137.0,>=0.133.0", "zentorch==2.13.0.1; extra == \"zen\""]
    assert requirement_name("Huggingface_Hub>=1.31.0") == "huggingface-hub"
    assert requirement_name("intel-openmp==2024.2.1; platform_machine == \"x86_64\"") == "intel-openmp"


def _checkpoint(directory: Path, shapes: dict[str, tuple[int, ...]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.zeros(v) for k, v in shapes.items()}, str(directory / "model.safetensors"))
    return directory


def test_checkpoint_shapes_read_from_the_header(tmp_path: Path) -> None:
    d = _checkpoint(tmp_path / "v1", {"a.weight": (4, 3), "b.bias": (5,)})
    assert safetensors_shapes(d / "model.safetensors") == {"a.weight": (4, 3), "b.bias": (5,)}
    assert checkpoint_shapes(d) == {"a.weight": (4, 3), "b.bias": (5,)}
    with pytest.raises(FileNotFoundError):
        checkpoint_shapes(tmp_path / "nothing")


def test_a_checkpoint_that_cannot_replace_the_served_one_says_why(tmp_path: Path) -> None:
    served = {"a.weight": (4, 3), "b.bias": (5,)}
    assert shape_problem(served, dict(served)) is None
    assert "a.weight has shape [3, 4]" in (shape_problem(served, {"a.weight": (3, 4), "b.bias": (5,)}) or "")
    assert "1 missing (b.bias)" in (shape_problem(served, {"a.weight": (4, 3)}) or "")
    assert "1 unknown (c)" in (shape_problem(served, {**served, "c": (1,)}) or "")
    assert checkpoint_problem(served, str(_checkpoint(tmp_path / "ok", served))) is None
    assert "no *.safetensors" in (checkpoint_problem(served, str(tmp_path / "gone")) or "")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    assert "cannot read the checkpoint" in (checkpoint_problem(served, str(bad)) or "")


def test_manifest_version(tmp_path: Path) -> None:
    assert manifest_version(tmp_path) == 0
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 7}))
    assert manifest_version(tmp_path) == 7
    (tmp_path / "manifest.json").write_text("[1]")
    assert manifest_version(tmp_path) == 0


def test_every_stream_chunk_names_the_version() -> None:
    line = b'data: {"id": "c1", "choices": [{"token_ids": [5]}]}\n'
    out = json.loads(stamp_sse_line(line, 3)[6:])
    assert out == {"id": "c1", "choices": [{"token_ids": [5]}], "resource_version": 3}
    assert stamp_sse_line(b"data: [DONE]\n", 3) == b"data: [DONE]\n"
    assert stamp_sse_line(b"\n", 3) == b"\n"
    assert stamp_sse_line(b"data: not json\n", 3) == b"data: not json\n"


def test_engine_runs_the_module_with_the_extension_on_loopback(tmp_path: Path) -> None:
    cmd = engine_command("/v/bin/python", "/m", 8123, "policy", "k3y", ["--max-num-seqs", "8"])
    assert cmd[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--worker-extension-cls") + 1] == EXTENSION
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--api-key=k3y" in cmd
    assert cmd[-2:] == ["--max-num-seqs", "8"]
    # a key that starts with "-" (seen: the engine refused "--api-key -Xy..." as a missing value) stays the option's
    dash = engine_command("/v/bin/python", "/m", 8123, "policy", "-Xy")
    assert "--api-key=-Xy" in dash and "-Xy" not in dash
    env = engine_env({"PYTHONPATH": "/work/main", "HOME": "/root"}, tmp_path / "ext", tmp_path / "cache")
    assert env["PYTHONPATH"] == str(tmp_path / "ext") and env["VLLM_SERVER_DEV_MODE"] == "1" and env["HOME"] == "/root"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_the_extension_module_imports_nothing_of_the_project(tmp_path: Path) -> None:
    """It runs in vLLM's venv, where the project's dependencies are not installed."""
    code = ("import sys, trainer.vllm_worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'foundation', 'schemas', 'producers', 'streams', 'rolloutbus'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == "[]"


def test_ensure_venv_runs_an_install_recipe_once(tmp_path: Path) -> None:
    calls: list[tuple[str, float]] = []
    venv = tmp_path / "v"
    python = ensure_venv(venv, ["thing==1.0"], install=lambda py, timeout: calls.append((py, timeout)), timeout=12)
    assert calls == [(str(venv / "bin" / "python"), 12)] and python.exists()
    assert marker(venv, ["thing==1.0"]).exists()
    ensure_venv(venv, ["thing==1.0"], install=lambda py, timeout: calls.append((py, timeout)))
    assert len(calls) == 1


def test_serve_reads_its_engine_from_flags_and_refuses_what_vllm_cannot_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from foundation.errors import ConfigError
    from trainer import serve_cli

    p = argparse.ArgumentParser()
    serve_cli.add_arguments(p)
    s = serve_cli.settings_from_args(p.parse_args(["--engine", "vllm", "--vllm-args", "--max-num-seqs 8", "--model", "tiny"]))
    assert s.serve_engine == "vllm" and s.serve_vllm_args == "--max-num-seqs 8"
    assert serve_cli.settings_from_args(p.parse_args([])).serve_engine == "torch", "today's server stays the default"
    with pytest.raises(ConfigError, match="not 'tiny'"):
        serve_cli.run_vllm(s, None)
    with pytest.raises(ConfigError, match="needs --model"):
        serve_cli.run_vllm(serve_cli.settings_from_args(p.parse_args(["--engine", "vllm", "--no-follow"])), None)


def test_the_demo_hands_its_engine_to_every_policy_server() -> None:
    import argparse

    from foundation.errors import ConfigError
    from rolloutbus.demo import add_arguments
    from rolloutbus.demo.driver import DemoConfig

    p = argparse.ArgumentParser()
    add_arguments(p)
    vllm = DemoConfig.from_args(p.parse_args(["--task", "sql", "--engine", "vllm"]))
    assert vllm.serve_args() == ["--engine", "vllm"] and vllm.serve_start_s > 180
    assert DemoConfig.from_args(p.parse_args(["--task", "sql", "--engine", "torch"])).serve_args() == []
    with pytest.raises(ConfigError, match="--task sql"):
        DemoConfig.from_args(p.parse_args(["--engine", "vllm"]))


def test_an_engine_that_exits_while_starting_is_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    from trainer.vllm_serve import EngineFailed, VllmEngine, loopback_port

    engine = VllmEngine(sys.executable, str(tmp_path), loopback_port(), "policy", log_path=tmp_path / "engine.log")  # no vLLM here
    with pytest.raises(EngineFailed, match="exited with 1 while starting.*No module named 'vllm'"):
        engine.start(timeout=60)
    assert not engine._ext.exists(), "the extension's link folder is removed"


def test_the_sql_demo_serves_with_vllm_where_it_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No --engine: vLLM for --task sql's GRPO run (--production's too) where its venv is made (or named), torch
    elsewhere and for APO and calc; --engine always wins."""
    import argparse

    from rolloutbus.demo import add_arguments
    from rolloutbus.demo.driver import DemoConfig
    from trainer import vllm_venv

    p = argparse.ArgumentParser()
    add_arguments(p)
    venv = tmp_path / "vllm-venv"
    monkeypatch.delenv(vllm_venv.PYTHON_ENV, raising=False)
    monkeypatch.setattr(vllm_venv, "VENV", venv)
    monkeypatch.setattr(vllm_venv.installed, "__defaults__", (venv,))

    def engine(*argv: str) -> str:
        return DemoConfig.from_args(p.parse_args(list(argv))).engine

    assert not vllm_venv.installed() and engine("--task", "sql") == "torch"
    vllm_venv.marker(venv, vllm_venv.PINS).parent.mkdir(parents=True)
    vllm_venv.marker(venv, vllm_venv.PINS).touch()
    assert vllm_venv.installed() and engine("--task", "sql") == "vllm" and engine("--task", "sql", "--engine", "torch") == "torch"
    assert engine("--task", "sql", "--production") == "vllm"
    assert engine() == engine("--production") == engine("--task", "sql", "--algorithm", "apo") == "torch"
    monkeypatch.setenv(vllm_venv.PYTHON_ENV, str(tmp_path / "missing" / "python"))
    assert not vllm_venv.installed() and engine("--task", "sql") == "torch"
