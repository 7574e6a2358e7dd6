"""The feedback stage's rate: Feedback records applied a second, against a real store (``rolloutbus store``
over HTTP, as the demo's worker reads it), Kafka replaced by stand-ins that deliver at once.

Seeds ``--rollouts`` task-less training rollouts (``--turns`` LLM turns of ``--prompt-tokens`` prompt ids each,
as the calculator demo's), then drives :class:`streams.feedback_stage.FeedbackStage` as the worker's agent does
(on_feedback, ack_later, maybe_commit per record; a final commit point) over ``--feedback`` records for distinct
rollouts, and prints the rate, the CPU of this process, and the time spent in the stage's ClickHouse reads.
Checks that every record was applied once (the rollouts' rows in ClickHouse carry its feedback id).

    python -m bench.bench_feedback_stage [--rollouts 3000] [--feedback 1000] [--traffic 40] [--embedded]

Prints one JSON line; not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

from bench.common import ROOT, free_port, stop_process, wait_ready
from schemas import codec
from schemas.models import Feedback, LLMCall, RolloutEvent, Span


def _done() -> Any:
    fut: Any = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


class _Topic:
    def __init__(self, name: str) -> None:
        self.name, self.sent = name, 0

    def send_soon(self, key: bytes | None, value: bytes) -> Any:
        self.sent += 1
        return _done()

    def get_topic_name(self) -> str:
        return self.name


class _Table:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def send_changelog(self, partition: int, key: bytes, value: bytes | None) -> Any:
        return _done()


class _Producer:
    async def flush(self) -> None:
        return None


class _Stream:
    def __init__(self) -> None:
        self.acked = 0

    async def ack(self, event: Any) -> None:
        self.acked += 1


def _rollout(i: int, turns: int, prompt_tokens: int) -> tuple[list[Span], RolloutEvent]:
    rid, spans = f"bench-{i}", []
    for t in range(turns):
        spans.append(Span(span_id=f"{rid}-{t}", trace_id="a" * 32, rollout_id=rid, attempt_id=f"{rid}-a1", sequence_id=t + 1,
                          name="chat", kind="llm", start_time_ns=t + 1, end_time_ns=t + 2, agent_name="solver",
                          llm=LLMCall(prompt_token_ids=[(i * 7 + k) % 30000 for k in range(prompt_tokens)],
                                      response_token_ids=list(range(20)), response_logprobs=[-0.1] * 20, resource_version=1)))
    ev = RolloutEvent(rollout_id=rid, attempt_id=f"{rid}-a1", event="FINISHED", time_ns=time.time_ns(), task_id="",
                      resource_version=1, status="succeeded", final_reward=None, span_count=turns)
    return spans, ev


def seed(client: Any, n: int, turns: int, prompt_tokens: int) -> None:
    from streams.rollout import Settings, finish_attempt
    from streams.sink import ClickHouseSink, rollout_row

    sink = ClickHouseSink(client)
    now = time.time_ns()
    for i in range(n):
        spans, ev = _rollout(i, turns, prompt_tokens)
        result = finish_attempt(spans, ev, Settings())
        sink.add("rollouts", rollout_row(result, "", now))
        sink.add_transitions(result, "", now)
        if (i + 1) % 1000 == 0:
            sink.flush()
    sink.flush()


async def _traffic(sink: Any, writes: Any, rate: float, turns: int, prompt_tokens: int, interval: float, stop: asyncio.Event) -> None:
    """What the span stage writes beside the feedback stage: ``rate`` new rollouts a second (their rows and
    transitions), handed to the sink's writer every ``interval`` as its commit points do (on the loop)."""
    from streams.rollout import Settings, finish_attempt
    from streams.sink import rollout_row

    i, carry = 10**6, 0.0
    while not stop.is_set():
        await asyncio.sleep(interval)
        carry += rate * interval
        for _ in range(int(carry)):
            spans, ev = _rollout(i, turns, prompt_tokens)
            result = finish_attempt(spans, ev, Settings())
            sink.add("rollouts", rollout_row(result, "", time.time_ns()))
            sink.add_transitions(result, "", time.time_ns())
            i += 1
        carry -= int(carry)
        writes.submit()


