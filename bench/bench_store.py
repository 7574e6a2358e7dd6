"""What the HTTP hop to the store costs: the sink's RowBinary inserts into the in-process chDB engine
(``chdb://``) next to the same inserts through ``rolloutbus store`` (``http://``), for small spans and
for LLM spans (1,000 prompt tokens, 50 response tokens with logprobs). Also one query's round trip.

    python -m bench.bench_store [--batches 10] [--json]

Both sides get the same rows, the same batch sizes and a fresh migrated database; the store runs as
its own process, as in the local stack. Prints a table; not a timed test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import ROOT, free_port, stop_process, wait_ready


def rows(kind: str, n: int) -> list[bytes]:
    from schemas import codec
    from schemas.models import LLMCall, Span, ToolCall
    from streams import rowbinary
    from streams.attempts import span_view

    out = []
    for i in range(n):
        if kind == "llm":
            s = Span(span_id=f"s{i}", trace_id="t" * 32, rollout_id=f"r{i // 16}", attempt_id="a1", sequence_id=i, name="chat",
                     kind="llm", start_time_ns=i, end_time_ns=i + 1, agent_name="solver", attributes={"gen_ai.system": "openai"},
                     llm=LLMCall(model="m", prompt_token_ids=[(i * 7 + k) % 151000 for k in range(1000)],
                                 response_token_ids=list(range(50)), response_logprobs=[-0.5] * 50, response_mask=[1] * 50,
                                 resource_version=3))
        else:
            s = Span(span_id=f"s{i}", trace_id="t" * 32, rollout_id=f"r{i // 16}", attempt_id="a1", sequence_id=i, name="calc",
                     kind="tool", start_time_ns=i, end_time_ns=i + 1, attributes={"k": "v"},
                     tool=ToolCall(name="calc", arguments='{"x": 1}', ok=True, result="2"))
        out.append(rowbinary.span(span_view(codec.decode_raw(codec.encode(s))[1]), 0, i, False, 42))
    return out


def measure(client: Any, batch: bytes, n_rows: int, batches: int) -> tuple[float, float]:
    from streams.rowbinary import SPANS_COLUMNS

    client.command("TRUNCATE TABLE spans")
    client.raw_insert("spans", SPANS_COLUMNS, batch, fmt="RowBinary")  # warm
    t0 = time.perf_counter()
    for _ in range(batches):
        client.raw_insert("spans", SPANS_COLUMNS, batch, fmt="RowBinary")
    dt = time.perf_counter() - t0
    return n_rows * batches / dt, len(batch) * batches / dt / 1e6


def query_rtt(client: Any, n: int = 50) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        client.query("SELECT count() FROM spans")
    return (time.perf_counter() - t0) / n * 1e3


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from foundation.clickhouse import connect, migrate
    from rolloutbus.store.local import ping

    sizes = {"small": 20000, "llm": 2000}
    data = {k: b"".join(rows(k, n)) for k, n in sizes.items()}
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="rb-bench-store-") as tmp:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", "--data-dir", f"{tmp}/served", "store", "--port", str(port)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_ready("the store", lambda: ping("127.0.0.1", port), proc, timeout=60, error=SystemExit)
            for side, dsn in (("in-process chDB", f"chdb://{tmp}/embedded/clickhouse"), ("store over HTTP", f"http://127.0.0.1:{port}")):
                client = connect(dsn, database="bench")
                migrate(client, "bench")
                for kind, n in sizes.items():
                    rps, mbps = measure(client, data[kind], n, args.batches)
                    results[f"{side} {kind}"] = {"rows_per_s": rps, "mb_per_s": mbps}
                results[f"{side} query"] = {"ms": query_rtt(client)}
                client.close()
        finally:
            stop_process(proc, 30)
    if args.json:
        print(json.dumps(results))
        return 0
    table = []
    for kind, n in sizes.items():
        a, b = results[f"in-process chDB {kind}"], results[f"store over HTTP {kind}"]
        label = f"{kind} spans ({n:,} rows/insert, {len(data[kind]) / n:,.0f} B/row)"
        table.append((label, f"{a['rows_per_s']:,.0f} rows/s  {a['mb_per_s']:.0f} MB/s",
                      f"{b['rows_per_s']:,.0f} rows/s  {b['mb_per_s']:.0f} MB/s  ({b['rows_per_s'] / a['rows_per_s']:.0%})"))
    table.append(("SELECT count() round trip", f"{results['in-process chDB query']['ms']:.2f} ms", f"{results['store over HTTP query']['ms']:.2f} ms"))
    from rolloutbus.cli import format_table

    print("the sink's RowBinary inserts: in-process chDB vs the store over HTTP")
    print(format_table(["workload", "in-process chDB", "store over HTTP (share)"], [list(r) for r in table], max_width=80))
    return 0


if __name__ == "__main__":
    sys.exit(main())
