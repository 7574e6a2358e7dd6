"""Agent Lightning's store, measured with our workload: spans ingested per second and spans that survive
a restart of the store. Prints a table (or one JSON object with ``--json``). Not a timed test.

    python -m bench.agentlightning_store [--rollouts 64] [--spans-per-rollout 16] [--concurrency 16] [--json]

What it does, in order (see bench/README.md for why each choice is fair):

1. Installs ``agentlightning==1.0.2`` from PyPI into its own virtual environment under
   ``~/.cache/rolloutbus/bench-agentlightning`` (once; a marker file makes later runs skip it). 1.x needs
   Python >= 3.12: the interpreter is ``ROLLOUTBUS_BENCH_AL_PYTHON`` if set, else the first
   ``python3.13``/``python3.12`` that runs, else one under ``~/.pyenv/versions``.
2. Starts its server the way its users do (``agl-server host=... port=...``, one uvicorn worker), which
   holds its store (rollouts and their events) in ``agentlightning.server.store``.
3. Creates one rollout per workload rollout and marks it running with its attempt id (what its
   controller does before launching an agent) — not timed.
4. Timed: ``--concurrency`` runners post every span of their rollouts, in order, as events to
   ``/api/rollouts/{rollout_id}/attempt/{attempt_id}/events`` (the ``AGL_EVENT_URL`` its controller hands
   to agents) through its own ``AgentLightningAsyncClient``. Span → event conversion and JSON encoding
   are inside the timing, as Avro encoding is on our side.
5. Counts the events its query API returns and checks the token ids came back; stops the server
   (SIGTERM), starts it again on the same port, and counts again.

Step 4 runs in a child process under the Agent Lightning interpreter (this module with ``--driver``,
from the checkout's root), so at the top it imports only the standard library and bench's modules
that need nothing else (workload, report, loadgen, venvs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
from dataclasses import asdict
from pathlib import Path
from typing import Any

from foundation import venvs
from bench.loadgen import http_json
from bench.report import pct
from bench.workload import WorkloadSpec, generate, size_summary, to_agentlightning

ROOT = Path(__file__).resolve().parents[1]
AL_VERSION = venvs.AL1_VERSION
DEFAULT_VENV = venvs.CACHE / "bench-agentlightning"
_START_TIMEOUT_S = 60


class BenchError(Exception):
    """A step of the bench that cannot go on; the message is the one line the user sees."""


# --------------------------------------------------------------------------- install


def ensure_venv(venv: Path = DEFAULT_VENV, *, quiet: bool = False) -> Path:
    """Create the venv and install agentlightning into it once (from a Python >= 3.12); return its python."""
    return venvs.ensure_venv(
        venv, venvs.AL1_PINS, error=BenchError, say=None if quiet else lambda m: print(m, file=sys.stderr, flush=True),
        base=lambda: venvs.find_python("ROLLOUTBUS_BENCH_AL_PYTHON", f"agentlightning {AL_VERSION}", BenchError))


def driver_command(python: Path, url: str, spec: WorkloadSpec, concurrency: int = 16, *, setup: bool = True,
                   finish: bool = False) -> list[str]:
    """The command of the client child (Agent Lightning's own client under its ``python``, this module with
    ``--driver``) posting ``spec``'s spans to the server at ``url``; run it with ``cwd=ROOT``."""
    return [str(python), "-m", "bench.agentlightning_store", "--driver", "--url", url,
            "--seed", str(spec.seed), "--rollouts", str(spec.rollouts), "--spans-per-rollout", str(spec.spans_per_rollout),
            "--llm-fraction", str(spec.llm_fraction), "--concurrency", str(concurrency),
            *([] if setup else ["--no-setup"]), *(["--finish"] if finish else [])]


# --------------------------------------------------------------------------- server


