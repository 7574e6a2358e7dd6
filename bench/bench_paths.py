"""Process CPU per span of the three data-plane hot paths, in process, on bench/workload.py's spans.

    python -m bench.bench_paths [--spans 100000] [--sizes 1000,10000,100000] [--repeat 3] [--json]

No broker, no ClickHouse, no HTTP: what each component's own Python does per span, timed with the
process's CPU clock (``time.process_time``), so a busy shared machine does not count against it.
The workload (``--spans`` rounded to whole rollouts of 16 spans, a quarter of them LLM calls with
1,000-token prompts) and everything a path takes as input are built before timing.

- **sdk** — the agent thread: ``emit_message`` / ``emit_llm_call`` / ``emit_tool_call`` /
  ``emit_reward`` for each span inside a rollout (STARTED and FINISHED included), into a transport
  that takes them and lets them go; then the transport thread's encoding of those records
  (``schemas.codec.encode_raw``). The transport's spool and librdkafka are not in this figure
  (``bench_producers.py`` measures the whole producer into a real broker).
- **gateway** — OTLP/HTTP protobuf bodies of 512 spans (the workload's spans as an OpenTelemetry
  exporter sends them: ids and token ids as attributes) → ``producers.ingest.otlp_decoding.map_body`` (the
  compiled mapping of native/ where installed), what ``Gateway.traces`` does per request before it
  hands the bytes to the transport (``bench_gateway.py`` measures the whole gateway process over HTTP
  into Kafka).
- **stage** — ``SpanStage.poll`` itself, in batches of 5,000 records, with its consumer replaced by
  a list of records: decode, checks, the attempts, the ``spans`` RowBinary rows, and at each FINISHED
  the completed attempt (``finish_attempt``, its ``rollouts`` and ``transitions`` rows, its summary
  queued on a producer with no broker). librdkafka's fetch and chDB's insert are not in it
  (``bench_streams.py`` measures the whole worker).

Each figure is the best of ``--repeat`` runs (the least disturbed by other work on the machine).
"""

from __future__ import annotations

import argparse
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from bench.report import emit_json, print_table
from bench.workload import SPANS_PER_ROLLOUT, SynthSpan, generate, size_summary, spec_for

BATCH = 512  # spans per OTLP request, as bench_gateway.py sends them
TARGETS = {"sdk": 100_000, "gateway": 60_000, "stage": 60_000}  # spans per CPU-second (issue 28)