async def drive(client: Any, n: int, sink_interval: float, traffic: float = 0.0, turns: int = 2, prompt_tokens: int = 300) -> dict[str, Any]:
    from streams.checkpoint import SinkWrites
    from streams.feedback_stage import FeedbackStage
    from streams.sink import ClickHouseSink

    sink = ClickHouseSink(client, interval_s=sink_interval)
    health = SimpleNamespace(problem=lambda *a: None, clear=lambda *a: None, clickhouse=lambda *a: None)
    writes = SinkWrites(sink, health)  # type: ignore[arg-type]
    batches, dlq = _Topic("rb.batches"), _Topic("rb.dlq")
    stage = FeedbackStage(SimpleNamespace(producer=_Producer()), sink=sink, health=health, batches_topic=batches,  # type: ignore[arg-type]
                          dlq_topic=dlq, table=_Table(), flush=writes.flush, submit=writes.submit, window_s=3600.0)
    reads = {"n": 0, "s": 0.0}
    query = stage._query

    async def timed(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        t = time.perf_counter()
        try:
            return await query(sql, params)
        finally:
            reads["n"] += 1
            reads["s"] += time.perf_counter() - t

    stage._query = timed  # type: ignore[method-assign]
    stream = _Stream()
    stop = asyncio.Event()
    live = asyncio.create_task(_traffic(sink, writes, traffic, turns, prompt_tokens, sink_interval, stop)) if traffic else None
    now = time.time_ns()
    records = [codec.encode(Feedback(feedback_id=f"fb-{i}", rollout_id=f"bench-{i}", value=1.0 if i % 2 else 0.0,
                                     time_ns=now, source="bench")) for i in range(n)]
    wall, cpu = time.perf_counter(), time.process_time()
    for i, value in enumerate(records):
        msg = SimpleNamespace(topic="rb.feedback", partition=0, offset=i, key=f"bench-{i}".encode(), value=value)
        event = SimpleNamespace(message=msg)
        await stage.on_feedback(event)
        stage.ack_later(stream, event)
        await stage.maybe_commit()
    await stage.commit_final()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stop.set()
    if live is not None:
        await live
        sink.wait()  # its last batch written: one query at a time on the client
    return {"feedback": n, "seconds": round(wall, 2), "per_second": round(n / wall, 1), "cpu_s": round(cpu, 2),
            "reads": reads["n"], "read_s": round(reads["s"], 2), "ms_per_read": round(1000 * reads["s"] / max(reads["n"], 1), 1),
            "stats": stage.stats, "acked": stream.acked, "batches": batches.sent, "dead_letters": dlq.sent}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=3000)
    ap.add_argument("--feedback", type=int, default=400)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--sink-interval", type=float, default=0.5, help="the worker's --sink-interval (the demo's: 0.5)")
    ap.add_argument("--traffic", type=float, default=0.0, help="rollouts a second the span stage writes meanwhile (0: none)")
    ap.add_argument("--embedded", action="store_true", help="the embedded engine in this process, not a store over HTTP")
    args = ap.parse_args()

    from foundation.clickhouse import open_store
    from rolloutbus.store.local import ping

    with tempfile.TemporaryDirectory(prefix="rb-bench-feedback-") as tmp:
        store = None
        if args.embedded:
            dsn = f"chdb://{tmp}/clickhouse"
        else:
            port = free_port()
            store = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", "--data-dir", f"{tmp}/served", "store", "--port", str(port)],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            wait_ready("the store", lambda: ping("127.0.0.1", port), store, timeout=60, error=SystemExit)
            dsn = f"http://127.0.0.1:{port}"
        try:
            client = open_store(dsn, "rolloutbus")
            t = time.perf_counter()
            seed(client, args.rollouts, args.turns, args.prompt_tokens)
            seeded = time.perf_counter() - t
            out = asyncio.run(drive(client, min(args.feedback, args.rollouts), args.sink_interval, args.traffic,
                                   args.turns, args.prompt_tokens))
            applied = client.query("SELECT count() FROM rollouts FINAL WHERE startsWith(metadata['rolloutbus.feedback_id'], 'fb-')").result_rows[0][0]
            out.update({"store": "embedded" if args.embedded else "http", "rollouts": args.rollouts, "traffic": args.traffic, "seed_s": round(seeded, 1),
                        "applied_in_clickhouse": applied, "load_average": [round(x, 1) for x in os.getloadavg()]})
            print(json.dumps(out))
            assert applied == out["feedback"] == out["stats"]["feedback_applied"] == out["acked"], out
        finally:
            stop_process(store, 30)


if __name__ == "__main__":
    main()
