"""Producer-side benchmark: agent cost of ``emit_*`` (Kafka up and down) and producer throughput into
the real broker. Prints a table. Not a timed test.

    python bench/bench_producers.py [--small 200000] [--llm 20000]

Uses ``ROLLOUTBUS_KAFKA_BOOTSTRAP`` if set, else starts a local broker (``rolloutbus.local_kafka``) in
a scratch directory on ``ROLLOUTBUS_BENCH_KAFKA_PORT`` (default 29392) and stops it at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from producers import SpanTransport, emit_llm_call, emit_state, rollout  # noqa: E402
from foundation.config import Topics  # noqa: E402
from foundation.kafka_admin import ensure_topics, topic_specs  # noqa: E402


def _pct(samples: list[int], q: float) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(len(samples) * q))] / 1000.0


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
    return _pct(ts, 0.5), _pct(ts, 0.99)


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
    broker = None
    bootstrap = os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")
    if not bootstrap:
        from rolloutbus.local_kafka import LocalKafka

        broker = LocalKafka(scratch / "broker", int(os.environ.get("ROLLOUTBUS_BENCH_KAFKA_PORT", "29392")))
        broker.start()
        bootstrap = broker.bootstrap
    conf = {"bootstrap.servers": bootstrap}
    topics = Topics(f"bench{uuid.uuid4().hex[:6]}.")
    ensure_topics(conf, topic_specs(topics))
    rows = []
    try:
        t = SpanTransport(conf, topics.spans, scratch / "spool-up")
        p50, p99 = emit_latency(t, args.latency)
        t.close(60)
        rows.append(("emit_state p50 / p99, Kafka up (µs)", f"{p50:.1f} / {p99:.1f}", "≤ 10 / ≤ 50"))
        down = SpanTransport({"bootstrap.servers": "127.0.0.1:1"}, topics.spans, scratch / "spool-down", producer_overrides={"log_level": 0})
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
        if broker is not None:
            broker.stop()
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
