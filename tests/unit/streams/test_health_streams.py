"""The stream worker's probes: what /readyz means (a rule over plain state, no broker), and the server that
answers /healthz, /readyz and /metrics on the worker's metrics port (on by default, loopback by default)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from foundation.errors import ClickHouseError, ConfigError, KafkaUnavailable
from foundation.health import HealthServer, Readiness, backlog, serve_health
from streams.health import LAST_PROGRESS, PING_EVERY_S, StreamHealth


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# ------------------------------------------------------------------------------------ the rule


def test_not_ready_until_started_and_assigned() -> None:
    h = StreamHealth(stall_s=60)
    assert h.verdict(now=0) == (False, "starting")
    h.start(now=0)
    ok, reason = h.verdict(now=0)
    assert not ok and reason.startswith("kafka: no partition of the spans topic assigned")
    h.assignment(3, now=1)
    assert h.verdict(now=2) == (True, "ready")


def test_a_worker_with_a_backlog_and_no_progress_stalls() -> None:
    h = StreamHealth(stall_s=60)
    h.start(now=100)
    h.assignment(2, now=100)
    h.backlog = 500
    assert h.verdict(now=150)[0]  # just assigned: time to catch up
    h.beat(now=160)  # the loop runs, and reads nothing
    ok, reason = h.verdict(now=161)
    assert not ok and reason == "stalled: no progress for 61s with 500 records waiting"
    h.polled(20)
    h.commit_ok(now=170)  # read, written and committed: progress
    assert h.verdict(now=171) == (True, "ready")
    h.watch(_Consumer({0: 7, 1: 9}, {0: 7, 1: 9}), "rb.spans", now=9_990)  # nothing waits: quiet is not stalled
    assert h.backlog == 0 and h.verdict(now=10_000) == (True, "ready")


def test_a_commit_point_without_new_records_is_not_progress() -> None:
    h = StreamHealth(stall_s=10)
    h.start(now=15)
    h.assignment(1, now=0)
    h.backlog = 5
    h.commit_ok(now=20)  # nothing was polled since the last one
    assert not h.verdict(now=21)[0]


def test_clickhouse_and_kafka_failures_say_which_and_clear_when_they_recover() -> None:
    h = StreamHealth()
    h.start()
    h.assignment(1)
    h.commit_failed(ClickHouseError("cannot reach ClickHouse at http://secret-host:8123"))
    ok, reason = h.verdict()
    assert not ok and reason.startswith("clickhouse: inserts failing") and "secret-host" not in reason
    h.clickhouse(True)
    assert h.verdict()[0]
    h.commit_failed(KafkaUnavailable("3 records undelivered"))
    ok, reason = h.verdict()
    assert not ok and reason.startswith("kafka: commit or delivery failing")
    h.commit_ok()
    assert h.verdict()[0]


def test_a_problem_keeps_the_time_it_was_first_seen() -> None:
    r = Readiness(started=True, assigned=1)
    r.problem("clickhouse", "not answering a ping", now=10)
    r.problem("clickhouse", "not answering a ping", now=30)
    assert r.verdict(now=40) == (False, "clickhouse: not answering a ping (for 30s)")


def test_clickhouse_is_pinged_only_when_no_insert_talked_to_it() -> None:
    h = StreamHealth()
    now = h._last_contact
    assert not h.ping_due(now + 1)
    assert h.ping_due(now + PING_EVERY_S)
    h.clickhouse(True)  # an insert just now
    assert not h.ping_due(h._last_contact + 1)


def test_progress_sets_the_timestamp_gauge() -> None:
    h = StreamHealth()
    before = LAST_PROGRESS._value.get()
    h.polled(1)
    h.commit_ok()
    assert LAST_PROGRESS._value.get() > max(before, 1e9)


class _Consumer:
    """The confluent-kafka calls the watch makes, answering from plain numbers."""

    def __init__(self, positions: dict[int, int], highs: dict[int, int]) -> None:
        self.positions, self.highs = positions, highs

    def assignment(self) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition("rb.spans", p) for p in self.positions] + [TopicPartition("other", 0)]

    def position(self, tps: list[Any]) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition(tp.topic, tp.partition, self.positions[tp.partition]) for tp in tps]

    def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
        assert cached, "the watch must never wait for the broker"
        return 0, self.highs[tp.partition]


def test_watch_reads_assignment_and_backlog_off_the_consumer() -> None:
    h = StreamHealth()
    h.watch(_Consumer({0: 10, 1: -1001, 2: 7}, {0: 15, 1: 40, 2: 7}), "rb.spans", now=5)
    assert h.assigned == 3 and h.backlog == 5  # partition 1 has no position yet: not counted
    assert backlog(_Consumer({}, {}), "rb.spans", []) is None


# ------------------------------------------------------------------------------------ the server


def test_the_server_answers_the_three_paths() -> None:
    registry = CollectorRegistry()
    Counter("rolloutbus_test_things", "things", registry=registry).inc(3)
    state = {"ok": False}
    server = HealthServer(lambda: (state["ok"], "ready" if state["ok"] else "kafka: no partition"), registry).start()
    try:
        assert _get(server.port, "/healthz") == (200, "ok\n")
        assert _get(server.port, "/readyz") == (503, "kafka: no partition\n")
        state["ok"] = True
        assert _get(server.port, "/readyz") == (200, "ready\n")
        status, body = _get(server.port, "/metrics")
        assert status == 200 and "rolloutbus_test_things_total 3.0" in body
        assert _get(server.port, "/other")[0] == 404
    finally:
        server.close()


def test_a_readiness_check_that_raises_is_a_503_not_a_dropped_connection() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    server = HealthServer(broken, CollectorRegistry()).start()
    try:
        assert _get(server.port, "/readyz") == (503, "readiness check failed: RuntimeError\n")
    finally:
        server.close()


def test_metrics_and_probes_are_on_by_default_and_bind_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.settings import StreamSettings

    monkeypatch.delenv("ROLLOUTBUS_STREAMS_METRICS_PORT", raising=False)
    monkeypatch.delenv("ROLLOUTBUS_STREAMS_METRICS_HOST", raising=False)
    s = StreamSettings()
    assert s.streams_metrics_port == 9101 and s.streams_metrics_host == "127.0.0.1"
    assert "streams_metrics_port" not in s.model_fields_set


def test_port_0_is_off() -> None:
    assert serve_health(lambda: (True, "ready"), "127.0.0.1", 0, explicit=True, flag="--metrics-port", env="X") is None


def test_a_port_in_use_is_an_error_when_asked_for_and_a_warning_by_default(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}.*--metrics-port or ROLLOUTBUS_STREAMS_METRICS_PORT"):
            serve_health(lambda: (True, "ready"), "127.0.0.1", port, explicit=True, flag="--metrics-port",
                         env="ROLLOUTBUS_STREAMS_METRICS_PORT")
        # Two workers on one host with the default port: the second runs without probes, and says so.
        assert serve_health(lambda: (True, "ready"), "127.0.0.1", port, explicit=False, flag="--metrics-port",
                            env="ROLLOUTBUS_STREAMS_METRICS_PORT") is None
        assert "in use" in caplog.text


def test_process_reads_the_metrics_port_and_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from streams.cli import add_arguments, settings_from_args

    monkeypatch.setenv("ROLLOUTBUS_STREAMS_METRICS_HOST", "0.0.0.0")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    s = settings_from_args(parser.parse_args(["--metrics-port", "9200"]))
    assert (s.streams_metrics_port, s.streams_metrics_host) == (9200, "0.0.0.0")
    assert "streams_metrics_port" in s.model_fields_set


def test_a_loop_that_stops_reporting_is_stalled_whatever_it_last_said() -> None:
    """A hung insert or step blocks the loop that updates the state: the last snapshot must not stay 'ready'."""
    h = StreamHealth(stall_s=30)
    h.start(now=0)
    h.watch(_Consumer({0: 7}, {0: 7}), "rb.spans", now=1)  # assigned, caught up
    assert h.verdict(now=31) == (True, "ready")
    assert h.verdict(now=32) == (False, "stalled: the consumer loop has not run for 31s")
    h.watch(_Consumer({0: 7}, {0: 7}), "rb.spans", now=33)
    assert h.verdict(now=34) == (True, "ready")