def cpu_per_span(fn: Callable[[], Any], repeat: int) -> float:
    """The least process CPU-seconds per span over ``repeat`` runs of ``fn``, which returns its span
    count, or (span count, CPU-seconds) when it times itself (its setup left out)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        out = fn()
        n, cpu = out if isinstance(out, tuple) else (out, time.process_time() - t0)
        best = min(best, cpu / n)
    return best


# --------------------------------------------------------------------------- sdk


class _Keep:
    """A transport that takes what it is given (the agent side's cost without the worker thread) and
    keeps it only when asked: a real transport's queue drains, and 100k records held would make the
    garbage collector's passes, not the SDK, the figure."""

    def __init__(self, keep: bool) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []
        self.keep = keep

    def emit(self, key: str, name: str, record: dict[str, Any]) -> bool:
        if self.keep:
            self.records.append((key, name, record))
        return True


def sdk_emit(rollouts: list[list[SynthSpan]], keep: bool = True) -> tuple[int, list[tuple[str, str, dict[str, Any]]]]:
    from producers import emit_llm_call, emit_message, emit_reward, emit_tool_call, rollout

    transport = _Keep(keep)
    n = 0
    for spans in rollouts:
        first = spans[0]
        with rollout(f"task-{first.rollout_id}", rollout_id=first.rollout_id, attempt_id=first.attempt_id,
                     agent_name="bench-agent", transport=transport):  # type: ignore[arg-type]
            for s in spans:
                if s.kind == "llm":
                    emit_llm_call(s.prompt_token_ids, s.response_token_ids, s.response_logprobs, model=s.model,
                                  finish_reason="stop", name=s.name, attributes=s.attributes)
                elif s.kind == "tool":
                    emit_tool_call(s.tool_name or "", s.tool_arguments, s.tool_result)
                elif s.kind == "reward":
                    emit_reward(float(s.reward or 0.0))
                else:
                    emit_message(s.attributes.get("content", ""), role=s.attributes.get("role"))
                n += 1
    return n, transport.records


def sdk_encode(records: list[tuple[str, str, dict[str, Any]]]) -> int:
    from schemas.codec import encode_raw

    for _key, name, record in records:
        encode_raw(name, record)
    return len(records)


# --------------------------------------------------------------------------- gateway


def otlp_bodies(rollouts: list[list[SynthSpan]]) -> tuple[list[bytes], int]:
    """The workload as OTLP/HTTP protobuf bodies of ``BATCH`` spans (before timing)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    def put(kvs: Any, key: str, value: Any) -> None:
        kv = kvs.add()
        kv.key = key
        if isinstance(value, str):
            kv.value.string_value = value
        elif isinstance(value, float):
            kv.value.double_value = value
        elif isinstance(value, int):
            kv.value.int_value = value
        else:  # a list of token ids or logprobs
            arr = kv.value.array_value
            for x in value:
                if isinstance(x, float):
                    arr.values.add().double_value = x
                else:
                    arr.values.add().int_value = x

    spans = [s for r in rollouts for s in r]
    bodies = []
    for i in range(0, len(spans), BATCH):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        put(rs.resource.attributes, "service.name", "bench")
        ss = rs.scope_spans.add()
        for s in spans[i:i + BATCH]:
            o = ss.spans.add()
            o.name, o.trace_id, o.span_id = s.name, bytes.fromhex(s.trace_id), bytes.fromhex(s.span_id)
            if s.parent_id:
                o.parent_span_id = bytes.fromhex(s.parent_id)
            o.start_time_unix_nano, o.end_time_unix_nano = s.start_time_ns, s.end_time_ns
            attrs: dict[str, Any] = {"agentlightning.rollout_id": s.rollout_id, "agentlightning.attempt_id": s.attempt_id,
                                     "agentlightning.span_sequence_id": s.sequence_id + 1, **s.attributes}
            if s.kind == "llm":
                attrs.update({"gen_ai.response.model": s.model or "", "prompt_token_ids": s.prompt_token_ids,
                              "response_token_ids": s.response_token_ids, "response_logprobs": s.response_logprobs})
            elif s.kind == "tool":
                attrs.update({"gen_ai.tool.name": s.tool_name or "", "gen_ai.tool.call.arguments": s.tool_arguments,
                              "gen_ai.tool.call.result": s.tool_result or ""})
            elif s.kind == "reward":
                attrs.update({"agentlightning.reward.0.name": "reward", "agentlightning.reward.0.value": float(s.reward or 0.0)})
            for k, v in attrs.items():
                put(o.attributes, k, v)
        bodies.append(req.SerializeToString())
    return bodies, len(spans)


def gateway(bodies: list[bytes]) -> int:
    """The gateway's work on each body: ``map_body`` (the compiled mapping of native/ where installed,
    the reference for the spans it declines), to the records the transport takes."""
    from producers.ingest.otlp_decoding import map_body

    n = 0
    for body in bodies:
        records, errors = map_body(body, "application/x-protobuf")
        if errors:
            raise RuntimeError(f"the gateway rejected {len(errors)} spans: {errors[0]}")
        n += len(records)
    return n


# --------------------------------------------------------------------------- stage


def stage_records(records: list[tuple[str, str, dict[str, Any]]]) -> list[bytes]:
    from schemas.codec import encode_raw

    return [encode_raw(name, record) for _key, name, record in records]


class _Msg:
    """A consumed record as confluent-kafka's ``Message`` presents it (partition 0)."""

    __slots__ = ("_offset", "_value", "_key")

    def __init__(self, offset: int, value: bytes, key: bytes) -> None:
        self._offset, self._value, self._key = offset, value, key

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return 0

    def topic(self) -> str:
        return "rb.spans"

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return self._key


class _Batches:
    """A consumer that hands out the records in the span stage's batches."""

    def __init__(self, msgs: list[_Msg], batch: int) -> None:
        self.msgs, self.batch, self.at = msgs, batch, 0

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        out = self.msgs[self.at:self.at + min(n, self.batch)]
        self.at += len(out)
        return out

    def close(self) -> None:
        pass


