"""Gateway benchmark: spans/s through OTLP/HTTP protobuf into Kafka, per gateway core.

    python -m bench.bench_gateway [--requests 200] [--batch 512] [--connections 2] [--quick] [--json]

One gateway process (``python -m producers.ingest.gateway_cli``, its own data dir) on the bench broker; a
load generator in a separate process (this module with ``--loadgen``) posts ExportTraceServiceRequest
bodies of ``--batch`` spans each over keep-alive HTTP connections. Throughput = spans / (time from the
first request to the spans topic holding every span, counted by its watermarks). "Per core" divides by
the gateway's CPU seconds (utime+stime of all its threads, from /proc) over the same window.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    ProcWatch,
    broker,
    child_env,
    free_port,
    fresh_topics,
    http_ok,
    stop_process,
    topic_messages,
    wait_ready,
)
from bench.loadgen import fan_out, post, rejected_spans
from bench.report import emit_json, print_table

VARIANTS = 4
SPANS_PER_ROLLOUT = 32


def build_bodies(batch: int, seed: int = 7) -> list[bytes]:
    """``VARIANTS`` serialized requests of ``batch`` small spans, attributed the Agent Lightning way."""
    import random

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    rng = random.Random(seed)
    bodies = []
    for v in range(VARIANTS):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        kv = rs.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", "bench-agent"
        ss = rs.scope_spans.add()
        ss.scope.name = "bench"
        for i in range(batch):
            r = i // SPANS_PER_ROLLOUT
            s = ss.spans.add()
            s.trace_id = rng.getrandbits(128).to_bytes(16, "big")
            s.span_id = rng.getrandbits(64).to_bytes(8, "big")
            s.name = "tool" if i % 4 == 0 else "state"
            s.start_time_unix_nano = 1_700_000_000_000_000_000 + i * 1000
            s.end_time_unix_nano = s.start_time_unix_nano + 500
            for key, value in (
                ("agentlightning.rollout_id", f"ro-bench-{v}-{r}"),
                ("agentlightning.attempt_id", f"at-bench-{v}-{r}"),
                ("state", f"observation {i}"),
            ):
                a = s.attributes.add()
                a.key, a.value.string_value = key, value
            a = s.attributes.add()
            a.key, a.value.int_value = "agentlightning.span_sequence_id", i % SPANS_PER_ROLLOUT + 1
        bodies.append(req.SerializeToString())
    return bodies


def loadgen(url: str, requests: int, batch: int, connections: int) -> dict[str, Any]:
    """Post ``requests`` bodies over ``connections`` keep-alive connections; returns counts and time."""
    from urllib.parse import urlparse

    path = urlparse(url).path
    bodies = build_bodies(batch)
    lock = threading.Lock()
    stats = {"ok": 0, "rejected": 0, "errors": 0}

    def send(conn: http.client.HTTPConnection, i: int) -> None:
        status, data = post(conn, path, bodies[i % VARIANTS], "application/x-protobuf")
        with lock:
            if status == 200:
                stats["ok"] += 1
                stats["rejected"] += rejected_spans(data)
            else:
                stats["errors"] += 1

    started, ended = fan_out(url, range(requests), connections, send, timeout=60)
    return {**stats, "started": started, "ended": ended, "body_bytes": len(bodies[0])}


def run_bench(bootstrap: str, scratch: Path, requests: int, batch: int, connections: int) -> dict[str, Any]:
    topics = fresh_topics(bootstrap, "gw")
    port = free_port()
    log_path = scratch / "gateway.log"
    with open(log_path, "wb") as out:
        gw = subprocess.Popen(
            [sys.executable, "-m", "producers.ingest.gateway_cli", "--port", str(port)],
            cwd=scratch, env=child_env(scratch / "gateway", bootstrap, topics), stdout=out, stderr=subprocess.STDOUT,
        )
    watch = ProcWatch(gw.pid)
    total = requests * batch
    try:
        wait_ready("the gateway", lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), gw, log_path)
        watch.mark("start")
        t0 = time.time()
        lg = subprocess.run(
            [sys.executable, "-m", "bench.bench_gateway", "--loadgen", f"http://127.0.0.1:{port}/v1/traces",
             "--requests", str(requests), "--batch", str(batch), "--connections", str(connections)],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )
        if lg.returncode != 0:
            raise RuntimeError(f"load generator failed: {lg.stderr[-2000:]}")
        res = json.loads(lg.stdout.strip().splitlines()[-1])
        accepted = res["ok"] * batch - res["rejected"]
        deadline = time.monotonic() + 120
        landed = topic_messages(bootstrap, topics.spans)
        while landed < accepted and time.monotonic() < deadline:
            watch.sample()
            time.sleep(0.05)
            landed = topic_messages(bootstrap, topics.spans)
        t1 = time.time()
        watch.mark("end")
        watch.sample()
    finally:
        stop_process(gw, 30)
    wall = t1 - t0
    cpu = watch.cpu_between("start", "end") or float("nan")
    return {
        "spans_sent": total, "spans_accepted": accepted, "spans_in_kafka": landed, "http_errors": res["errors"],
        "wall_s": wall, "http_s": res["ended"] - res["started"], "gateway_cpu_s": cpu,
        "spans_per_s": landed / wall, "spans_per_core": landed / cpu if cpu > 0 else float("nan"),
        "body_bytes": res["body_bytes"], "peak_rss_mib": watch.peak_rss_mib,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200, help="OTLP export requests to send")
    ap.add_argument("--batch", type=int, default=512, help="spans per request")
    ap.add_argument("--connections", type=int, default=2, help="keep-alive connections of the load generator")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--loadgen", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.loadgen:
        print(json.dumps(loadgen(args.loadgen, args.requests, args.batch, args.connections)))
        return 0
    if args.quick:
        args.requests = min(args.requests, 40)
    scratch = Path(tempfile.mkdtemp(prefix="rb-bench-gw-"))
    with broker(scratch) as bootstrap:
        r = run_bench(bootstrap, scratch, args.requests, args.batch, args.connections)
    shutil.rmtree(scratch, ignore_errors=True)
    ok = r["spans_in_kafka"] >= r["spans_sent"] and r["http_errors"] == 0
    notes = ["per core = spans in Kafka / gateway CPU-seconds (all threads) from the first request to the last span landed"]
    if not ok:
        notes.append(f"only {r['spans_in_kafka']} of {r['spans_sent']} spans reached Kafka ({r['http_errors']} HTTP errors)")
    metrics = {"gateway_spans_per_core": r["spans_per_core"], "gateway_spans_per_s": r["spans_per_s"],
               "gateway_peak_rss_mib": r["peak_rss_mib"]}
    if args.json:
        emit_json("gateway", metrics, notes, run=r)
    else:
        print_table("gateway benchmark (OTLP/HTTP protobuf → Kafka, one gateway process)", [
            (f"spans/s per gateway core ({r['spans_sent']:,} in {args.batch}-span requests)", f"{r['spans_per_core']:,.0f}", "≥ 20,000"),
            ("  wall-clock, one gateway", f"{r['spans_per_s']:,.0f}", ""),
            ("  request body", f"{r['body_bytes']:,} B", ""),
            ("spans in Kafka / sent", f"{r['spans_in_kafka']:,} / {r['spans_sent']:,}", "all"),
            ("gateway peak RSS", f"{r['peak_rss_mib']:,.0f} MiB", ""),
        ], notes)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
