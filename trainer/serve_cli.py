"""``rolloutbus serve``: the OpenAI-compatible policy server, hot-reloading new versions from ``rb.resources``.

``--engine torch`` (the default): the project's own server (:mod:`trainer.serve`). ``--engine vllm``: vLLM's
OpenAI server from its own virtualenv behind the project's version gate (:mod:`trainer.vllm_serve`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from foundation import tls

log = logging.getLogger(__name__)


# flag dest → settings field: what the flags set, and where their help's variable and default come from
_FLAGS = {"model": "serve_model", "host": "serve_host", "port": "serve_port", "resource_name": "resource_name",
          "max_batch": "serve_max_batch", "threads": "torch_threads", "serve_follow": "serve_follow", "insecure": "insecure",
          "engine": "serve_engine", "vllm_args": "serve_vllm_args", "follow_lag": "serve_follow_lag",
          "lora_rank": "serve_lora_rank"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model dir or 'tiny' (unset: wait for the first version on rb.resources)")
    p.add_argument("--host", help="bind address")
    p.add_argument("--port", type=int, help="port")
    p.add_argument("--resource-name", help="resource to follow on rb.resources")
    p.add_argument("--no-follow", action="store_true", help="do not hot-reload from rb.resources (env ROLLOUTBUS_SERVE_FOLLOW=false)")
    p.add_argument("--follow-lag", type=int, metavar="N", help="serve the version N behind the newest: batches arrive at least "
                   "N versions old (the staleness bench; 0: the newest)")
    p.add_argument("--max-batch", type=int, help="requests in flight at once, one forward pass per decode step for all")
    p.add_argument("--insecure", action="store_true", default=None,
                   help="listen on a non-loopback address without ROLLOUTBUS_SERVE_TOKEN (logged loudly)")
    p.add_argument("--threads", type=int, help="torch threads (0: torch's default)")
    p.add_argument("--engine", choices=["torch", "vllm"],
                   help="torch: the project's server; vllm: vLLM's, installed once by `make vllm`")
    p.add_argument("--vllm-args", help="more vLLM server arguments, shell words")
    p.add_argument("--lora-rank", type=int, metavar="R", help="a LoRA trainer's versions (train --lora-rank) served by "
                   "loading their adapters alone, up to rank R, the base weights kept (0: merged weights reloaded)")
    tls.add_arguments(p)
    from foundation.flags import describe_flags

    describe_flags(p, "trainer.settings:ServeSettings", _FLAGS)  # each flag's variable and default, from the settings


def settings_from_args(args: argparse.Namespace) -> Any:
    from foundation.entry import settings_from_args
    from trainer.settings import ServeSettings

    if getattr(args, "no_follow", False):
        args.serve_follow = False  # --no-follow sets serve_follow: false
    return settings_from_args(ServeSettings, args, _FLAGS)


def run(args: argparse.Namespace) -> int:
    from foundation.exposure import check_listen

    s = settings_from_args(args)  # before torch: a bad value is one line, at once
    check_listen(s.serve_host, s.serve_token is not None, s.insecure, "ROLLOUTBUS_SERVE_TOKEN", "rolloutbus serve")
    ssl_context = tls.from_args(args)  # before torch and the model: a bad certificate is one line, at once
    if s.serve_engine == "vllm":
        return run_vllm(s, ssl_context)
    import torch
    from aiohttp import web

    from foundation.config import Topics
    from trainer.resources import ResourceFollower
    from trainer.serve import PolicyServer, initial_policy

    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)
    server = PolicyServer(initial_policy(s.serve_model), model_name=s.resource_name, max_batch=s.serve_max_batch,
                          default_max_tokens=s.serve_max_tokens,
                          token=s.serve_token.get_secret_value() if s.serve_token else None, lora_rank=s.serve_lora_rank)
    follower = None
    if s.serve_follow:
        follower = ResourceFollower(s.kafka_conf(), Topics(s.topic_prefix).resources, s.resource_name,
                                    lambda rec: server.load_version(rec.uri, rec.version), lag=s.serve_follow_lag).start()
    print(f"serving {s.resource_name} on {tls.scheme(ssl_context)}://{s.serve_host}:{s.serve_port}/v1 "
          f"(version {server.policy.version if server.policy else 'pending'}, follow {'on' if follower else 'off'})", flush=True)
    try:
        web.run_app(server.app(), host=s.serve_host, port=s.serve_port, print=None, handle_signals=True, ssl_context=ssl_context)
    finally:
        if follower is not None:
            follower.stop()
    return 0


def run_vllm(s: Any, ssl_context: Any) -> int:
    """vLLM's server on a loopback port, the version gate on the public one, the ``rb.resources`` follower feeding the
    gate. Without ``--model`` the engine starts on the first version the follower reads."""
    import asyncio
    import os
    import queue
    import shlex
    import signal
    import threading

    from aiohttp import web

    from foundation.config import Topics
    from foundation.errors import ConfigError
    from trainer.resources import ResourceFollower
    from trainer.vllm_serve import VllmEngine, VllmGate, loopback_port, manifest_version
    from trainer.vllm_venv import vllm_python

    if s.serve_model == "tiny":
        raise ConfigError("--engine vllm serves a Hugging Face model directory (e.g. one `rolloutbus model import` made), not 'tiny'")
    if not s.serve_model and not s.serve_follow:
        raise ConfigError("--engine vllm --no-follow needs --model DIR")
    python = vllm_python()  # VllmUnavailable: one line
    early: queue.Queue[Any] = queue.Queue()  # versions read before the gate can take them
    gate_ready = threading.Event()
    box: list[VllmGate] = []

    def on_version(rec: Any) -> None:
        if gate_ready.is_set():
            box[0].reload_blocking(rec.uri, rec.version)
        else:
            early.put(rec)

    def terminate(signum: int, frame: Any) -> None:  # until run_app handles it: a stop while vLLM starts stops it too
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    follower = None
    if s.serve_follow:
        follower = ResourceFollower(s.kafka_conf(), Topics(s.topic_prefix).resources, s.resource_name, on_version,
                                    lag=s.serve_follow_lag).start()
    engine, died = None, []
    try:
        model, version = s.serve_model, manifest_version(s.serve_model) if s.serve_model else 0
        if not model:
            print(f"waiting for the first version of {s.resource_name} on rb.resources ...", flush=True)
            first = early.get()
            model, version = first.uri, first.version
        print(f"starting vLLM on {model} (its log follows) ...", flush=True)
        engine = VllmEngine(python, model, loopback_port(), s.resource_name, extra=shlex.split(s.serve_vllm_args),
                            lora_rank=s.serve_lora_rank)
        engine.start()  # a stop meanwhile (SystemExit) still reaches engine.stop() below
        gate = VllmGate(engine.url, engine.api_key, model, version, token=s.serve_token.get_secret_value() if s.serve_token else None,
                        served_name=s.resource_name, lora_rank=s.serve_lora_rank)
        box.append(gate)

        async def started(app: web.Application) -> None:  # the gate has its loop now: the follower may call it
            gate_ready.set()
            app["watch"] = asyncio.create_task(watch())
            while not early.empty():  # what arrived while the engine started (older ones are skipped by version)
                rec = early.get_nowait()
                asyncio.create_task(gate.reload(rec.uri, rec.version))

        async def watch() -> None:  # an engine that died leaves nothing to serve: stop, as Ctrl-C would
            while engine is not None and engine.proc is not None and engine.proc.poll() is None:
                await asyncio.sleep(1)
            rc = engine.proc.returncode if engine and engine.proc else None
            if rc not in (0, -signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGINT):
                died.append(rc)  # not the stop a process-group signal gives both of us (the demo's, Ctrl-C)
                log.error("the vLLM engine exited with %s; stopping", rc)
            os.kill(os.getpid(), signal.SIGTERM)

        app = gate.app()
        app.on_startup.append(started)
        print(f"serving {s.resource_name} with vLLM on {tls.scheme(ssl_context)}://{s.serve_host}:{s.serve_port}/v1 "
              f"(version {gate.version}, follow {'on' if follower else 'off'})", flush=True)
        web.run_app(app, host=s.serve_host, port=s.serve_port, print=None, handle_signals=True, ssl_context=ssl_context)
    finally:
        try:
            if follower is not None:
                follower.stop()
        finally:
            if engine is not None:
                engine.stop()
    return 1 if died else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.serve_cli`` — the same as ``rolloutbus serve``."""
    from foundation.entry import run_command

    return run_command("rolloutbus serve", add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
