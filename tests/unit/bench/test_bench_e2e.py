"""The end-to-end bench's pure parts: sizes and mixes, the OTLP bodies it sends every system, the CPU
read from /proc, how cost growth is worded, and ``rolloutbus bench --spans`` sizing it."""

from __future__ import annotations

import os

import pytest

from bench import bench_e2e, common
from rolloutbus import bench_cli


def test_sizes_are_whole_rollouts_and_the_llm_mix_makes_every_middle_span_an_llm_call() -> None:
    assert bench_e2e.spec_for(100_000, "default").total_spans == 100_000
    assert bench_e2e.spec_for(1000, "default").llm_fraction == 0.25
    assert bench_e2e.spec_for(1000, "llm").llm_fraction == 1.0
    with pytest.raises(ValueError, match="unknown mix"):
        bench_e2e.spec_for(1000, "tiny")


@pytest.mark.parametrize(("us", "worded"), [
    ({1000: 100.0, 100_000: 104.0}, "flat (×1.04)"),
    ({1000: 100.0, 10_000: 150.0, 100_000: 250.0}, "grows ×2.50"),
    ({1000: 800.0, 100_000: 200.0}, "falls ×0.25"),
    ({1000: 100.0}, "—"),
])
def test_cost_growth_compares_the_smallest_and_the_largest_size(us: dict[int, float], worded: str) -> None:
    assert bench_e2e.cost_growth(us) == worded


def test_proc_stat_gives_the_parent_and_all_four_cpu_counters() -> None:
    tck = os.sysconf("SC_CLK_TCK")
    line = f"42 (a (weird) name) S 7 42 42 0 -1 0 0 0 0 0 {tck} {tck} {2 * tck} {tck} 20 0 1 0"
    assert common.parse_stat(line) == (7, 5.0)
    assert common.tree_cpu_s(os.getpid()) > 0


def test_every_system_gets_the_same_bodies_but_for_the_ids() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spec = bench_e2e.spec_for(40 * 16, "default")
    tokens = [0]
    chunks = list(bench_e2e.otlp_chunks(spec, tokens_sent=tokens))
    assert [len(a) for _, a in chunks] == [32, 8]  # whole rollouts, 512 spans a body
    req = ExportTraceServiceRequest()
    req.ParseFromString(chunks[0][0])
    assert len(req.resource_spans[0].scope_spans[0].spans) == 512
    assert tokens[0] > 0 and tokens[0] % spec.prompt_tokens == 0

    ids = {f"ro-7-{i:06d}": [f"ro-theirs{i:04d}", f"at-theirs{i:04d}"] for i in range(40)}
    renamed = list(bench_e2e.otlp_chunks(spec, ids))
    assert renamed[0][1][0] == ("ro-theirs0000", "at-theirs0000")
    assert abs(len(renamed[0][0]) - len(chunks[0][0])) < len(chunks[0][0]) // 100


def test_rolloutbus_bench_spans_runs_the_e2e_bench_at_smaller_sizes_too() -> None:
    by = {b.name: b for b in bench_cli.BENCHES}
    assert bench_cli.sized_args(by["e2e"], False, 100_000) == ["--json", "--sizes", "1000,10000,100000", "--mixes", "default,llm"]
    assert bench_cli.sized_args(by["e2e"], True, 5000) == ["--json", "--sizes", "1000,5000", "--mixes", "default"]
    assert bench_cli.sized_args(by["e2e"], True, None) == by["e2e"].quick_args


def test_a_paced_load_offers_each_body_at_its_slot_and_an_unpaced_one_sends_at_once() -> None:
    from bench.bench_e2e import paced_at

    assert paced_at(100.0, 10, 5120.0) == 101.0
    assert paced_at(100.0, 0, 5120.0) == 100.0
    assert paced_at(100.0, 10, None) == 100.0
    # 100k spans at 3,300 spans/s: the last of 196 bodies goes about 30 s after the first
    assert abs(paced_at(0.0, 195, 3300.0) - 195 * 512 / 3300) < 1e-9