class Server:
    """One ``agl-server`` process: start, wait until healthy, stop with SIGTERM."""

    def __init__(self, venv: Path, port: int, workdir: Path) -> None:
        self.exe = venv / "bin" / "agl-server"
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "agl-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        # hydra writes a run dir and a .hydra folder into the cwd by default: keep both in our scratch dir.
        cmd = [str(self.exe), "host=127.0.0.1", f"port={self.port}",
               f"hydra.run.dir={self.workdir}/hydra", "hydra.output_subdir=null"]
        from bench.common import start_logged, wait_ready

        self.proc = start_logged(cmd, self.log, cwd=self.workdir)
        try:
            wait_ready(f"agl-server on port {self.port}", lambda: http_json("GET", f"{self.url}/healthz", timeout=2).get("status") == "ok",
                       self.proc, self.log, _START_TIMEOUT_S, BenchError)
        except BenchError:
            self.stop()
            raise

    def peak_rss_mb(self) -> float | None:
        from bench.common import peak_rss_mib

        return None if self.proc is None else peak_rss_mib(self.proc.pid)

    def cpu_seconds(self) -> float:
        """User + system CPU the server process has used (load-independent, unlike wall time)."""
        from bench.common import cpu_s

        return (cpu_s(self.proc.pid) or 0.0) if self.proc is not None else 0.0

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 20 s."""
        from bench.common import stop_process

        stop_process(self.proc, 20)


def count_queryable(url: str, spec: WorkloadSpec) -> tuple[int, int]:
    """(events, prompt tokens) its query API returns for the workload's rollouts; a missing rollout is 0."""
    events = tokens = 0
    for i in range(spec.rollouts):
        rid = f"ro-{spec.seed}-{i:06d}"
        try:
            got = http_json("GET", f"{url}/api/rollouts/{rid}/events", timeout=60)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                continue
            raise BenchError(f"querying events of {rid} failed: HTTP {exc.code}") from exc
        events += len(got)
        for ev in got:
            if ev.get("event_type") == "model_request":
                tokens += len(ev["data"]["response"]["prompt_token_ids"])
    return events, tokens


# --------------------------------------------------------------------------- driver (runs under AL's python)


async def _drive(url: str, spec: WorkloadSpec, concurrency: int, *, setup: bool = True, finish: bool = False) -> dict[str, Any]:
    """Post every span as an event, ``concurrency`` rollouts at once. ``setup``: create the rollouts and mark
    them running first (untimed; its controller's job). ``finish``: end each rollout after its last span
    (``PATCH /api/rollouts/{id}`` to ``succeeded``, what its controller does when the agent returns) and
    report when each reply came (wall clock), for bench_e2e.py."""
    import asyncio

    import httpx
    from agentlightning.client import AgentLightningAsyncClient

    rollouts = generate(spec)  # outside the timing, as on our side
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with AgentLightningAsyncClient(base_url=url, limits=limits, timeout=120.0) as client:
        # Not timed: the rollouts exist and are running before an agent starts (its controller's job).
        if setup:
            body = [{"rollout_id": r[0].rollout_id, "input": {"data_id": r[0].rollout_id}} for r in rollouts]
            (await client.post("/api/rollouts", json=body)).raise_for_status()
            for r in rollouts:
                patch = {"status": {"state": "running", "last_attempt_id": r[0].attempt_id}}
                (await client.patch(f"/api/rollouts/{r[0].rollout_id}", json=patch)).raise_for_status()
        finished: dict[str, float] = {}

        queue: asyncio.Queue[list[Any]] = asyncio.Queue()
        for r in rollouts:
            queue.put_nowait(r)
        latencies: list[float] = []
        sent_bytes = 0
        errors: list[str] = []

        async def runner() -> None:
            nonlocal sent_bytes
            while not queue.empty():
                spans = queue.get_nowait()
                for s in spans:  # in order: one agent emits its rollout's spans one after the other
                    payload = json.dumps(to_agentlightning(s)).encode()
                    sent_bytes += len(payload)
                    t0 = time.perf_counter()
                    resp = await client.post(f"/api/rollouts/{s.rollout_id}/attempt/{s.attempt_id}/events",
                                             content=payload, headers={"content-type": "application/json"})
                    latencies.append(time.perf_counter() - t0)
                    if resp.status_code >= 300:
                        errors.append(f"HTTP {resp.status_code}: {resp.text[:200]}")
                if finish:
                    patch = {"status": {"state": "succeeded", "last_attempt_id": spans[0].attempt_id}}
                    resp = await client.patch(f"/api/rollouts/{spans[0].rollout_id}", json=patch)
                    if resp.status_code >= 300:
                        errors.append(f"PATCH HTTP {resp.status_code}: {resp.text[:200]}")
                    else:
                        finished[spans[0].rollout_id] = time.time()

        print("ready", flush=True)  # the parent samples the server's CPU counter here
        sys.stdin.readline()
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(runner() for _ in range(concurrency)))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"spans": spec.total_spans, "seconds": seconds, "client_cpu_s": cpu, "sent_bytes": sent_bytes, "errors": len(errors),
            "first_error": errors[0] if errors else None,
            "request_p50_ms": pct(latencies, 0.5) * 1000, "request_p99_ms": pct(latencies, 0.99) * 1000,
            **({"finished": finished} if finish else {})}


