"""End to end, side by side: the same workload's spans into rolloutbus (gateway + stream worker + store),
Agent Lightning 1.0.2's server and Agent Lightning 0.3.0's store, each charged the CPU of all its
processes from the first request until every span can be read back. Prints a table; not a timed test.

    python -m bench.bench_e2e [--sizes 1000,10000,100000] [--mixes default,llm]
                              [--systems rolloutbus,al1,al03] [--json]

For each size N (whole rollouts of 16 spans) and each mix (``default``: bench/workload.py's quarter-LLM
mix with 1,000-token prompts; ``llm``: every span between the user message and the reward an LLM call,
14 of 16), the same seeded workload goes to:

- **rolloutbus** — ``rolloutbus store`` (ClickHouse engine over HTTP), ``rolloutbus process`` (the stream
  worker, writing to that store) and ``rolloutbus gateway``, three processes on one Kafka broker.
  A load generator (its own process, not charged) posts the workload as OTLP/HTTP protobuf bodies of
  512 spans (32 whole rollouts, as an OpenTelemetry batch exporter sends them) over 4 connections, and
  after each body's 200 ends those 32 attempts the Agent Lightning 0.3 way (``POST
  /v1/agl/rollouts/{id}/attempts/{id}`` ``{"status": "succeeded"}``). Charged: utime+stime of the three
  processes and their children, from the first request until ``SELECT count() FROM spans FINAL`` reaches
  N and every rollout's row is in ``rollouts``. The broker's CPU over the same window is shown beside.
  FINISHED → queryable: from the 200 of a rollout's update to the poll that first saw its ``rollouts``
  row (polled every 0.2 s: an upper bound by up to one poll).
- **Agent Lightning 1.0.2** — ``agl-server`` (its store: module-level dicts), fed by its own
  ``AgentLightningAsyncClient``, one event per span (it has no OTLP or batch endpoint), 16 runners at
  once (``agentlightning_store.py``'s driver). Charged: the server's CPU until the last event's reply
  (its events are readable once answered); then every rollout's events are read back and counted.
- **Agent Lightning 0.3.0** — ``agl store --backend memory`` (``LightningStoreServer`` over
  ``InMemoryLightningStore``), fed the same OTLP bodies at its ``/v1/traces`` by the same load generator,
  and the same attempt updates. Its store only takes spans of rollouts it created, so the rollouts are
  created first (``POST /v1/agl/rollouts``, not charged) and the bodies carry its rollout and attempt ids
  instead of ours (same lengths within a few bytes). Charged: the server's CPU until the last reply; then
  every rollout's spans are read back (``GET /v1/agl/spans``) and counted.

Neither Agent Lightning store keeps anything across a restart (both in memory); rolloutbus's spans are in
Kafka (replayable) and in ClickHouse's MergeTree files. See bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import workload
from bench.common import (
    ROOT,
    child_env,
    free_port,
    fresh_topics,
    http_ok,
    peak_rss_mib,
    start_logged,
    stop_process,
    tree_cpu_s,
    wait_ready,
)
from bench.loadgen import fan_out, http_json, post, rejected_spans
from bench.report import emit_json, log, pct
from foundation.venvs import AL03_PINS, AL03_VERSION, CACHE, ensure_venv
from bench.workload import SPANS_PER_ROLLOUT, SynthSpan, WorkloadSpec, iter_rollouts

BODY_ROLLOUTS = 32  # 512 spans per OTLP request
CONNECTIONS = 4
MIXES = {"default": 0.25, "llm": 1.0}
SYSTEMS = ("rolloutbus", "al1", "al03", "rbev")  # rbev: rolloutbus fed the way al1 is (not run unless asked)
DEFAULT_SYSTEMS = ("rolloutbus", "al1", "al03")
LABELS = {"rolloutbus": "rolloutbus (gateway + worker + store)", "al1": "Agent Lightning 1.0.2 server",
          "al03": "Agent Lightning 0.3.0 store", "rbev": "rolloutbus fed as 1.0.2 is (one event per span)"}
AL03_VENV = CACHE / f"bench-agentlightning-{AL03_VERSION}"  # the pins are the tests' (foundation/venvs.py)
FINISH_GRACE_S = 0.5
POLL_S = 0.2


class BenchError(Exception):
    """A step that cannot go on; the message is the one line shown."""


# --------------------------------------------------------------------------- pure helpers


def spec_for(spans: int, mix: str, seed: int = 7) -> WorkloadSpec:
    """The workload with ``spans`` spans (whole rollouts of 16) in the named mix."""
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}: choose from {', '.join(MIXES)}")
    return workload.spec_for(spans, MIXES[mix], seed)


def cost_growth(us_per_span: dict[int, float]) -> str:
    """How CPU per span moves from the smallest N to the largest: ``flat`` within ±15 %, else the factor.
    ``{1000: 100.0, 100000: 104.0}`` → ``'flat (×1.04)'``; ``{1000: 100.0, 100000: 250.0}`` → ``'grows ×2.50'``."""
    sizes = sorted(n for n, v in us_per_span.items() if v and v == v)
    if len(sizes) < 2:
        return "—"
    factor = us_per_span[sizes[-1]] / us_per_span[sizes[0]]
    if 1 / 1.15 <= factor <= 1.15:
        return f"flat (×{factor:.2f})"
    return f"{'grows' if factor > 1 else 'falls'} ×{factor:.2f}"


# --------------------------------------------------------------------------- the broker's CPU


def find_broker_pid(bootstrap: str) -> int | None:
    """The pid of the local broker listening on ``bootstrap``'s port (its ``server.properties`` names it),
    or None (a remote cluster, or not found)."""
    port = bootstrap.rsplit(":", 1)[-1]
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            args = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for a in args:
            if a.endswith(b"server.properties"):
                try:
                    text = Path(a.decode()).read_text()
                except (OSError, UnicodeDecodeError):
                    continue
                if any(ln.startswith("listeners=") and f":{port}," in ln + "," for ln in text.splitlines()):
                    return int(d)
    return None


# --------------------------------------------------------------------------- the OTLP load generator


def otlp_chunks(spec: WorkloadSpec, ids: dict[str, list[str]] | None = None,
                tokens_sent: list[int] | None = None) -> Iterator[tuple[bytes, list[tuple[str, str]]]]:
    """(OTLP body of 32 whole rollouts, their (rollout id, attempt id)) in workload order; ``ids`` renames
    ours to another store's ids; ``tokens_sent[0]`` counts the prompt token ids put in."""
    tokens_sent = tokens_sent if tokens_sent is not None else [0]
    from bench.bench_paths import otlp_bodies

    chunk: list[list[SynthSpan]] = []

    def body() -> tuple[bytes, list[tuple[str, str]]]:
        bodies, _ = otlp_bodies(chunk)
        assert len(bodies) == 1
        return bodies[0], [(r[0].rollout_id, r[0].attempt_id) for r in chunk]

    for spans in iter_rollouts(spec):
        tokens_sent[0] += sum(len(s.prompt_token_ids) for s in spans)
        if ids:
            rid, aid = ids[spans[0].rollout_id]
            spans = [dataclasses.replace(s, rollout_id=rid, attempt_id=aid) for s in spans]
        chunk.append(spans)
        if len(chunk) == BODY_ROLLOUTS:
            yield body()
            chunk = []
    if chunk:
        yield body()


