"""The vLLM path's pure pieces: the venv recipe's requirement filter, checkpoint checks, version stamping, the
engine's command line and environment. The engine itself: tests/integration/trainer/test_vllm_serve.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _adapter(ckpt: Path, base: Path | str, rank: int = 8) -> Path:
    """A LoRA checkpoint's adapter/ as the trainer writes it (the config and a weights file)."""
    d = ckpt / "adapter"
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text(json.dumps({"r": rank, "base_model_name_or_path": str(base)}))
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(rank, 4)}, str(d / "adapter_model.safetensors"))
    return d


def test_a_lora_version_loads_its_adapters_alone_when_they_sit_on_the_weights_held(tmp_path: Path) -> None:
    from trainer.lora import adapter_of, reload_plan

    base, other = tmp_path / "step-0", tmp_path / "model"
    base.mkdir(), other.mkdir()
    v1 = tmp_path / "step-1"
    adapter = _adapter(v1, base)
    assert adapter_of(v1) == (adapter, {"r": 8, "base_model_name_or_path": str(base)})
    assert reload_plan(v1, base, 8) == ("adapter", adapter, None)
    assert reload_plan(v1, tmp_path / "." / "step-0", 16) == ("adapter", adapter, None), "the same directory, another spelling"
    assert reload_plan(v1, other, 8) == ("base", adapter, str(base)), "the engine holds other weights: the base first"
    assert reload_plan(v1, base, 0) == ("full", None, None), "runtime LoRA off: the merged weights"
    assert reload_plan(v1, base, 4) == ("full", None, None), "a rank above the engine's"
    assert reload_plan(tmp_path / "plain", base, 8) == ("full", None, None), "no adapters"
    own = tmp_path / "step-0b"
    _adapter(own, own)
    assert reload_plan(own, base, 8) == ("full", None, None), "adapters on their own checkpoint: it holds the base"
    gone = tmp_path / "step-2"
    _adapter(gone, tmp_path / "pruned")
    assert reload_plan(gone, base, 8) == ("full", None, None), "a base no longer on disk: the merged weights"
    (adapter / "adapter_config.json").write_text("{not json")
    assert adapter_of(v1) is None and reload_plan(v1, base, 8) == ("full", None, None)


def test_requests_name_the_adapters_and_answers_the_model_asked_for() -> None:
    from trainer.vllm_serve import lora_engine_args, name_adapter

    body, asked = name_adapter(json.dumps({"model": "policy", "messages": []}).encode(), "policy-v3")
    assert json.loads(body) == {"model": "policy-v3", "messages": []} and asked == "policy"
    assert name_adapter(b"not json", "policy-v3") == (b"not json", None)
    line = b'data: {"id": "c1", "model": "policy-v3", "choices": []}\n'
    assert json.loads(stamp_sse_line(line, 3, "policy")[6:]) == {"id": "c1", "model": "policy", "choices": [], "resource_version": 3}
    assert lora_engine_args(0) == []
    args = lora_engine_args(4)
    assert args[:3] == ["--enable-lora", "--max-lora-rank", "8"], "vLLM takes ranks from its own list: the smallest that holds 4"
    assert lora_engine_args(16)[2] == "16" and lora_engine_args(300)[2] == "320"
    env = engine_env({}, Path("/e"), Path("/c"), lora=True)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1" and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in engine_env({}, Path("/e"), Path("/c"))


