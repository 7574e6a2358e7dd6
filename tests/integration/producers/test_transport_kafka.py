"""The span transport against the real broker: keyed order, a broker restart, a SIGKILLed producer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from producers import SpanTransport, emit_reward, emit_state, emit_tool_call, rollout
from producers_testkit import consume_all

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]


def test_concurrent_rollouts_arrive_keyed_and_in_sequence(kafka_conf: dict[str, Any], topics: Any, tmp_path: Path) -> None:
    transport = SpanTransport(kafka_conf, topics.spans, tmp_path / "spool")
    ids: dict[int, str] = {}

    def agent(n: int) -> None:
        with rollout(f"task-{n}", transport=transport, agent_name="worker") as r:
            ids[n] = r.rollout_id
            for i in range(40):
                emit_state({"step": i})
                if i % 10 == 0:
                    emit_tool_call("search", {"q": i}, result="ok")
            emit_reward({"correct": 1.0, "len": 0.2}, primary="correct")

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert transport.close(30) == 0

    records = consume_all(kafka_conf, topics.spans, expect=6 * (40 + 4 + 1 + 2))
    by_rollout: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    partitions: dict[str, set[int]] = defaultdict(set)
    for key, name, rec, part in records:
        assert key.decode() == rec["rollout_id"]
        by_rollout[rec["rollout_id"]].append((name, rec))
        partitions[rec["rollout_id"]].add(part)
    assert set(by_rollout) == set(ids.values())
    for rid, recs in by_rollout.items():
        assert len(partitions[rid]) == 1
        assert recs[0][1]["event"] == "STARTED" and recs[-1][1]["event"] == "FINISHED"
        seqs = [r["sequence_id"] for n, r in recs if n == "rolloutbus.Span"]
        assert seqs == list(range(1, 46)), "consumed in emission order, sequence ids 1..45 without gaps"
        finished = recs[-1][1]
        assert finished["status"] == "succeeded" and finished["final_reward"] == 1.0 and finished["span_count"] == 45
        reward = recs[-2][1]["reward"]
        assert reward == {"value": 1.0, "primary": "correct", "dimensions": {"correct": 1.0, "len": 0.2}}


def test_a_full_librdkafka_queue_sends_the_rest_from_the_spool_once_in_order(kafka_conf: dict[str, Any], topics: Any, tmp_path: Path) -> None:
    # librdkafka takes 8 records at a time: most batches meet BufferError part way, and what it did not
    # take waits in the spool, to be read back and sent after the records before it.
    transport = SpanTransport(kafka_conf, topics.spans, tmp_path / "spool", producer_overrides={"queue.buffering.max.messages": 8})
    with rollout("task-full", transport=transport) as r:
        for i in range(600):
            emit_state(i)
    assert transport.close(60) == 0
    assert transport.counters["replayed"] > 0, "the spool path was taken"
    records = consume_all(kafka_conf, topics.spans, expect=602)
    spans = [rec for key, name, rec, _ in records if name == "rolloutbus.Span"]
    assert all(rec["rollout_id"] == r.rollout_id for rec in spans)
    assert [rec["sequence_id"] for rec in spans] == list(range(1, 601)), "each once, in emission order"
    assert [rec["attributes"]["state"] for rec in spans] == [str(i) for i in range(600)]


def test_a_record_the_broker_rejects_for_good_is_kept_aside_and_the_rest_is_acknowledged(kafka_conf: dict[str, Any], tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"small-{uuid.uuid4().hex[:8]}"  # takes records of up to 2,000 bytes
    admin = AdminClient(kafka_conf)
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"})])[topic].result(30)
    transport = SpanTransport(kafka_conf, topic, tmp_path / "spool")
    with rollout("task-big", transport=transport):
        for i in range(30):
            emit_state(i)
        assert transport.flush(30) == 0
        big = os.urandom(4000).hex()  # over the topic's limit even compressed: the broker refuses it, not retriable
        emit_state(big)
        assert transport.flush(30) == 0, "the refused record does not hold the others back"
        for i in range(30):
            emit_state(i)
    assert transport.close(30) == 0
    assert transport.counters["delivery_failed"] == 1
    assert transport.spool.pending == 0
    assert big.encode() in next((tmp_path / "spool").rglob("rejected")).read_bytes()
    records = consume_all(kafka_conf, topic, expect=62)
    assert sorted(rec["sequence_id"] for _, name, rec, _ in records if name == "rolloutbus.Span") == list(range(1, 31)) + list(range(32, 62))


def test_broker_restart_mid_run_loses_nothing(kafka_conf: dict[str, Any], topics: Any, tmp_path: Path, local_broker: Any) -> None:
    transport = SpanTransport(kafka_conf, topics.spans, tmp_path / "spool")
    with rollout("t", transport=transport) as r:
        for i in range(300):
            emit_state(i)
        assert transport.flush(20) == 0
        local_broker.stop()
        try:
            for i in range(300, 900):
                emit_state(i)
            time.sleep(1.0)
            stats = transport.stats()
            assert stats["spool_pending"] >= 600, "spans emitted while the broker is down wait in the spool"
            assert stats["dropped_queue_full"] == stats["dropped_spool_full"] == 0
        finally:
            local_broker.start()
    assert transport.close(60) == 0

    records = consume_all(kafka_conf, topics.spans, expect=902, timeout=60)
    spans = [rec for _k, name, rec, _p in records if name == "rolloutbus.Span"]
    counts = Counter(s["span_id"] for s in spans)
    assert len(counts) == 900 and max(counts.values()) == 1, "every span exactly once"
    assert [s["sequence_id"] for s in spans] == list(range(1, 901))
    assert [s["attributes"]["state"] for s in spans] == [str(i) for i in range(900)]
    assert r.rollout_id == spans[0]["rollout_id"]


CHILD = """
import os, sys, time
from pathlib import Path
from producers import SpanTransport, emit_state, rollout
t = SpanTransport({"bootstrap.servers": os.environ["ROLLOUTBUS_KAFKA_BOOTSTRAP"]}, sys.argv[1], Path(sys.argv[2]))
if sys.argv[3] == "emit":
    r = rollout("killed", transport=t, rollout_id="ro-killed")
    r.__enter__()
    for i in range(250):
        emit_state(i)
    while t.stats()["enqueued"] < 251:
        time.sleep(0.01)
    time.sleep(0.2)  # the worker hands the spool to the OS each loop
    print("ready", flush=True)
    time.sleep(600)