def paced_at(started: float, index: int, rate: float | None, per_item: int = BODY_ROLLOUTS * SPANS_PER_ROLLOUT) -> float:
    """When body ``index`` may go at ``rate`` spans per second offered (body 0 at ``started``); ``started`` when
    unpaced. ``paced_at(100.0, 10, 5120.0)`` → 101.0 (ten bodies of 512 spans at 5,120 spans/s)."""
    return started if not rate else started + index * per_item / rate


def loadgen(url: str, spec: WorkloadSpec, ids: dict[str, list[str]] | None, connections: int,
            rate: float | None = None) -> dict[str, Any]:
    """Build the bodies (untimed), say ``ready``, wait for a line on stdin, post them; after each body's
    200, end its rollouts' attempts. Returns counts and the wall time of each attempt update's reply.
    ``rate``: spans per second offered (body i goes no earlier than i bodies' worth after the first), so
    latency is measured at a load the machine keeps up with; None: as fast as the gateway takes them."""
    tokens = [0]
    chunks = [(i, *c) for i, c in enumerate(otlp_chunks(spec, ids, tokens))]
    print("ready", flush=True)
    sys.stdin.readline()
    lock = threading.Lock()
    out: dict[str, Any] = {"ok": 0, "http_errors": 0, "rejected": 0, "first_error": None, "finished": {}, "sent_bytes": 0,
                           "prompt_tokens_sent": tokens[0]}
    update = json.dumps({"status": "succeeded"}).encode()

    def fail(msg: str) -> None:
        with lock:
            out["http_errors"] += 1
            out["first_error"] = out["first_error"] or msg

    t0: list[float] = []

    def send(conn: http.client.HTTPConnection, item: tuple[int, bytes, list[tuple[str, str]]]) -> None:
        index, data, attempts = item
        with lock:
            t0[:] = t0 or [time.time()]
        wait = paced_at(t0[0], index, rate) - time.time()
        if wait > 0:
            time.sleep(wait)
        status, raw = post(conn, "/v1/traces", data, "application/x-protobuf")
        if status != 200:
            fail(f"/v1/traces HTTP {status}: {raw[:200]!r}")
            return
        rejected = rejected_spans(raw)
        with lock:
            out["ok"] += 1
            out["sent_bytes"] += len(data)
            out["rejected"] += rejected
        for rid, aid in attempts:
            status, raw = post(conn, f"/v1/agl/rollouts/{rid}/attempts/{aid}", update, "application/json")
            if status != 200:
                fail(f"update_attempt HTTP {status}: {raw[:200]!r}")
                continue
            with lock:
                out["finished"][rid] = time.time()

    out["started"], out["ended"] = fan_out(url, chunks, connections, send, timeout=300)
    return out


