"""Producer-side benchmark: agent cost of ``emit_*`` (Kafka up and down) and producer throughput into
the real broker. Prints a table. Not a timed test.

    python -m bench.bench_producers [--small 200000] [--llm 20000]

Uses ``ROLLOUTBUS_KAFKA_BOOTSTRAP`` if set, else starts a local broker (``rolloutbus.local_kafka``) in
a scratch directory on ``ROLLOUTBUS_BENCH_KAFKA_PORT`` (default 29392) and stops it at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import broker, fresh_topics
from bench.report import pct
from producers import SpanTransport, emit_llm_call, emit_state, rollout


def emit_latency(transport: SpanTransport, n: int) -> tuple[float, float]:
    ts = []
    clock = time.perf_counter_ns
    with rollout("bench", transport=transport):
        for i in range(n):
            t0 = clock()
            emit_state(i)
            ts.append(clock() - t0)
            if i % 1000 == 999:
                time.sleep(0.001)  # an agent does other work between spans; let the worker run
    return pct(ts, 0.5) / 1000.0, pct(ts, 0.99) / 1000.0  # ns → µs


def throughput(transport: SpanTransport, n: int, llm: bool) -> float:
    prompt = list(range(1000))
    response = list(range(50))
    logprobs = [-0.5] * 50
    t0 = time.perf_counter()
    with rollout("bench", transport=transport):
        for i in range(n):
            if llm:
                emit_llm_call(prompt, response, logprobs, model="bench")
            else:
                emit_state(i)
    left = transport.flush(300)
    dt = time.perf_counter() - t0
    assert left == 0, f"{left} spans not delivered"
    return n / dt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=200_000)
    ap.add_argument("--llm", type=int, default=20_000)
    ap.add_argument("--latency", type=int, default=50_000)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="rb-bench-"))
    rows = []
    try:
        with broker(scratch, default_port=29392) as bootstrap:
            conf = {"bootstrap.servers": bootstrap}
            topics = fresh_topics(bootstrap, "")
            t = SpanTransport(conf, topics.spans, scratch / "spool-up")
            p50, p99 = emit_latency(t, args.latency)
            t.close(60)
            rows.append(("emit_state p50 / p99, Kafka up (µs)", f"{p50:.1f} / {p99:.1f}", "≤ 10 / ≤ 50"))
            down = SpanTransport({"bootstrap.servers": "127.0.0.1:1"}, topics.spans, scratch / "spool-down",
                                 producer_overrides={"log_level": 0})
            p50, p99 = emit_latency(down, args.latency)
            down.close(0.5)
            rows.append(("emit_state p50 / p99, Kafka down (µs)", f"{p50:.1f} / {p99:.1f}", "≤ 10 / ≤ 50"))
            t = SpanTransport(conf, topics.spans, scratch / "spool-small")
            rows.append((f"small spans/s into Kafka ({args.small:,})", f"{throughput(t, args.small, False):,.0f}", "≥ 100,000"))
            t.close(60)
            t = SpanTransport(conf, topics.spans, scratch / "spool-llm")
            rows.append((f"LLM spans/s, 1,000-token prompts ({args.llm:,})", f"{throughput(t, args.llm, True):,.0f}", "≥ 10,000"))
            t.close(60)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    w = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(w)}  {'result':>16}  target")
    print(f"{'-' * w}  {'-' * 16}  ------")
    for name, value, target in rows:
        print(f"{name.ljust(w)}  {value:>16}  {target}")
    print(f"(cores: {os.cpu_count()}; the agent thread and the transport thread share one GIL)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
