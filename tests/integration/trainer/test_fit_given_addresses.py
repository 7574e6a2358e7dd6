"""``Trainer.fit`` on given addresses: a broker (the session's) and a ClickHouse store (``rolloutbus store``, the
real engine behind HTTP) that fit did not start, holding another run's topics, consumer group offsets and rows.
fit starts neither, trains in a namespace of its own (topics ``<prefix>fit-<run>.*``, database
``<database>_fit_<run>``), evaluates ``test_dataset`` there, and leaves every record of the other run as it found
it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fit_script import fit_script
from tests.integration.store.conftest import start_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(780)]

SCRIPT = fit_script(max_steps=2, test_rows=2)


def _other_run(conf: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Another run's topics with records and a consumer group with a committed offset; what they hold now."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from foundation.config import Topics
    from foundation.kafka_admin import ensure_topics, topic_specs

    topics = Topics(prefix)
    ensure_topics(conf, topic_specs(topics, 4))
    producer = Producer(conf)
    for name in (topics.spans, topics.tasks, topics.resources):
        producer.produce(name, key=b"earlier", value=b"the other run's record", partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({**conf, "group.id": f"{prefix}streams", "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topics.spans, 0, 1)], asynchronous=False)
    consumer.close()
    return _kafka_state(conf, prefix)


def _kafka_state(conf: dict[str, Any], prefix: str) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    from foundation.config import Topics

    topics = Topics(prefix)
    consumer = Consumer({**conf, "group.id": f"{prefix}streams", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(timeout=10).topics
        marks = {(name, p): consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                 for name in topics.all() for p in meta[name].partitions}
        committed = [tp.offset for tp in consumer.committed([TopicPartition(topics.spans, 0)], timeout=10)]
    finally:
        consumer.close()
    return {"watermarks": marks, "committed": committed}


def _rows(client: Any) -> dict[str, list[tuple[Any, ...]]]:
    return {"resource_versions": [tuple(r) for r in client.query(
                "SELECT name, version, uri FROM resource_versions FINAL ORDER BY name, version").result_rows],
            "groups": [tuple(r) for r in client.query(
                "SELECT group_id, task_id, rewards FROM groups FINAL ORDER BY group_id").result_rows],
            "transitions": [tuple(r) for r in client.query("SELECT count() FROM transitions").result_rows]}


def test_fit_on_given_addresses_trains_in_its_own_namespace_and_leaves_the_other_run_alone(
        tmp_path: Path, kafka_bootstrap: str) -> None:
    from foundation.clickhouse import connect, migrate

    tag = uuid.uuid4().hex[:6]
    prefix, database = f"shared{tag}.", f"shared_{tag}"
    conf = {"bootstrap.servers": kafka_bootstrap}
    kafka_before = _other_run(conf, prefix)
    store = start_store(tmp_path / "store")
    try:
        client = connect(store.url, database=database)
        migrate(client, database)
        # The other run's version 0 and 1 of "policy" and its first group: the names a new run repeats.
        client.insert("resource_versions", [["policy", 0, "earlier-run/v0"], ["policy", 1, "earlier-run/v1"]],
                      column_names=["name", "version", "uri"])
        client.insert("groups", [["train-00000@0", "train-00000", [1.0, 0.0]]], column_names=["group_id", "task_id", "rewards"])
        rows_before = _rows(client)

        env = dict(os.environ, ROLLOUTBUS_KAFKA_BOOTSTRAP=kafka_bootstrap, ROLLOUTBUS_TOPIC_PREFIX=prefix,
                   ROLLOUTBUS_CLICKHOUSE_DSN=store.url, ROLLOUTBUS_CLICKHOUSE_DATABASE=database,
                   ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"), PYTHONUNBUFFERED="1")
        script, out = tmp_path / "given.py", tmp_path / "out"
        script.write_text(SCRIPT)
        proc = subprocess.run([sys.executable, str(script), str(out)], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=660)
        logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted((out / "logs").glob("*.log"))) \
            if (out / "logs").exists() else ""
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{logs}"
        head = proc.stdout.splitlines()[:3]
        assert head[0] == f"kafka      {kafka_bootstrap} (ROLLOUTBUS_KAFKA_BOOTSTRAP): nothing started or deleted there", head
        assert head[1] == f"store      {store.url} (ROLLOUTBUS_CLICKHOUSE_DSN): nothing started or deleted there", head
        run = re.match(r"run        (\w+): ", head[2])
        assert run, head
        result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
        assert result["versions"][0] == 0 and max(result["versions"]) > 0, result  # its own numbering: from 0
        assert result["held_out"] == 2, result  # the held-out evaluation's spans: on the run's topics too (checked below)

        # The run trained, in its own database ...
        own = connect(store.url, database=f"{database}_fit_{run.group(1)}", create_database=False)
        try:
            trained = own.query("SELECT countIf(trained) FROM transitions FINAL").result_rows[0][0]
            versions = own.query("SELECT max(version) FROM resource_versions FINAL WHERE name = 'policy'").result_rows[0][0]
        finally:
            own.close()
        assert trained > 0 and versions > 0, (trained, versions, logs)
        # ... on its own topics ...
        from confluent_kafka.admin import AdminClient

        names = set(AdminClient(conf).list_topics(timeout=10).topics)
        assert f"{prefix}fit-{run.group(1)}.batches" in names
        # ... and the other run's topics, group offsets and rows are as they were.
        assert _kafka_state(conf, prefix) == kafka_before
        assert _rows(client) == rows_before
        client.close()
    finally:
        store.proc.terminate()
        store.proc.wait(30)