class LoadGen:
    """The load generator as a child process (this file with ``--loadgen``): bodies are built before
    :meth:`go`, so their building is never in anyone's CPU window."""

    def __init__(self, url: str, spec: WorkloadSpec, scratch: Path, ids: dict[str, list[str]] | None = None,
                 cmd: list[str] | None = None, rate: float | None = None) -> None:
        if cmd is None:
            cmd = [sys.executable, "-m", "bench.bench_e2e", "--loadgen", url, "--rollouts", str(spec.rollouts),
                   "--llm-fraction", str(spec.llm_fraction), "--seed", str(spec.seed)]
            if rate:
                cmd += ["--rate", str(rate)]
            if ids:
                path = scratch / "ids.json"
                path.write_text(json.dumps(ids))
                cmd += ["--ids", str(path)]
        self.err = open(scratch / "loadgen.err", "w+")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise BenchError(f"the load generator failed: {self._tail()}")
        # Its result (every attempt's reply time) outgrows the pipe's buffer: read it while it runs, or it
        # blocks on the write and never exits.
        self._out: list[str] = []
        self._reader = threading.Thread(target=lambda: self._out.append(self.proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
        self._reader.start()

    def _tail(self) -> str:
        self.err.seek(0)
        lines = [ln for ln in self.err.read().strip().splitlines() if ln.strip()]
        return lines[-1] if lines else f"exit {self.proc.poll()}"

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            self.proc.wait(timeout=timeout)
            self._reader.join(timeout=60)
            out = "".join(self._out)
        except subprocess.TimeoutExpired as exc:
            self.proc.kill()
            self.proc.wait()
            raise BenchError(f"the load generator took over {timeout:.0f}s") from exc
        if self.proc.returncode != 0:
            raise BenchError(f"the load generator failed: {self._tail()}")
        self.err.close()
        return json.loads(out.strip().splitlines()[-1])

    def done(self) -> bool:
        return self.proc.poll() is not None


# --------------------------------------------------------------------------- processes


class Store:
    """ClickHouse's HTTP interface of ``rolloutbus store``: one query, TSV rows back."""

    def __init__(self, port: int, database: str) -> None:
        self.url = f"http://127.0.0.1:{port}/?database={database}"

    def rows(self, sql: str) -> list[list[str]]:
        req = urllib.request.Request(self.url, data=sql.encode(), method="POST", headers={"Content-Type": "text/plain"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as exc:
            raise BenchError(f"the store refused {sql[:60]!r}: HTTP {exc.code} {exc.read()[:300]!r}") from exc
        return [ln.split("\t") for ln in text.splitlines() if ln]


# --------------------------------------------------------------------------- (a) rolloutbus


def al1_driver(url: str, spec: WorkloadSpec, *, setup: bool, finish: bool) -> list[str]:
    """The command of agentlightning_store.py's client (Agent Lightning 1.0.2's own, 16 runners) at ``url``."""
    from bench import agentlightning_store as al

    return al.driver_command(al.ensure_venv(al.DEFAULT_VENV, quiet=True), url, spec, 16, setup=setup, finish=finish)


def run_rolloutbus(spec: WorkloadSpec, bootstrap: str, broker_pid: int | None, scratch: Path, timeout: float,
                   events: bool = False, rate: float | None = None) -> dict[str, Any]:
    """``events``: fed as Agent Lightning 1.0.2's client feeds its server (one event per span, 16 runners,
    ``PATCH`` to succeeded after each rollout) instead of OTLP bodies."""
    from foundation.clickhouse import connect, migrate

    n = spec.total_spans
    topics = fresh_topics(bootstrap, "e2e")
    database = f"bench_e2e_{os.getpid()}_{int(time.time())}"
    store_port, gw_port, metrics_port = free_port(), free_port(), free_port()
    dsn = f"http://127.0.0.1:{store_port}"
    cli = [sys.executable, "-m", "rolloutbus.cli"]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        env = child_env(scratch / "store", bootstrap, topics)
        procs["store"] = start_logged([*cli, "--data-dir", str(scratch / "store"), "store", "--port", str(store_port)],
                                      scratch / "store.log", env, scratch)
        wait_ready("rolloutbus store", lambda: http_ok(f"{dsn}/ping"), procs["store"], scratch / "store.log", error=BenchError)
        client = connect(dsn, database=database)
        migrate(client, database)
        client.close()
        env = child_env(scratch / "worker", bootstrap, topics, ROLLOUTBUS_CLICKHOUSE_DSN=dsn,
                        ROLLOUTBUS_CLICKHOUSE_DATABASE=database)
        procs["worker"] = start_logged([*cli, "--data-dir", str(scratch / "worker"), "process", "--metrics-port", str(metrics_port),
                                        "--finish-grace", str(FINISH_GRACE_S)], scratch / "worker.log", env, scratch)
        wait_ready("rolloutbus process", lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), procs["worker"],
                   scratch / "worker.log", error=BenchError)
        env = child_env(scratch / "gateway", bootstrap, topics, ROLLOUTBUS_CLICKHOUSE_DSN=dsn,
                        ROLLOUTBUS_CLICKHOUSE_DATABASE=database)
        procs["gateway"] = start_logged([*cli, "--data-dir", str(scratch / "gateway"), "gateway", "--port", str(gw_port)],
                                        scratch / "gateway.log", env, scratch)
        wait_ready("rolloutbus gateway", lambda: http_ok(f"http://127.0.0.1:{gw_port}/healthz"), procs["gateway"],
                   scratch / "gateway.log", error=BenchError)

        gw_url = f"http://127.0.0.1:{gw_port}"
        lg = LoadGen(gw_url, spec, scratch, cmd=al1_driver(gw_url, spec, setup=False, finish=True) if events else None, rate=rate)
        time.sleep(1.0)  # let start-up work settle before the window opens
        cpu0 = {k: tree_cpu_s(p.pid) for k, p in procs.items()}
        broker0 = tree_cpu_s(broker_pid) if broker_pid else None
        t0 = time.time()
        lg.go()
        store = Store(store_port, database)
        seen: dict[str, float] = {}
        count, last_ns = 0, 0
        deadline = time.monotonic() + timeout
        while True:
            for name, p in procs.items():
                if p.poll() is not None:
                    raise BenchError(f"rolloutbus {name} exited with {p.returncode}; see {scratch / (name + '.log')}")
            now = time.time()
            for rid, upd in store.rows(f"SELECT rollout_id, updated_ns FROM rollouts WHERE updated_ns >= {last_ns}"):
                seen.setdefault(rid, now)
                last_ns = max(last_ns, int(upd) - 5_000_000_000)  # rows of one flush can carry earlier stamps
            # The count of every span (a FINAL read of the whole table, charged to the store) only once
            # every rollout's row is seen and the load is sent: it cannot reach n before.
            if len(seen) >= spec.rollouts and lg.done():
                count = int(store.rows("SELECT count() FROM spans FINAL")[0][0])
                if count >= n:
                    break
            if time.monotonic() > deadline:
                raise BenchError(f"rolloutbus: {count:,} of {n:,} spans and {len(seen):,} of {spec.rollouts:,} rollouts "
                                 f"queryable after {timeout:.0f}s")
            time.sleep(POLL_S)
        t1 = time.time()
        cpu1 = {k: tree_cpu_s(p.pid) for k, p in procs.items()}
        broker1 = tree_cpu_s(broker_pid) if broker_pid else None
        res = lg.result(60)
        if events:  # the driver's result, in the load generator's terms
            res = {"http_errors": res["errors"], "rejected": 0, "first_error": res["first_error"], "sent_bytes": res["sent_bytes"],
                   "prompt_tokens_sent": None, "finished": res["finished"], "ended": res["seconds"] + t0}
        rss = {k: peak_rss_mib(p.pid) for k, p in procs.items()}
        tokens = int(store.rows("SELECT sum(length(prompt_token_ids)) FROM spans FINAL")[0][0])
        finished = res["finished"]
        lat = [seen[r] - t for r, t in finished.items() if r in seen]
        cpu = {k: cpu1[k] - cpu0[k] for k in procs}
        total = sum(cpu.values())
        out = {
            "system": "rbev" if events else "rolloutbus", "spans": n, "queryable": count, "prompt_tokens": tokens,
            "wall_s": t1 - t0, "cpu_s": total, "cpu_by_process": cpu,
            "broker_cpu_s": (broker1 - broker0) if broker0 is not None and broker1 is not None else None,
            "http_errors": res["http_errors"], "rejected": res["rejected"], "first_error": res["first_error"],
            "sent_bytes": res["sent_bytes"], "prompt_tokens_sent": res["prompt_tokens_sent"],
            "finished_to_queryable_p50_s": pct(lat, 0.5), "finished_to_queryable_p99_s": pct(lat, 0.99),
            "finished_to_queryable_max_s": max(lat) if lat else float("nan"),
            "last_reply_to_all_queryable_s": t1 - res["ended"], "peak_rss_mib": rss,
            "finish_grace_s": FINISH_GRACE_S, "offered_spans_per_s": rate,
        }
        return out
    finally:
        for name in ("gateway", "worker", "store"):
            stop_process(procs.get(name))


# --------------------------------------------------------------------------- (b) Agent Lightning 1.0.2


def run_al1(spec: WorkloadSpec, scratch: Path, timeout: float) -> dict[str, Any]:
    from bench import agentlightning_store as al

    class TreeServer(al.Server):
        def cpu_seconds(self) -> float:
            return tree_cpu_s(self.proc.pid) if self.proc is not None else 0.0

    python = al.ensure_venv(al.DEFAULT_VENV, quiet=True)
    server = TreeServer(al.DEFAULT_VENV, free_port(), scratch)
    try:
        server.start()
        drive, cpu = al._run_driver(al.driver_command(python, server.url, spec, 16), server)
        rss = peak_rss_mib(server.proc.pid) if server.proc else None
        events, tokens = al.count_queryable(server.url, spec)
    finally:
        server.stop()
    return {"system": "al1", "version": al.AL_VERSION, "spans": spec.total_spans, "queryable": events, "prompt_tokens": tokens,
            "wall_s": drive["seconds"], "cpu_s": cpu, "client_cpu_s": drive["client_cpu_s"], "http_errors": drive["errors"],
            "first_error": drive["first_error"], "sent_bytes": drive["sent_bytes"], "peak_rss_mib": {"server": rss},
            "request_p99_ms": drive["request_p99_ms"]}


# --------------------------------------------------------------------------- (c) Agent Lightning 0.3.0


def ensure_al03(venv: Path = AL03_VENV) -> Path:
    """Agent Lightning 0.3.0 (Python 3.11, the OTel pin) in its own venv, installed once."""
    from foundation.config import load_settings
    from rolloutbus.bench_settings import BenchSettings

    base = str(load_settings(BenchSettings).bench_al03_python or sys.executable)
    return ensure_venv(venv, AL03_PINS, base=lambda: base, error=BenchError)


def run_al03(spec: WorkloadSpec, scratch: Path, timeout: float) -> dict[str, Any]:
    python = ensure_al03()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = scratch / "al03.log"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "AGENTOPS_API_KEY": ""}
    proc = start_logged([str(python), "-m", "agentlightning.cli.store", "--host", "127.0.0.1", "--port", str(port),
                         "--backend", "memory", "--log-level", "WARNING"], log, env, scratch)
    try:
        wait_ready("agl store (0.3.0)", lambda: http_ok(f"{url}/v1/agl/health"), proc, log, error=BenchError)
        ids: dict[str, list[str]] = {}
        for i in range(spec.rollouts):  # not charged: its store takes spans only for rollouts it created
            ours = f"ro-{spec.seed}-{i:06d}"
            r = http_json("POST", f"{url}/v1/agl/rollouts", {"input": {"data_id": ours}}, timeout=120)
            ids[ours] = [r["rollout_id"], r["attempt"]["attempt_id"]]
        lg = LoadGen(url, spec, scratch, ids)
        time.sleep(1.0)
        cpu0 = tree_cpu_s(proc.pid)
        lg.go()
        res = lg.result(timeout)
        cpu1 = tree_cpu_s(proc.pid)
        rss = peak_rss_mib(proc.pid)
        spans = tokens = 0
        for rid, _aid in ids.values():  # read back: every span and its prompt token ids
            page = http_json("GET", f"{url}/v1/agl/spans?rollout_id={rid}&limit=1000", timeout=120)
            items = page["items"] if isinstance(page, dict) else page
            spans += len(items)
            tokens += sum(len(s["attributes"].get("prompt_token_ids") or []) for s in items)
        if proc.poll() is not None:
            raise BenchError(f"agl store exited with {proc.returncode}; see {log}")
    finally:
        stop_process(proc)
    return {"system": "al03", "version": AL03_VERSION, "spans": spec.total_spans, "queryable": spans, "prompt_tokens": tokens,
            "wall_s": res["ended"] - res["started"], "cpu_s": cpu1 - cpu0, "http_errors": res["http_errors"],
            "rejected": res["rejected"], "first_error": res["first_error"], "sent_bytes": res["sent_bytes"],
            "prompt_tokens_sent": res["prompt_tokens_sent"], "peak_rss_mib": {"server": rss}}


# --------------------------------------------------------------------------- orchestration and table


def run_all(sizes: list[int], mixes: list[str], systems: list[str], timeout: float, rate: float | None = None) -> dict[str, Any]:
    """Each system at each size and mix, one after the other on one broker; ``rate``: rolloutbus's load paced (see
    :func:`loadgen`)."""
    from bench.common import broker

    results: list[dict[str, Any]] = []
    loads: list[list[float]] = []
    scratch_root = Path(tempfile.mkdtemp(prefix="rb-bench-e2e-"))
    try:
        with broker(scratch_root) as bootstrap:
            broker_pid = find_broker_pid(bootstrap)
            for mix in mixes:
                for n in sizes:
                    spec = spec_for(n, mix)
                    for system in systems:
                        scratch = scratch_root / f"{system}-{mix}-{n}"
                        scratch.mkdir()
                        load0 = os.getloadavg()
                        log(f"{LABELS[system]}: {spec.total_spans:,} spans, mix {mix} (load {load0[0]:.1f})")
                        try:
                            if system in ("rolloutbus", "rbev"):
                                r = run_rolloutbus(spec, bootstrap, broker_pid, scratch, timeout, events=system == "rbev", rate=rate)
                            elif system == "al1":
                                r = run_al1(spec, scratch, timeout)
                            else:
                                r = run_al03(spec, scratch, timeout)
                        except BenchError as exc:
                            r = {"system": system, "spans": spec.total_spans, "error": str(exc)}
                            log(f"  failed: {exc}")
                        r.update(mix=mix, n=n, load_1min=[round(load0[0], 2), round(os.getloadavg()[0], 2)])
                        if r.get("cpu_s"):
                            r["spans_per_cpu_s"] = r["spans"] / r["cpu_s"]
                            r["us_per_span"] = r["cpu_s"] / r["spans"] * 1e6
                            log(f"  {r['spans_per_cpu_s']:,.0f} spans per CPU-s ({r['cpu_s']:.1f} CPU-s, "
                                f"{r['queryable']:,} queryable, wall {r['wall_s']:.1f} s)")
                        loads.append(list(os.getloadavg()))
                        results.append(r)
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    return {"results": results, "cores": os.cpu_count()}


def _f(v: Any, digits: int = 0, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "—"
    return f"{v:,.{digits}f}{unit}"


def table(out: dict[str, Any]) -> str:
    """The per-run table, then per-mix growth and the ratios at the largest N."""
    rs = out["results"]
    lines = ["| N | mix | system | spans per CPU-s | µs CPU per span | CPU-s (by process) | queryable | "
             "FINISHED→queryable p50 / p99 s | wall s | load 1-min |", "|" + " --- |" * 10]
    for r in rs:
        if "error" in r:
            lines.append(f"| {r['spans']:,} | {r['mix']} | {LABELS[r['system']]} | failed: {r['error'][:120]} | | | | | | |")
            continue
        by = ", ".join(f"{k} {v:.1f}" for k, v in r.get("cpu_by_process", {}).items())
        if r.get("broker_cpu_s") is not None:
            by += f"; broker {r['broker_cpu_s']:.1f} not incl."
        lat = (f"{_f(r.get('finished_to_queryable_p50_s'), 2)} / {_f(r.get('finished_to_queryable_p99_s'), 2)}"
               if r["system"] in ("rolloutbus", "rbev") else "at the reply (memory)")
        label = LABELS[r["system"]] + (f", {r['offered_spans_per_s']:,.0f} spans/s offered" if r.get("offered_spans_per_s") else "")
        lines.append(f"| {r['spans']:,} | {r['mix']} | {label} | {_f(r['spans_per_cpu_s'])} | "
                     f"{_f(r['us_per_span'], 1)} | {_f(r['cpu_s'], 1)}{' (' + by + ')' if by else ''} | "
                     f"{r['queryable']:,} / {r['spans']:,} ({r['prompt_tokens'] / 1e6:.2f} M prompt tokens) | {lat} | {_f(r['wall_s'], 1)} | "
                     f"{r['load_1min'][0]:.1f} → {r['load_1min'][1]:.1f} |")
    lines += ["", "| mix | system | CPU per span, smallest → largest N |", "| --- | --- | --- |"]
    for mix in dict.fromkeys(r["mix"] for r in rs):
        for system in dict.fromkeys(r["system"] for r in rs):
            us = {r["n"]: r["us_per_span"] for r in rs if r["mix"] == mix and r["system"] == system and "us_per_span" in r}
            lines.append(f"| {mix} | {LABELS[system]} | {cost_growth(us)} "
                         f"({', '.join(f'{n:,}: {v:.0f} µs' for n, v in sorted(us.items()))}) |")
    lines += ["", "| N | mix | rolloutbus vs AL 1.0.2 (target ≥ 50×) | rolloutbus vs AL 0.3.0 | "
              "the same with the broker's CPU counted as ours | FINISHED→queryable p99 (≤ 2 s) |", "| --- | --- | --- | --- | --- | --- |"]
    for key in dict.fromkeys((r["n"], r["mix"]) for r in rs):
        by = {r["system"]: r for r in rs if (r["n"], r["mix"]) == key and "spans_per_cpu_s" in r}
        ours = by.get("rolloutbus")
        if not ours:
            continue
        r1 = ours["spans_per_cpu_s"] / by["al1"]["spans_per_cpu_s"] if "al1" in by else None
        r3 = ours["spans_per_cpu_s"] / by["al03"]["spans_per_cpu_s"] if "al03" in by else None
        p99 = ours.get("finished_to_queryable_p99_s")
        with_broker = "—"
        if ours.get("broker_cpu_s") is not None:
            b = ours["spans"] / (ours["cpu_s"] + ours["broker_cpu_s"])
            with_broker = " / ".join(_f(b / by[k]["spans_per_cpu_s"], 1, "×") if k in by else "—" for k in ("al1", "al03"))
        if "rbev" in by and "al1" in by:  # the OTLP figure stays the headline; the like-for-like one goes beside it
            ev = by["rbev"]["spans_per_cpu_s"] / by["al1"]["spans_per_cpu_s"]
            with_broker += f"; fed as 1.0.2 is: {ev:.1f}×"
        lines.append(f"| {key[0]:,} | {key[1]} | {_f(r1, 1, '×')}{'' if r1 is None else (' met' if r1 >= 50 else ' NOT met')} | "
                     f"{_f(r3, 1, '×')} | {with_broker} | {_f(p99, 2)}{'' if p99 is None or p99 != p99 else (' met' if p99 <= 2 else ' NOT met')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000", help="comma-separated span counts (whole rollouts of 16)")
    ap.add_argument("--spans", type=int, default=None, help="one size (overrides --sizes)")
    ap.add_argument("--mixes", default="default,llm", help=f"comma-separated: {', '.join(MIXES)}")
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"comma-separated: {', '.join(SYSTEMS)}")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one system may take at one size")
    ap.add_argument("--rate", type=float, default=None,
                    help="spans per second offered to rolloutbus (paced bodies); unset: as fast as the gateway takes them")
    ap.add_argument("--json", action="store_true", help="print one JSON object after the table")
    ap.add_argument("--loadgen", help=argparse.SUPPRESS)
    ap.add_argument("--rollouts", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--llm-fraction", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=7, help=argparse.SUPPRESS)
    ap.add_argument("--ids", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.loadgen:
        spec = WorkloadSpec(seed=args.seed, rollouts=args.rollouts, spans_per_rollout=SPANS_PER_ROLLOUT,
                            llm_fraction=args.llm_fraction)
        ids = json.loads(args.ids.read_text()) if args.ids else None
        print(json.dumps(loadgen(args.loadgen, spec, ids, CONNECTIONS, args.rate)))
        return 0
    sizes = [args.spans] if args.spans else [int(x) for x in args.sizes.split(",") if x.strip()]
    mixes = [m for m in args.mixes.split(",") if m]
    systems = [s for s in args.systems.split(",") if s]
    bad = [m for m in mixes if m not in MIXES] + [s for s in systems if s not in SYSTEMS]
    if bad:
        print(f"bench_e2e: unknown mix or system {', '.join(bad)}", file=sys.stderr)
        return 2
    out = run_all(sizes, mixes, systems, args.timeout, args.rate)
    print(table(out))
    if args.json:
        metrics: dict[str, Any] = {}
        rs = out["results"]
        big = max(sizes)
        for r in rs:
            if r["n"] == big and r["mix"] == "default" and "spans_per_cpu_s" in r:
                metrics[f"e2e_{r['system']}_spans_per_cpu_s"] = r["spans_per_cpu_s"]
                if r["system"] == "rolloutbus":
                    metrics["e2e_finished_to_queryable_p50_s"] = r["finished_to_queryable_p50_s"]
                    metrics["e2e_finished_to_queryable_p99_s"] = r["finished_to_queryable_p99_s"]
        metrics["e2e_spans"] = big
        emit_json("e2e", metrics, [f"rolloutbus runs its worker with --finish-grace {FINISH_GRACE_S}"], table=table(out), **out)
    return 0 if all("error" not in r for r in out["results"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
