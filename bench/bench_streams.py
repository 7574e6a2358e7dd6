"""Stream-worker benchmark: Kafka → ClickHouse throughput, and end-to-end latencies under live load.

    python -m bench.bench_streams [--small 600000] [--llm 100000] [--live-s 20] [--quick] [--json]

One stream worker (``python -m streams.cli``, a subprocess with its own data dir and embedded chDB
store) runs three phases, each on fresh topics and its own ClickHouse database:

1. **small** — a seeded backlog of rollouts (STARTED, small ``state`` spans, FINISHED) is produced to
   rb.spans first; then the worker starts. Throughput = spans / (time from the last metrics poll that
   saw 0 spans processed to the first that saw every span row *written* to ClickHouse,
   ``rolloutbus_streams_sink_rows_total{table="spans"}``). "Per core" divides by the worker's CPU
   seconds over the same window (utime+stime of all its threads, from /proc), so a busy shared machine
   does not count against it; the wall-clock rate is shown too.
2. **llm** — the same with LLM spans carrying 1,000-token prompts and 50-token responses; 100,000 of
   them, a window of 6–7 s, long enough to hold the merges of the worker's in-process store (with
   20,000, 1.8 s, whether one merge fell inside moved the figure between 10.6k and 15.3k per CPU-s).
3. **live** — rollouts (mixed small + LLM spans, groups of 4) are produced at a fixed pace while the
   worker runs. *group → batch*: from the bench's FINISHED emit of a group's last rollout to the
   bench's consumer receiving its GroupBatch on rb.batches (same clock). *rollout → queryable*: the
   embedded store belongs to the worker while it runs, so it is not queried directly; instead its
   /metrics are polled every 20 ms. A rollout's completion time is the timestamp of the summary the
   worker writes to ``<prefix>rollouts-done`` when it completes it (rounded up to the next ms); the
   rollout is queryable once the first ClickHouse flush that *started* after that ends. Flush ends and
   starts are bounded from the polls (``sink_flush_seconds`` count and sum), always on the late side,
   so the figure is an upper bound (≤ one poll interval plus one flush interval too high in the worst case).

After each phase the worker is stopped (SIGTERM: it flushes and commits) and, at the end, the bench
opens the worker's store and checks the row counts (``FINAL``). Peak RSS is the worker's VmHWM.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    ProcWatch,
    broker,
    child_env,
    free_port,
    fresh_topics,
    scrape,
    stop_process,
)
from bench.report import emit_json, log, pct, print_table
from foundation.config import Topics, load_settings
from producers.context import RolloutContext
from producers.emit import llm_record
from producers.spans import base_span
from producers.transport import SpanTransport
from rolloutbus.bench_settings import BenchSettings
from streams.rollout import RolloutResult

GROUP_SIZE = 4
PROMPT_TOKENS = 1000
RESPONSE_TOKENS = 50
SPANS_TOTAL = "rolloutbus_streams_spans_total"
ROWS_SPANS = 'rolloutbus_streams_sink_rows_total{table="spans"}'
FLUSH_COUNT = "rolloutbus_streams_sink_flush_seconds_count"
FLUSH_SUM = "rolloutbus_streams_sink_flush_seconds_sum"


# --------------------------------------------------------------------------- workload


class Workload:
    """Seeded rollouts: rewards, prompts and task ids come from one ``random.Random(seed)``."""

    def __init__(self, transport: SpanTransport, seed: int, label: str) -> None:
        self.t = transport
        self.rng = random.Random(seed)
        self.label = label
        self.prompt = [self.rng.randrange(32_000) for _ in range(PROMPT_TOKENS)]
        self.response = [self.rng.randrange(32_000) for _ in range(RESPONSE_TOKENS)]
        self.logprobs = [-self.rng.random() for _ in range(RESPONSE_TOKENS)]
        self.n_rollouts = 0

    def open(self) -> RolloutContext:
        i = self.n_rollouts
        self.n_rollouts += 1
        ctx = RolloutContext(f"{self.label}-{i // GROUP_SIZE}", resource_version=1, agent_name="bench", transport=self.t)
        ctx.started()
        return ctx

    def small(self, ctx: RolloutContext, i: int) -> None:
        ctx.send_span(base_span(ctx, "state", "state", {"state": f"observation {i}"}))

    def llm(self, ctx: RolloutContext) -> None:
        span = base_span(ctx, "llm", "llm")
        span["llm"] = llm_record(self.prompt, self.response, self.logprobs, model="bench", resource_version=1)
        ctx.send_span(span)

    def close(self, ctx: RolloutContext) -> None:
        ctx.set_reward(self.rng.random())
        ctx.finish("succeeded")


def produce_backlog(bootstrap: str, topics: Topics, spool: Path, n_spans: int, llm: bool, per_rollout: int, seed: int) -> tuple[int, float]:
    """Produce ``n_spans`` spans in whole rollouts (+ their events); returns (rollouts, seconds)."""
    t = SpanTransport({"bootstrap.servers": bootstrap}, topics.spans, spool, spool_name="bench", on_full="block")
    w = Workload(t, seed, "task")
    started = time.perf_counter()
    left = n_spans
    while left > 0:
        ctx = w.open()
        for i in range(min(per_rollout, left)):
            w.llm(ctx) if llm else w.small(ctx, i)
        left -= per_rollout
        w.close(ctx)
    undelivered = t.close(300)
    if undelivered:
        raise RuntimeError(f"{undelivered} records of the backlog were not delivered to Kafka")
    return w.n_rollouts, time.perf_counter() - started


# --------------------------------------------------------------------------- the worker


@dataclass
class WorkerRun:
    proc: subprocess.Popen[bytes]
    watch: ProcWatch
    metrics_url: str
    log_path: Path
    polls: list[tuple[float, float, dict[str, float]]] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start_worker(data_dir: Path, bootstrap: str, topics: Topics, database: str, scratch: Path, name: str) -> WorkerRun:
    port = free_port()
    env = child_env(data_dir, bootstrap, topics, ROLLOUTBUS_CLICKHOUSE_DATABASE=database)
    log_path = scratch / f"worker-{name}.log"
    out = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "--metrics-port", str(port), "--group-size", str(GROUP_SIZE)],
        # faust keeps its table data under ./<app id>-data: run in the scratch dir, not the checkout.
        cwd=scratch, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    out.close()
    return WorkerRun(proc, ProcWatch(proc.pid), f"http://127.0.0.1:{port}/metrics", log_path)


def _sum(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix + "{") or k == prefix)


def measure_throughput(run: WorkerRun, n_spans: int, timeout_s: float, cap_s: float) -> dict[str, float]:
    """Poll the worker until every span row is written; the rate over the processing window. After
    ``cap_s`` of processing the rate is taken over the rows written so far (``capped``), so a slow
    worker cannot make the whole bench overrun its time budget."""
    t0 = cpu0 = None
    last_log = time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not run.alive():
            raise RuntimeError(f"the stream worker exited with {run.proc.returncode}:\n{run.tail()}")
        run.watch.sample()
        m = scrape(run.metrics_url, timeout=5)
        now = time.monotonic()
        if m:
            processed = _sum(m, SPANS_TOTAL)
            rows = m.get(ROWS_SPANS, 0.0)
            if now - last_log >= 5:
                last_log = now
                log(f"  worker: {processed:,.0f} spans processed, {rows:,.0f} rows written, {m.get(FLUSH_COUNT, 0):.0f} flushes")
            if processed == 0:
                t0, cpu0 = now, run.watch.cpu_s()
            elif t0 is not None and (rows >= n_spans or now - t0 >= cap_s):
                cpu1 = run.watch.cpu_s()
                wall = now - t0
                cpu = (cpu1 - cpu0) if cpu1 is not None and cpu0 is not None else float("nan")
                done = int(min(rows, n_spans))
                return {"spans": done, "capped": rows < n_spans, "produced": n_spans, "wall_s": wall, "cpu_s": cpu, "spans_per_s": done / wall,
                        "spans_per_cpu_s": done / cpu if cpu > 0 else float("nan"),
                        "cores_used": cpu / wall if wall > 0 else float("nan")}
        # Each scrape costs the worker CPU (rendering every metric, reading /proc): at 20 a second it was
        # 6% of what the worker spent. Five a second keeps the window's ends within 0.2 s.
        time.sleep(0.2)
    raise RuntimeError(f"the stream worker did not write {n_spans} span rows within {timeout_s:.0f}s:\n{run.tail()}")


def throughput_phase(name: str, bootstrap: str, scratch: Path, worker_dir: Path, n_spans: int, llm: bool, seed: int,
                     cap_s: float = 60.0) -> dict[str, Any]:
    topics = fresh_topics(bootstrap, name)
    per_rollout = 8 if llm else 25
    rollouts, produce_s = produce_backlog(bootstrap, topics, scratch / f"spool-{name}", n_spans, llm, per_rollout, seed)
    log(f"{name}: {n_spans:,} spans in {rollouts:,} rollouts produced in {produce_s:.1f}s; starting the worker")
    db = f"bench_{name}"
    run = start_worker(worker_dir, bootstrap, topics, db, scratch, name)
    try:
        res = measure_throughput(run, n_spans, timeout_s=cap_s + 180.0, cap_s=cap_s)
    finally:
        run.watch.sample()
        rc = stop_process(run.proc)
    log(f"{name}: {res['spans_per_s']:,.0f} spans/s wall, {res['spans_per_cpu_s']:,.0f} per worker CPU-second; worker exit {rc}")
    return {**res, "rollouts": rollouts, "database": db, "peak_rss_mib": run.watch.peak_rss_mib, "exit_code": rc}


# --------------------------------------------------------------------------- live latency


class BatchWatcher(threading.Thread):
    """Consumes rb.batches; records when each GroupBatch arrived (bench clock)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0,
                           "fetch.wait.max.ms": 10})
        self.c.subscribe([topic])
        self.arrived: dict[str, tuple[float, bool]] = {}
        self.stop_flag = False

    def run(self) -> None:
        from schemas.codec import decode

        while not self.stop_flag:
            msg = self.c.poll(0.05)
            if msg is None or msg.error():
                continue
            now = time.time()
            try:
                batch = decode(msg.value(), "rolloutbus.GroupBatch")
            except Exception:  # noqa: BLE001 - a bench reader: count it as not arrived
                continue
            self.arrived.setdefault(batch.group_id, (now, batch.complete))
        self.c.close()