def _driver_main(args: argparse.Namespace) -> int:
    import asyncio

    spec = _spec(args)
    print(json.dumps(asyncio.run(_drive(args.url, spec, args.concurrency, setup=not args.no_setup, finish=args.finish))))
    return 0


# --------------------------------------------------------------------------- orchestration


def _spec(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(seed=args.seed, rollouts=args.rollouts, spans_per_rollout=args.spans_per_rollout,
                        llm_fraction=args.llm_fraction)


def _run_driver(cmd: list[str], server: Server) -> tuple[dict[str, Any], float]:
    """Run the client child; return its result and the server CPU seconds spent during the timed part."""
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        assert child.stdin is not None and child.stdout is not None
        line = child.stdout.readline()
        c0 = server.cpu_seconds()
        if line.strip() == "ready":
            child.stdin.write("go\n")
            child.stdin.flush()
        try:
            out, _ = child.communicate(timeout=600)
        except subprocess.TimeoutExpired as exc:
            child.kill()
            child.wait()
            raise BenchError("the Agent Lightning client took over 600s") from exc
        c1 = server.cpu_seconds()
        if child.returncode != 0 or line.strip() != "ready":
            err.seek(0)
            tail = err.read().strip().splitlines()
            raise BenchError(f"the Agent Lightning client failed: {tail[-1] if tail else child.returncode}")
    return json.loads(out.strip().splitlines()[-1]), c1 - c0


def run_bench(spec: WorkloadSpec, concurrency: int = 16, *, venv: Path = DEFAULT_VENV, port: int | None = None,
              quiet: bool = False) -> dict[str, Any]:
    """Install (once), start, ingest, count, restart, count. Returns the result dict; raises BenchError."""
    from bench.common import free_port
    from foundation.config import load_settings
    from rolloutbus.bench_settings import BenchSettings

    port = port or load_settings(BenchSettings).bench_al_port or free_port()  # a bad variable: before the install
    python = ensure_venv(venv, quiet=quiet)
    expected = size_summary(generate(spec))
    workdir = Path(tempfile.mkdtemp(prefix="rb-bench-al-"))
    server = Server(venv, port, workdir)
    try:
        server.start()
        drive, server_cpu = _run_driver(driver_command(python, server.url, spec, concurrency), server)
        before, tokens_before = count_queryable(server.url, spec)
        rss = server.peak_rss_mb()
        server.stop()
        server.start()
        after, tokens_after = count_queryable(server.url, spec)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "system": "agentlightning",
        "version": AL_VERSION,
        "store": "agl-server in-memory store (agentlightning.server.store: module-level dicts)",
        "persistent_backend": None,
        "workload": asdict(spec),
        "expected": expected,
        "concurrency": concurrency,
        "ingest_seconds": round(drive["seconds"], 3),
        "spans_per_s": round(drive["spans"] / drive["seconds"], 1),
        "server_cpu_s": round(server_cpu, 3),
        "client_cpu_s": round(drive["client_cpu_s"], 3),
        "spans_per_server_cpu_s": round(drive["spans"] / server_cpu, 1) if server_cpu else None,
        "sent_bytes": drive["sent_bytes"],
        "request_p50_ms": round(drive["request_p50_ms"], 2),
        "request_p99_ms": round(drive["request_p99_ms"], 2),
        "errors": drive["errors"],
        "first_error": drive["first_error"],
        "queryable_before_restart": before,
        "prompt_tokens_before_restart": tokens_before,
        "queryable_after_restart": after,
        "prompt_tokens_after_restart": tokens_after,
        "server_peak_rss_mb": round(rss, 1) if rss else None,
        "cores": os.cpu_count(),
    }