else:
    print("left", t.close(60), flush=True)
"""


def test_sigkilled_producer_spool_replays_on_next_start(
    test_env: dict[str, str], topics: Any, kafka_conf: dict[str, Any], tmp_path: Path, local_broker: Any
) -> None:
    env = {**test_env, "PYTHONPATH": str(REPO)}
    spool = tmp_path / "spool"
    local_broker.stop()
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, topics.spans, str(spool), "emit"], env=env, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        local_broker.start()
    assert any(spool.glob("agent-0/*.seg")), "the killed process left its spool on disk"

    done = subprocess.run(
        [sys.executable, "-c", CHILD, topics.spans, str(spool), "replay"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "left 0", done.stderr[-2000:]
    records = consume_all(kafka_conf, topics.spans, expect=251, timeout=30)
    spans = [rec for _k, name, rec, _p in records if name == "rolloutbus.Span"]
    assert [s["sequence_id"] for s in spans] == list(range(1, 251))
    assert len({s["span_id"] for s in spans}) == 250
    assert [name for _k, name, _r, _p in records][0] == "rolloutbus.RolloutEvent"
    assert not any(spool.glob("agent-0/*.seg")), "a replayed spool is emptied"


def test_block_policy_holds_the_emitter_until_the_broker_returns_and_loses_nothing(
    kafka_conf: dict[str, Any], topics: Any, tmp_path: Path, local_broker: Any
) -> None:
    """spool_full_policy=block: with the broker down and the spool full, emit blocks (counted) instead
    of dropping; once Kafka is back everything arrives exactly once."""
    transport = SpanTransport(kafka_conf, topics.spans, tmp_path / "spool", spool_max_bytes=40_000, max_queue=50, on_full="block")
    value = b"\x00" * 200
    assert transport.emit_encoded(b"warm", value) and transport.flush(20) == 0
    local_broker.stop()
    done = threading.Event()

    def emit_many() -> None:
        for i in range(1000):
            transport.emit_encoded(f"k{i % 7}".encode(), value)
        done.set()

    emitter = threading.Thread(target=emit_many, daemon=True)
    try:
        emitter.start()
        time.sleep(4.0)
        stats = transport.stats()
        assert not done.is_set(), "the emitter is held while nothing can take its spans"
        assert stats["blocked"] >= 1 and stats["dropped_queue_full"] == stats["dropped_spool_full"] == 0, stats
        assert stats["spool_bytes"] <= 40_000 + 300, stats
    finally:
        local_broker.start()
    assert done.wait(120), transport.stats()
    assert transport.close(60) == 0
    stats = transport.stats()
    assert stats["dropped_queue_full"] == stats["dropped_spool_full"] == 0, stats
    c = __import__("confluent_kafka").Consumer({**kafka_conf, "group.id": f"blk-{time.time_ns()}", "auto.offset.reset": "earliest"})
    c.subscribe([topics.spans])
    keys: Counter[bytes] = Counter()
    deadline = time.monotonic() + 60
    while sum(keys.values()) < 1001 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            keys[m.key()] += 1
    end = time.monotonic() + 2
    while time.monotonic() < end:  # duplicates would show up now
        m = c.poll(0.2)
        if m is not None and not m.error():
            keys[m.key()] += 1
    c.close()
    assert keys[b"warm"] == 1 and sum(keys.values()) == 1001, keys
