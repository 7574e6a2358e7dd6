"""The hot-path bench runs every path on the workload (no network), and ``rolloutbus bench --spans``
sizes the benches that take a workload size and reports what they measure against the targets."""

from __future__ import annotations

import argparse

import pytest

from bench import bench_paths
from foundation.errors import SettingError
from rolloutbus import bench_cli


def test_every_path_runs_on_the_workload_and_the_stage_completes_every_attempt() -> None:
    r = bench_paths.run(160, repeat=1)
    assert r["spans"] == 160 and r["llm_spans"] > 0
    assert set(r["us_per_span"]) == {"sdk_emit", "sdk_encode", "sdk", "gateway", "stage"}
    assert all(v > 0 for v in r["spans_per_cpu_s"].values())


def test_the_size_goes_to_the_benches_that_take_one() -> None:
    by = {b.name: b for b in bench_cli.BENCHES}
    assert bench_cli.sized_args(by["paths"], False, 100_000) == ["--json", "--spans", "100000"]
    assert bench_cli.sized_args(by["ingest"], False, 100_000)[-4:] == ["--rollouts", "6250", "--spans-per-rollout", "16"]
    assert bench_cli.sized_args(by["agentlightning"], False, 100_000)[-4:] == ["--rollouts", "6250", "--spans-per-rollout", "16"]
    assert bench_cli.sized_args(by["gateway"], False, 100_000) == by["gateway"].args
    assert bench_cli.sized_args(by["ingest"], False, None) == by["ingest"].args


def test_bad_sizes_are_one_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags and ROLLOUTBUS_BENCH_* read through BenchSettings: a bad value names the flag and the variable."""
    import argparse

    from foundation.entry import settings_from_args
    from rolloutbus.bench_settings import BenchSettings

    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)

    def read(*argv: str) -> BenchSettings:
        return settings_from_args(BenchSettings, parser.parse_args(argv), bench_cli._FLAGS)

    with pytest.raises(SystemExit):  # the flag's own bound: argparse's one line
        read("--spans", "3")
    monkeypatch.setenv("ROLLOUTBUS_BENCH_SPANS", "lots")
    with pytest.raises(SettingError, match="ROLLOUTBUS_BENCH_SPANS"):
        read()
    monkeypatch.setenv("ROLLOUTBUS_BENCH_SPANS", "100000")
    monkeypatch.setenv("ROLLOUTBUS_BENCH_QUICK", "1")
    s = read()
    assert (s.bench_spans, s.bench_quick, s.bench_out, s.bench_kafka_port) == (100_000, True, None, 29892)
    assert read("--spans", "2000", "--out", "/tmp/x").bench_spans == 2000
    monkeypatch.setenv("ROLLOUTBUS_BENCH_KAFKA_PORT", "70000")
    with pytest.raises(SettingError, match="ROLLOUTBUS_BENCH_KAFKA_PORT"):
        read()


def test_rows_show_per_cpu_second_figures_against_the_targets() -> None:
    results = {
        "ingest": {"json": {"metrics": {"ingest_spans_per_s": 9000.0, "ingest_spans_per_cpu_s": 40_000.0},
                            "run": {"spans": 100_000}}},
        "agentlightning": {"json": {"spans_per_s": 300.0, "spans_per_server_cpu_s": 600.0}},
        "paths": {"json": {"metrics": {"paths_sdk_spans_per_cpu_s": 120_000.0, "paths_gateway_spans_per_cpu_s": 12_000.0,
                                       "paths_stage_spans_per_cpu_s": 50_000.0, "paths_spans": 100_000}}},
    }
    rows = {r[0]: r for r in bench_cli.build_rows(results)}
    cpu = rows["ingest per CPU-s: our producer vs Agent Lightning's server"]
    assert cpu[1].startswith("66.7×") and cpu[3] == "yes"
    assert rows["SDK emit + encode, spans per CPU-s (in process, 100,000 spans)"][3] == "yes"
    assert rows["gateway OTLP → Avro, spans per CPU-s (in process, 100,000 spans)"][3] == "NO"


def test_the_cli_takes_spans() -> None:
    p = argparse.ArgumentParser()
    bench_cli.add_arguments(p)
    assert p.parse_args(["--spans", "100000", "--only", "paths"]).spans == 100_000


def test_the_benches_broker_reads_its_variables_through_the_bench_settings(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A given cluster is used as it is; a bad ROLLOUTBUS_BENCH_KAFKA_PORT is one line naming the variable, before any
    broker starts."""
    from bench.common import broker

    monkeypatch.setenv("ROLLOUTBUS_KAFKA_BOOTSTRAP", "kafka.example:9092")
    with broker(tmp_path) as bootstrap:
        assert bootstrap == "kafka.example:9092"
    monkeypatch.delenv("ROLLOUTBUS_KAFKA_BOOTSTRAP")
    monkeypatch.setenv("ROLLOUTBUS_BENCH_KAFKA_PORT", "70000")
    with pytest.raises(SettingError, match="ROLLOUTBUS_BENCH_KAFKA_PORT"):
        with broker(tmp_path):
            pass
    assert not (tmp_path / "broker").exists()


def test_the_benches_other_variables_are_read_through_the_bench_settings(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Where the TRL and Agent Lightning 0.3.0 venvs are made from, and Agent Lightning's port: each variable is one
    field of BenchSettings (a bad value is one line naming it, before anything installs)."""
    import bench.agentlightning_store as al
    import bench.bench_e2e as e2e
    import bench.trl_venv as trl

    made: list[tuple[str, str]] = []
    monkeypatch.setattr(trl, "ensure_venv", lambda venv, *a, **k: made.append(("trl", str(venv))))
    monkeypatch.setattr(e2e, "ensure_venv", lambda venv, *a, base, **k: made.append(("al03", base())))
    monkeypatch.setenv("ROLLOUTBUS_BENCH_TRL_VENV", str(tmp_path / "trl"))
    monkeypatch.setenv("ROLLOUTBUS_BENCH_AL03_PYTHON", "/opt/py311/bin/python")
    trl.ensure_trl_venv()
    e2e.ensure_al03()
    assert made == [("trl", str(tmp_path / "trl")), ("al03", "/opt/py311/bin/python")]
    monkeypatch.setenv("ROLLOUTBUS_BENCH_KEEP_LOGS", "")  # empty: unset, not the current directory
    monkeypatch.setenv("ROLLOUTBUS_BENCH_TRL_VENV", "")
    from foundation.config import load_settings
    from rolloutbus.bench_settings import BenchSettings

    assert (load_settings(BenchSettings).bench_keep_logs, load_settings(BenchSettings).bench_trl_venv) == (None, None)
    monkeypatch.setenv("ROLLOUTBUS_BENCH_AL_PORT", "0")
    monkeypatch.setattr(al, "ensure_venv", lambda *a, **k: pytest.fail("installed before the settings were read"))
    with pytest.raises(SettingError, match="ROLLOUTBUS_BENCH_AL_PORT"):
        al.run_bench(al.WorkloadSpec(rollouts=1))
    monkeypatch.setenv("ROLLOUTBUS_BENCH_AL_PORT", "70000")
    with pytest.raises(SettingError, match="ROLLOUTBUS_BENCH_AL_PORT"):
        al.run_bench(al.WorkloadSpec(rollouts=1))