def format_table(r: dict[str, Any]) -> str:
    """The human table for one result dict."""
    e = r["expected"]
    rows = [
        ("workload", f"{e['spans']:,} spans ({e['llm']:,} LLM, {e['prompt_tokens']:,} prompt tokens), "
                     f"{r['workload']['rollouts']} rollouts, {r['concurrency']} concurrent runners"),
        ("spans ingested / s", f"{r['spans_per_s']:,.0f}  ({r['ingest_seconds']:.2f} s, {r['sent_bytes'] / 1e6:.1f} MB JSON)"),
        ("spans / server CPU-second", f"{r['spans_per_server_cpu_s']:,.0f}  (server {r['server_cpu_s']:.2f} s CPU, "
                                      f"client {r['client_cpu_s']:.2f} s CPU)"),
        ("request latency p50 / p99 (ms)", f"{r['request_p50_ms']:.1f} / {r['request_p99_ms']:.1f}"),
        ("rejected requests", f"{r['errors']}" + (f"  ({r['first_error']})" if r["first_error"] else "")),
        ("queryable before restart", f"{r['queryable_before_restart']:,} / {e['spans']:,} spans, "
                                     f"{r['prompt_tokens_before_restart']:,} / {e['prompt_tokens']:,} prompt tokens"),
        ("surviving a restart", f"{r['queryable_after_restart']:,} / {e['spans']:,} spans"),
        ("server peak RSS (MB)", f"{r['server_peak_rss_mb']}"),
    ]
    w = max(len(a) for a, _ in rows)
    head = f"Agent Lightning {r['version']} — {r['store']}; no persistent backend ships with it"
    return "\n".join([head, *(f"{a.ljust(w)}  {b}" for a, b in rows)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--spans-per-rollout", type=int, default=16)
    ap.add_argument("--llm-fraction", type=float, default=0.25)
    ap.add_argument("--concurrency", type=int, default=16, help="runners posting at once")
    ap.add_argument("--port", type=int, default=None, help="default: ROLLOUTBUS_BENCH_AL_PORT or a free port")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--no-setup", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--finish", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.driver:
        return _driver_main(args)
    try:
        # Never mix their dependency set into ours (or into whatever interpreter runs this file).
        if args.venv.resolve() in (Path(sys.prefix).resolve(), (ROOT / ".venv").resolve()):
            raise BenchError(f"refusing to install Agent Lightning into {args.venv}: give it a separate venv")
        result = run_bench(_spec(args), args.concurrency, venv=args.venv, port=args.port, quiet=args.json)
    except (BenchError, ValueError) as exc:
        print(f"agentlightning bench: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"system": "agentlightning", "version": AL_VERSION, "error": str(exc)}))
        return 2
    print(json.dumps(result) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