def stage(values: list[bytes]) -> int:
    """``SpanStage.poll`` itself over ``values``, its Kafka consumer replaced by :class:`_Batches`
    and its sink buffering rows (no ClickHouse). Its producer (completed rollouts' summaries) is a
    real librdkafka producer with no broker behind it: it queues them."""
    from streams.attempts import PartitionState
    from streams.rollout import Settings
    from streams.sink import ClickHouseSink
    from streams.spans_stage import SpanStage

    quiet = logging.getLogger("bench_paths.kafka")  # no broker: librdkafka's connection errors are expected
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    sink = ClickHouseSink(client=None)
    s = SpanStage({"bootstrap.servers": "127.0.0.1:1", "logger": quiet}, group="bench", spans_topic="rb.spans",
                  done_topic="d", dlq_topic="q", state_topic="c", sink=sink, flush_sink=lambda: None, core=Settings())
    try:
        s.consumer.close()
        msgs = [_Msg(i, v, b"k") for i, v in enumerate(values)]
        s.consumer = _Batches(msgs, s.batch)  # type: ignore[assignment]
        s.parts[0] = PartitionState(0)
        t0 = time.process_time()
        while s.poll():
            pass
        elapsed = time.process_time() - t0
        if s.parts[0].inflight or s.stats["dlq"]:
            raise RuntimeError(f"{len(s.parts[0].inflight)} attempts did not complete, {s.stats['dlq']} dead letters")
        return s.stats["spans"], elapsed  # type: ignore[return-value]
    finally:
        s._closed = True


# --------------------------------------------------------------------------- main


def run(spans: int, repeat: int) -> dict[str, Any]:
    warm = generate(spec_for(SPANS_PER_ROLLOUT, seed=1))  # imports and first calls, untimed
    gateway(otlp_bodies(warm)[0])
    stage(stage_records(sdk_emit(warm)[1]))
    rollouts = generate(spec_for(spans))
    n, records = sdk_emit(rollouts)  # once untimed: the records the other paths take
    bodies, _ = otlp_bodies(rollouts)
    values = stage_records(records)
    us: dict[str, float] = {}
    us["sdk_emit"] = cpu_per_span(lambda: sdk_emit(rollouts, keep=False)[0], repeat) * 1e6
    us["sdk_encode"] = cpu_per_span(lambda: (sdk_encode(records), n)[1], repeat) * 1e6  # events included, per span
    us["sdk"] = us["sdk_emit"] + us["sdk_encode"]
    us["gateway"] = cpu_per_span(lambda: gateway(bodies), repeat) * 1e6
    us["stage"] = cpu_per_span(lambda: stage(values), repeat) * 1e6
    summary = size_summary(rollouts)
    return {"spans": summary["spans"], "llm_spans": summary["llm"], "us_per_span": us,
            "spans_per_cpu_s": {k: 1e6 / v for k, v in us.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=None, help="one workload size (spans; whole rollouts of 16)")
    ap.add_argument("--sizes", default="1000,10000,100000", help="comma-separated workload sizes, when --spans is not given")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure; the least CPU is kept")
    ap.add_argument("--quick", action="store_true", help="1,000 and 10,000 spans, one run each")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    sizes = [args.spans] if args.spans else [int(x) for x in args.sizes.split(",") if x.strip()]
    if args.quick:
        sizes, args.repeat = [s for s in sizes if s <= 10_000] or [1000], 1
    results = {str(s): run(s, args.repeat) for s in sizes}
    big = results[str(max(sizes))]
    metrics = {f"paths_{k}_spans_per_cpu_s": v for k, v in big["spans_per_cpu_s"].items()}
    metrics["paths_spans"] = big["spans"]
    notes = ["process CPU per span, in process (no broker, no ClickHouse, no HTTP); best of "
             f"{args.repeat} run(s); the workload is bench/workload.py's (a quarter LLM spans with 1,000-token prompts)"]
    if args.json:
        emit_json("paths", metrics, notes, sizes=results)
        return 0
    rows = []
    for size, r in results.items():
        for k in ("sdk_emit", "sdk_encode", "sdk", "gateway", "stage"):
            target = TARGETS.get(k)
            rows.append((f"{k} ({r['spans']:,} spans)", f"{r['us_per_span'][k]:.2f} µs = {r['spans_per_cpu_s'][k]:,.0f}/CPU-s",
                         f"≥ {target:,}" if target else ""))
    print_table("data-plane hot paths: process CPU per span", rows, notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