def test_the_gate_switches_lora_versions_by_their_adapters_and_falls_back_to_the_merged_weights(tmp_path: Path) -> None:
    """Against a stand-in for vLLM's routes (what the engine is told, in order): an adapter version on the weights held
    loads its adapters and unloads the previous ones, requests name them; a version on another base reloads the base
    first; adapters the engine refuses give way to the merged weights; a plain version drops the adapters."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from trainer.vllm_serve import VllmGate

    served = {"model.embed_tokens.weight": (8, 4)}
    base = _checkpoint(tmp_path / "step-0", served)
    other = _checkpoint(tmp_path / "other", served)
    calls: list[tuple[str, Any]] = []
    refuse: set[str] = set()
    fail_load: set[str] = set()

    async def rpc(request: web.Request) -> web.Response:
        body = await request.json()
        calls.append((request.path, body.get("args", [body.get("lora_name")])[0] if body else None))
        if request.path == "/v1/load_lora_adapter" and body["lora_name"] in refuse:
            return web.Response(status=400, text="no")
        if request.path == "/collective_rpc" and body["args"][0] in fail_load:
            return web.Response(status=500, text="cut short")
        return web.Response(text="Success" if "lora" in request.path else "{}")

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"model": body["model"], "choices": []})

    async def scenario() -> list[Any]:
        engine = web.Application()
        for path in ("/collective_rpc", "/reset_prefix_cache", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            engine.router.add_post(path, rpc)
        engine.router.add_post("/v1/chat/completions", chat)
        server = TestServer(engine)
        await server.start_server()
        gate = VllmGate(str(server.make_url("")).rstrip("/"), "k", str(base), 0, lora_rank=8)
        await gate.start()
        out: list[Any] = []

        async def ask() -> str:
            class Req:
                path = "/v1/chat/completions"

                async def read(self) -> bytes:
                    return json.dumps({"model": "policy", "messages": []}).encode()

            resp = await gate.forward(Req())  # type: ignore[arg-type]
            return str(json.loads(resp.body)["model"])

        def version(n: int, on: Path, merged: bool = True) -> str:
            d = _checkpoint(tmp_path / f"step-{n}", served) if merged else tmp_path / f"step-{n}"
            _adapter(d, on)
            return str(d)

        try:
            assert await gate.reload(version(1, base), 1)
            out.append((list(calls), gate.adapter, gate.loaded, await ask()))
            calls.clear()
            assert await gate.reload(version(2, base), 2)
            out.append(list(calls))
            calls.clear()
            assert await gate.reload(version(3, other), 3)  # adapters on other weights: those first
            out.append((list(calls), gate.loaded))
            calls.clear()
            refuse.add("policy-v4")
            v4 = version(4, other)
            assert await gate.reload(v4, 4)
            out.append((list(calls), gate.adapter, gate.loaded))
            calls.clear()
            assert await gate.reload(version(5, other), 5)
            out.append((list(calls), gate.adapter))
            calls.clear()
            assert await gate.reload(str(_checkpoint(tmp_path / "plain", served)), 6)
            out.append((list(calls), gate.adapter, await ask(), gate.adapter_loads))
            calls.clear()
            # a full load that fails half-way: what the engine holds is not known, so the next version's adapters,
            # though on the weights held before, go on a fresh load of their base
            broken = str(_checkpoint(tmp_path / "broken", served))
            fail_load.add(broken)
            assert not await gate.reload(broken, 7) and gate.version == 6 and gate.loaded is None
            assert await gate.reload(version(8, tmp_path / "plain"), 8)
            out.append((list(calls), gate.loaded, gate.adapter))
        finally:
            await gate.stop()
            await server.close()
        return out

    one, two, three, four, five, six, seven = asyncio.run(scenario())
    assert one == ([("/v1/load_lora_adapter", "policy-v1")], "policy-v1", str(base), "policy"), "the model asked for, answered"
    assert two == [("/v1/load_lora_adapter", "policy-v2"), ("/v1/unload_lora_adapter", "policy-v1")]
    assert three == ([("/collective_rpc", str(other)), ("/reset_prefix_cache", None), ("/v1/load_lora_adapter", "policy-v3"),
                      ("/v1/unload_lora_adapter", "policy-v2")], str(other))
    v4 = str(tmp_path / "step-4")
    assert four == ([("/v1/load_lora_adapter", "policy-v4"), ("/collective_rpc", v4), ("/reset_prefix_cache", None),
                     ("/v1/unload_lora_adapter", "policy-v3")], None, v4), "refused adapters: the merged weights instead"
    assert five[0][0][0] == "/collective_rpc" and five[0][0][1] == str(other) and five[1] == "policy-v5", "back on the base"
    assert six == ([("/collective_rpc", str(tmp_path / "plain")), ("/reset_prefix_cache", None),
                    ("/v1/unload_lora_adapter", "policy-v5")], None, "policy", 4)
    broken, plain = str(tmp_path / "broken"), str(tmp_path / "plain")
    assert seven == ([("/collective_rpc", broken), ("/collective_rpc", plain), ("/reset_prefix_cache", None),
                      ("/v1/load_lora_adapter", "policy-v8")], plain, "policy-v8")


def test_both_servers_take_lora_rank() -> None:
    """`rolloutbus serve --lora-rank R`, either engine (the torch server's adapters: tests/unit/trainer/test_serve.py)."""
    import argparse

    from trainer import serve_cli

    p = argparse.ArgumentParser()
    serve_cli.add_arguments(p)
    assert serve_cli.settings_from_args(p.parse_args(["--engine", "vllm", "--lora-rank", "16"])).serve_lora_rank == 16
    assert serve_cli.settings_from_args(p.parse_args(["--lora-rank", "8"])).serve_lora_rank == 8