class MetricsPoller(threading.Thread):
    """Polls the worker's /metrics every ``interval_s``: (time before request, time after, metrics)."""

    def __init__(self, run: WorkerRun, interval_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.run_ = run
        self.interval_s = interval_s
        self.stop_flag = False

    def run(self) -> None:
        while not self.stop_flag:
            before = time.time()
            m = scrape(self.run_.metrics_url, timeout=2)
            after = time.time()
            if m:
                self.run_.polls.append((before, after, m))
            self.run_.watch.sample()
            time.sleep(self.interval_s)


def read_done_times(bootstrap: str, topic: str, expected: int, timeout_s: float = 30) -> dict[str, float]:
    """rollout_id → completion time in the worker (timestamp of its rollouts-done summary, + 1 ms)."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0})
    c.subscribe([topic])
    out: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            rid = RolloutResult.from_bytes(msg.value()).rollout_id
            out.setdefault(rid, (msg.timestamp()[1] + 1) / 1000.0)
    finally:
        c.close()
    return out


def flush_windows(polls: list[tuple[float, float, dict[str, float]]]) -> list[tuple[float, float]]:
    """(earliest possible start, latest possible end) of every flush, from consecutive polls."""
    out = []
    for (b0, _a0, m0), (_b1, a1, m1) in zip(polls, polls[1:]):
        n = int(m1.get(FLUSH_COUNT, 0) - m0.get(FLUSH_COUNT, 0))
        if n > 0:
            spent = m1.get(FLUSH_SUM, 0.0) - m0.get(FLUSH_SUM, 0.0)
            # Every flush ending in (b0, a1] started no earlier than b0 minus the time flushing took.
            out.extend([(b0 - spent, a1)] * n)
    return out


def queryable_times(done: dict[str, float], windows: list[tuple[float, float]]) -> dict[str, float]:
    """rollout_id → latest time its rows can have become queryable: the end of the first flush that
    surely started after the rollout completed."""
    out = {}
    for rid, c in done.items():
        for start_low, end_high in windows:
            if start_low > c:
                out[rid] = end_high
                break
    return out


def live_phase(bootstrap: str, scratch: Path, worker_dir: Path, seconds: float, rate: float, concurrency: int, seed: int) -> dict[str, Any]:
    topics = fresh_topics(bootstrap, "live")
    db = "bench_live"
    run = start_worker(worker_dir, bootstrap, topics, db, scratch, "live")
    watcher = BatchWatcher(bootstrap, topics.batches)
    watcher.start()
    t = SpanTransport({"bootstrap.servers": bootstrap}, topics.spans, scratch / "spool-live", spool_name="bench",
                      producer_overrides={"linger.ms": 2})
    try:
        # Warm-up: one group end to end, so the worker is consuming before the clock starts.
        warm = Workload(t, seed + 1, "warmup")
        for _ in range(GROUP_SIZE):
            ctx = warm.open()
            warm.small(ctx, 0)
            warm.close(ctx)
        deadline = time.monotonic() + 300
        while "warmup-0@1" not in watcher.arrived:
            if not run.alive():
                raise RuntimeError(f"the stream worker exited with {run.proc.returncode}:\n{run.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the warm-up group never reached {topics.batches}:\n{run.tail()}")
            time.sleep(0.1)
        log(f"live: worker ready; {rate:g} rollouts/s, {concurrency} in flight, for {seconds:g}s")
        poller = MetricsPoller(run)
        poller.start()
        res = _paced_load(t, seed, seconds, rate, concurrency)
        finished = res.pop("finished")
        # Wait for the last groups (a short tail: the load has stopped).
        groups = {rid_group for rid_group, _ in finished.values()}
        tail = time.monotonic() + 30
        while any(g not in watcher.arrived for g in groups) and time.monotonic() < tail:
            time.sleep(0.1)
        time.sleep(1.5)  # at least one more flush, for the queryable bound of the last rollouts
        poller.stop_flag = True
        poller.join()
    finally:
        t.close(60)
        run.watch.sample()
        rc = stop_process(run.proc)
        watcher.stop_flag = True
        watcher.join(5)

    group_last: dict[str, float] = {}
    for gid, t_fin in finished.values():
        group_last[gid] = max(group_last.get(gid, 0.0), t_fin)
    full = [g for g in group_last if sum(1 for gg, _ in finished.values() if gg == g) == GROUP_SIZE]
    batch_lat = [watcher.arrived[g][0] - group_last[g] for g in full if g in watcher.arrived]
    done = read_done_times(bootstrap, f"{topics.prefix}rollouts-done", len(finished) + GROUP_SIZE)
    done = {rid: c for rid, c in done.items() if rid in finished}
    q = queryable_times(done, flush_windows(run.polls))
    query_lat = [q[rid] - finished[rid][1] for rid in q]
    complete_lat = [done[rid] - finished[rid][1] for rid in done]
    flush_counts = [m.get(FLUSH_COUNT, 0) for _, _, m in run.polls]
    log(f"live: {len(batch_lat)}/{len(full)} groups batched, {len(query_lat)}/{len(finished)} rollouts bounded; worker exit {rc}")
    return {
        **res, "database": db, "rollouts": len(finished), "groups": len(full), "groups_batched": len(batch_lat),
        "rollouts_bounded": len(query_lat),
        "batch_p50_s": pct(batch_lat, 0.5), "batch_p99_s": pct(batch_lat, 0.99),
        "queryable_p50_s": pct(query_lat, 0.5), "queryable_p99_s": pct(query_lat, 0.99),
        "completed_p50_s": pct(complete_lat, 0.5), "completed_p99_s": pct(complete_lat, 0.99),
        "flushes": (flush_counts[-1] - flush_counts[0]) if flush_counts else 0,
        "peak_rss_mib": run.watch.peak_rss_mib, "exit_code": rc,
    }


def _paced_load(t: SpanTransport, seed: int, seconds: float, rate: float, concurrency: int) -> dict[str, Any]:
    """Start ``rate`` rollouts/s; each lasts ``concurrency / rate`` s and emits 6 small + 2 LLM spans
    spread over its life, then FINISHED. Returns rollout_id → (group id, FINISHED emit time)."""
    w = Workload(t, seed, "live")
    life = concurrency / rate
    plan = ["s", "s", "l", "s", "s", "l", "s", "s"]
    inflight: list[tuple[RolloutContext, float, list[int]]] = []
    finished: dict[str, tuple[str, float]] = {}
    spans = 0
    begin = time.monotonic()
    started = 0
    while True:
        now = time.monotonic()
        elapsed = now - begin
        if elapsed < seconds:
            while started < int(elapsed * rate) + 1:
                inflight.append((w.open(), now, [0]))
                started += 1
        elif not inflight:
            break
        keep = []
        for ctx, t0, done in inflight:
            due = min(len(plan), int(len(plan) * (now - t0) / life))
            while done[0] < due:
                w.llm(ctx) if plan[done[0]] == "l" else w.small(ctx, done[0])
                done[0] += 1
                spans += 1
            if done[0] == len(plan) and now - t0 >= life:
                w.close(ctx)
                finished[ctx.rollout_id] = (f"{ctx.task_id}@1", time.time())
            else:
                keep.append((ctx, t0, done))
        inflight = keep
        time.sleep(0.005)
    return {"finished": finished, "spans": spans, "load_s": time.monotonic() - begin, "rate": rate, "concurrency": concurrency}


# --------------------------------------------------------------------------- ingest, for the Agent Lightning ratio


def ingest_workload(bootstrap: str, scratch: Path, rollouts: int, spans_per_rollout: int, llm_fraction: float, seed: int) -> dict[str, Any]:
    """bench/workload.py's spans (the same spec the Agent Lightning bench sends to its store) through our
    producer SDK into rb.spans: conversion, Avro encoding, spool and delivery acknowledged by the broker
    are inside the timing, as JSON encoding and the HTTP round trip are on their side."""
    from bench.workload import WorkloadSpec, generate, to_avro

    spec = WorkloadSpec(seed=seed, rollouts=rollouts, spans_per_rollout=spans_per_rollout, llm_fraction=llm_fraction)
    data = generate(spec)  # generated before timing, as on their side
    n = sum(len(r) for r in data)
    topics = fresh_topics(bootstrap, "ingest")
    t = SpanTransport({"bootstrap.servers": bootstrap}, topics.spans, scratch / "spool-ingest", spool_name="bench", on_full="block")
    # Not timed: connect to the broker (their side creates its rollouts and connects before timing).
    t.emit("warmup", "rolloutbus.Span", to_avro(data[0][0]))
    t.flush(60)
    started = time.perf_counter()
    cpu0 = time.process_time()  # this process: the agent loop and the transport's thread (encode, spool, librdkafka)
    for spans in data:
        for span in spans:
            t.emit(span.rollout_id, "rolloutbus.Span", to_avro(span))
    left = t.flush(300)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    t.close(30)
    return {"spans": n, "undelivered": left, "seconds": seconds, "spans_per_s": n / seconds, "cpu_s": cpu,
            "spans_per_cpu_s": n / cpu if cpu > 0 else float("nan"), "workload": spec.__dict__}


# --------------------------------------------------------------------------- verification


def verify(worker_dir: Path, phases: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Row counts per phase, read with FINAL from the worker's store once it has exited."""
    from foundation.clickhouse import connect

    client = connect(f"chdb://{worker_dir.resolve()}/clickhouse", database=None)
    out = {}
    try:
        for name, res in phases.items():
            db = res["database"]
            spans = client.query(f"SELECT count() FROM {db}.spans FINAL").result_rows[0][0]
            rollouts = client.query(f"SELECT count() FROM {db}.rollouts FINAL").result_rows[0][0]
            out[name] = {"spans": int(spans), "rollouts": int(rollouts)}
    finally:
        client.close()
    return out


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap-s", type=float, default=60.0, help="most seconds of processing measured per throughput phase")
    # Backlogs long enough (6-8 s of processing each) that the worker's first second (consumer group
    # join, first inserts into a new table) and the timing of its store's merges do not decide the
    # figure. 150,000 small spans had become a 2 s window: 58-65k per CPU-s pipelined against 71-79k
    # with 600,000 (bench/results/streams-worker-2026-11-26/).
    ap.add_argument("--small", type=int, default=600_000, help="small spans in the backlog")
    ap.add_argument("--llm", type=int, default=100_000, help="LLM spans (1,000-token prompts) in the backlog")
    ap.add_argument("--live-s", type=float, default=20.0, help="seconds of paced live load")
    ap.add_argument("--live-rate", type=float, default=4.0, help="rollouts started per second in the live phase")
    ap.add_argument("--live-concurrency", type=int, default=8, help="rollouts in flight in the live phase")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--ingest-workload", action="store_true",
                    help="only: bench/workload.py's spans into Kafka through the producer SDK (the Agent Lightning comparison)")
    ap.add_argument("--rollouts", type=int, default=64, help="with --ingest-workload: the workload spec")
    ap.add_argument("--spans-per-rollout", type=int, default=16, help="with --ingest-workload")
    ap.add_argument("--llm-fraction", type=float, default=0.25, help="with --ingest-workload")
    args = ap.parse_args(argv)
    if args.ingest_workload:
        scratch = Path(tempfile.mkdtemp(prefix="rb-bench-ingest-"))
        with broker(scratch) as bootstrap:
            r = ingest_workload(bootstrap, scratch, args.rollouts, args.spans_per_rollout, args.llm_fraction, args.seed)
        shutil.rmtree(scratch, ignore_errors=True)
        if args.json:
            emit_json("ingest", {"ingest_spans_per_s": r["spans_per_s"], "ingest_spans_per_cpu_s": r["spans_per_cpu_s"]},
                      ["per CPU-second: the producer process's CPU (agent loop and transport thread), delivery to Kafka included"], run=r)
        else:
            print_table("our ingest of bench/workload.py (producer SDK → Kafka, delivered)", [
                (f"spans/s ({r['spans']:,} spans)", f"{r['spans_per_s']:,.0f}", ""),
                ("spans per producer CPU-second", f"{r['spans_per_cpu_s']:,.0f}", "")])
        return 0 if r["undelivered"] == 0 else 1
    if args.quick:
        args.small, args.llm, args.live_s = min(args.small, 10_000), min(args.llm, 2_000), min(args.live_s, 10.0)
        args.cap_s = min(args.cap_s, 30.0)

    scratch = Path(tempfile.mkdtemp(prefix="rb-bench-streams-"))
    worker_dir = scratch / "worker"
    phases: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    with broker(scratch) as bootstrap:
        phases["small"] = throughput_phase("small", bootstrap, scratch, worker_dir, args.small, False, args.seed, args.cap_s)
        phases["llm"] = throughput_phase("llm", bootstrap, scratch, worker_dir, args.llm, True, args.seed, args.cap_s)
        phases["live"] = live_phase(bootstrap, scratch, worker_dir, args.live_s, args.live_rate, args.live_concurrency, args.seed)
    counts = verify(worker_dir, phases)
    log(f"row counts (FINAL): {counts}")
    keep = load_settings(BenchSettings).bench_keep_logs
    if keep:  # the workers' logs, for looking into a slow run
        keep.mkdir(parents=True, exist_ok=True)
        for f in scratch.glob("worker-*.log"):
            shutil.copy(f, keep / f.name)
    shutil.rmtree(scratch, ignore_errors=True)
    for name in ("small", "llm"):
        ph, got = phases[name], counts[name]
        if ph["capped"]:
            # Stopped early: every row counted as written must be there (the worker flushed more on SIGTERM).
            ph["verified"] = ph["spans"] <= got["spans"] <= ph["produced"]
            notes.append(f"{name}: capped at {args.cap_s:g}s of processing; rate over the {ph['spans']:,} of "
                         f"{ph['produced']:,} spans written by then")
        else:
            ph["verified"] = got["spans"] == ph["spans"] and got["rollouts"] == ph["rollouts"]
        if not ph["verified"]:
            notes.append(f"{name}: ClickHouse holds {got['spans']} spans / {got['rollouts']} rollouts, expected {ph['spans']} / {ph['rollouts']}")
    live = phases["live"]
    live["verified"] = counts["live"]["rollouts"] == live["rollouts"] + GROUP_SIZE
    if not live["verified"]:
        notes.append(f"live: ClickHouse holds {counts['live']['rollouts']} rollouts, expected {live['rollouts'] + GROUP_SIZE} (incl. warm-up)")
    notes.append("per core = spans / worker CPU-seconds (all threads) over the processing window; wall = spans / wall seconds")
    notes.append("rollout → queryable is an upper bound from /metrics polls every 20 ms (flush windows), see the module docstring")
    rss = max(p["peak_rss_mib"] for p in phases.values())
    metrics = {
        "streams_small_spans_per_core": phases["small"]["spans_per_cpu_s"],
        "streams_small_spans_per_s": phases["small"]["spans_per_s"],
        "streams_llm_spans_per_core": phases["llm"]["spans_per_cpu_s"],
        "streams_llm_spans_per_s": phases["llm"]["spans_per_s"],
        "rollout_queryable_p50_s": live["queryable_p50_s"],
        "rollout_queryable_p99_s": live["queryable_p99_s"],
        "group_batch_p50_s": live["batch_p50_s"],
        "group_batch_p99_s": live["batch_p99_s"],
        "worker_peak_rss_mib": rss,
    }
    if args.json:
        emit_json("streams", metrics, notes, phases=phases, counts=counts)
    else:
        s, lm = phases["small"], phases["llm"]
        rows = [
            (f"small spans → ClickHouse, per core ({s['spans']:,})", f"{s['spans_per_cpu_s']:,.0f}/s", "≥ 20,000"),
            ("  wall-clock, one worker", f"{s['spans_per_s']:,.0f}/s (×{s['cores_used']:.2f} cores)", ""),
            (f"LLM spans → ClickHouse, per core ({lm['spans']:,})", f"{lm['spans_per_cpu_s']:,.0f}/s", "≥ 5,000"),
            ("  wall-clock, one worker", f"{lm['spans_per_s']:,.0f}/s (×{lm['cores_used']:.2f} cores)", ""),
            (f"rollout FINISHED → queryable p50 / p99 ({live['rollouts_bounded']} rollouts)",
             f"≤ {live['queryable_p50_s']:.2f} / ≤ {live['queryable_p99_s']:.2f} s", "p99 ≤ 2 s"),
            ("  FINISHED → completed in the worker p50 / p99", f"{live['completed_p50_s']:.2f} / {live['completed_p99_s']:.2f} s", ""),
            (f"group's last FINISHED → GroupBatch p50 / p99 ({live['groups_batched']} groups)",
             f"{live['batch_p50_s']:.2f} / {live['batch_p99_s']:.2f} s", "p99 ≤ 1 s"),
            ("worker peak RSS", f"{rss:,.0f} MiB", ""),
            ("row counts verified (FINAL)", "yes" if all(p["verified"] for p in phases.values()) else "NO", ""),
        ]
        print_table("stream worker benchmark (one worker, embedded chDB)", rows, notes)
    return 0 if all(p["verified"] for p in phases.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
