"""The foundation against the real services: the local broker's lifecycle through the CLI, produce and
consume of our Avro records on the real broker, and the migrations in the real ClickHouse engine."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from foundation.clickhouse import connect, migrate
from foundation.errors import ClickHouseError, ConfigError
from schemas import RolloutEvent, RolloutEventType, Span, decode, encode

pytestmark = pytest.mark.integration


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rolloutbus.cli", *args], env=env, capture_output=True, text=True, timeout=180)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Beside the session broker's port, so that parallel test sessions on other ports do not collide.
UP_PORT = int(os.environ.get("ROLLOUTBUS_TEST_KAFKA_PORT", "29092")) + 500


def _java_pids(port: int) -> list[str]:
    out = subprocess.run(["pgrep", "-f", f"listeners=PLAINTEXT://127.0.0.1:{port}|kafka.Kafka"], capture_output=True, text=True)
    return out.stdout.split()


@pytest.mark.skipif(bool(os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")), reason="tests the local broker")
def test_up_status_down_twice_and_up_is_idempotent(tmp_path: Path) -> None:
    store_port = _free_port()
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"), ROLLOUTBUS_KAFKA_PORT=str(UP_PORT), ROLLOUTBUS_STORE_PORT=str(store_port))
    env.pop("ROLLOUTBUS_KAFKA_BOOTSTRAP", None)
    env.pop("ROLLOUTBUS_CLICKHOUSE_DSN", None)
    try:
        for _ in range(2):
            up = _cli(env, "up")
            assert up.returncode == 0, up.stderr
            assert f"started on 127.0.0.1:{UP_PORT}" in up.stdout
            assert f"store    started on http://127.0.0.1:{store_port}" in up.stdout
            pid = (tmp_path / "data" / "kafka" / "broker.pid").read_text().strip()
            store_pid = (tmp_path / "data" / "store" / "store.pid").read_text().strip()
            again = _cli(env, "up")
            assert again.returncode == 0, again.stderr
            assert "already running" in again.stdout and "store    already running" in again.stdout
            assert (tmp_path / "data" / "kafka" / "broker.pid").read_text().strip() == pid, "a second broker was started"
            assert (tmp_path / "data" / "store" / "store.pid").read_text().strip() == store_pid, "a second store was started"
            # Every process reaches the store over HTTP: `rolloutbus query` and curl.
            q = _cli(env, "query", "SELECT count() AS n FROM rollouts")
            assert q.returncode == 0 and q.stdout.splitlines()[-1].strip() == "0", q.stderr
            curl = subprocess.run(["curl", "-sS", f"http://127.0.0.1:{store_port}/?query=SELECT+count()+FROM+rolloutbus.spans"],
                                  capture_output=True, text=True, timeout=30)
            assert curl.stdout == "0\n", curl.stderr
            status = _cli(env, "status")
            assert status.returncode == 0, status.stderr
            assert f"store    pid {store_pid} on http://127.0.0.1:{store_port} (answers)" in status.stdout
            for topic in ("rb.spans", "rb.tasks", "rb.batches", "rb.resources", "rb.dlq"):
                assert topic in status.stdout
            assert "cleanup.policy=compact" in status.stdout
            down = _cli(env, "down")
            assert down.returncode == 0 and "store    stopped" in down.stdout and "kafka    stopped" in down.stdout
            assert not Path(f"/proc/{store_pid}").exists() or "Z" in Path(f"/proc/{store_pid}/stat").read_text().split(")")[-1][:3]
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
        stopped = _cli(env, "status")
        assert stopped.returncode == 1 and "not running" in stopped.stdout
    finally:
        _cli(env, "down")


def test_records_cross_the_real_broker_keyed_and_in_order(kafka_conf: dict[str, Any], topics: Any) -> None:
    producer = Producer({**kafka_conf, "enable.idempotence": True})
    sent = []
    for rollout in ("r-a", "r-b"):
        for seq in range(1, 6):
            span = Span(span_id=f"{rollout}-{seq}", trace_id="t" * 32, rollout_id=rollout, attempt_id="a1",
                        sequence_id=seq, name="step", start_time_ns=seq, end_time_ns=seq + 1)
            producer.produce(topics.spans, key=rollout.encode(), value=encode(span))
            sent.append(span)
        done = RolloutEvent(rollout_id=rollout, attempt_id="a1", event=RolloutEventType.FINISHED, time_ns=9,
                            task_id="t", status="succeeded", final_reward=1.0, span_count=5)
        producer.produce(topics.spans, key=rollout.encode(), value=encode(done))
    assert producer.flush(30) == 0
    consumer = Consumer({**kafka_conf, "group.id": f"g-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topics.spans])
    got: dict[str, list[Any]] = {}
    partitions: dict[str, set[int]] = {}
    try:
        while sum(len(v) for v in got.values()) < 12:
            msg = consumer.poll(10)
            assert msg is not None, "timed out waiting for records"
            assert msg.error() is None
            record = decode(msg.value())
            got.setdefault(msg.key().decode(), []).append(record)
            partitions.setdefault(msg.key().decode(), set()).add(msg.partition())
    finally:
        consumer.close()
    for rollout, records in got.items():
        assert len(partitions[rollout]) == 1, "one rollout must stay on one partition"
        assert [r.sequence_id for r in records[:-1]] == [1, 2, 3, 4, 5]
        assert isinstance(records[-1], RolloutEvent) and records[-1].event == RolloutEventType.FINISHED
    assert [s for r in ("r-a", "r-b") for s in got[r][:-1]] == sent


def test_clickhouse_migrations_are_idempotent_and_tables_readable(ch: Any, clickhouse_dsn: str) -> None:
    database = ch.database
    assert migrate(ch, database) == []
    tables = {r[0] for r in ch.query("SHOW TABLES").result_rows}
    assert {"spans", "rollouts", "transitions", "groups", "resource_versions", "train_steps", "dead_letters",
            "schema_migrations", "v_reward_by_version", "v_trajectory"} <= tables
    ch.insert("resource_versions", [["policy", 1, "model", "file:///x", "tiny", 3, 10, {"loss": 0.5}, {}]] * 2,
              column_names=["name", "version", "kind", "uri", "base_model", "step", "created_ns", "metrics", "config"])
    rows = ch.query("SELECT name, version, metrics['loss'] FROM resource_versions FINAL").result_rows
    assert rows == [("policy", 1, 0.5)], "ReplacingMergeTree + FINAL shows a re-delivered row once"
    # Analyst SQL runs on its own read-only client (in chDB a query's settings stick to its session).
    analyst = connect(clickhouse_dsn, database=database, create_database=False)
    try:
        with pytest.raises(Exception, match="(?i)readonly"):
            analyst.command("INSERT INTO resource_versions (name, version) VALUES ('x', 2)", settings={"readonly": 1})
    finally:
        analyst.close()
    assert ch.query("SELECT count() FROM resource_versions FINAL").result_rows == [(1,)]


@pytest.mark.parametrize("table, key", [("spans", "span_id"), ("transitions", "turn")])
def test_an_insert_of_token_ids_is_one_compact_part(ch: Any, table: str, key: str) -> None:
    """A sink-sized insert (12 MB of token ids, past ClickHouse's 10 MiB default for wide parts) is written as
    one compact part: a few files, not two per column (migration 004)."""
    ch.command(f"INSERT INTO {table} (rollout_id, attempt_id, {key}, prompt_token_ids) "
               "SELECT toString(number), 'a', " + ("toString(number)" if key == "span_id" else "number") +
               ", arrayMap(i -> toUInt32(i * number), range(1000)) FROM numbers(3000)")
    parts = ch.query("SELECT part_type, rows FROM system.parts WHERE database = currentDatabase() AND table = {t:String} "
                     "AND active", parameters={"t": table}).result_rows
    assert parts == [("Compact", 3000)]


def test_clickhouse_errors_are_clear(clickhouse_dsn: str) -> None:
    with pytest.raises(ConfigError, match="must start with chdb://"):
        connect("mysql://nope")
    with pytest.raises(ClickHouseError, match=r"cannot reach ClickHouse at http://default:\*\*\*@127.0.0.1:1"):
        connect("http://default:hunter2@127.0.0.1:1/x")
