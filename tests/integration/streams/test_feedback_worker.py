"""Late feedback through the stream worker, on the real broker and the real ClickHouse engine (chDB)."""

from __future__ import annotations

import re
import signal
import time

from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from schemas import codec
from schemas.models import Feedback, GroupBatch
from tests.integration.streams.helpers import WorkerProc, encoded, produce, query, read_topic, rollout, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FINISHED = 10**18  # the helper's rollouts finish at this time_ns


def _fb(fid: str, rid: str, value: float, after_s: float) -> tuple[str, bytes]:
    return rid, codec.encode(Feedback(feedback_id=fid, rollout_id=rid, value=value, time_ns=FINISHED + int(after_s * 1e9), source="test"))


def _committed(conf: dict[str, Any], group: str, topic: str, proc: WorkerProc, timeout: float = 120) -> None:
    """Wait until ``group`` committed every record of ``topic`` (the worker commits only what is written)."""
    c = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        parts = [TopicPartition(topic, p) for p in c.list_topics(topic, timeout=30).topics[topic].partitions]
        ends = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.output()[-3000:]
            try:
                # a partition with no records has no commit (a negative offset)
                if [max(tp.offset, 0) for tp in c.committed(parts, timeout=10)] == ends:
                    return
            except KafkaException:  # the group's coordinator not known yet
                pass
            time.sleep(0.5)
    finally:
        c.close()
    raise AssertionError(f"{group} did not commit {topic} to its end: {proc.output()[-3000:]}")


def test_feedback_applied_once_under_restart_and_redelivery_and_dead_lettered_with_reasons(kafka_conf, topics, test_env):
    flags = ("--feedback-window", "60", "--feedback-baseline", "none")
    inputs = {rid: rollout(rid, "", reward=0.0) for rid in ("p-r1", "p-r2", "p-r3")}  # no task: production traffic
    inputs["g-r1"] = rollout("g-r1", "g", reward=0.0)  # in a GRPO group of 4 that stays open
    produce(kafka_conf, topics.spans, [kv for spans, ev in inputs.values() for kv in encoded(spans, ev)])
    proc = start_worker(test_env, *flags)
    _committed(kafka_conf, f"{topics.prefix}streams.spans", topics.spans, proc)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]

    produce(kafka_conf, topics.feedback, [
        _fb("f1", "p-r1", 1.0, 5),
        _fb("f1", "p-r1", 1.0, 5),      # the same feedback delivered twice: applied once, not dead-lettered
        _fb("f2", "p-r1", -1.0, 6),     # a second feedback for one rollout: the first wins
        _fb("f3", "p-r2", 1.0, 3600),   # an hour late, the window is a minute
        _fb("f4", "nobody", 1.0, 1),    # no such rollout
        _fb("f5", "p-r3", 0.5, 30),
        _fb("f6", "g-r1", 1.0, 2),      # its group's emission would write the rollout's row again
    ])
    proc = start_worker(test_env, *flags)
    got = read_topic(kafka_conf, topics.batches, 2, 60, proc, distinct=True)
    proc.send_signal(signal.SIGKILL)  # whatever was not acked yet is read again by the next worker
    proc.wait(30)
    # delivered again after the restart: the table entries restored from their changelog (or the rows in
    # ClickHouse, where the kill came before the entries) say they were applied
    produce(kafka_conf, topics.feedback, [_fb("f1", "p-r1", 1.0, 5), _fb("f5", "p-r3", 0.5, 30)])
    proc = start_worker(test_env, *flags)
    _committed(kafka_conf, f"{topics.prefix}streams", topics.feedback, proc)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    redelivered = re.search(r"'feedback_redelivered': (\d+)", out)
    assert redelivered is not None and int(redelivered.group(1)) >= 2, out[-3000:]
    got = read_topic(kafka_conf, topics.batches, 99, 5)

    batches = [codec.decode(v) for _, v in got]
    assert all(isinstance(b, GroupBatch) for b in batches)
    # Training sees each applied feedback once: copies (a replay after the kill) carry one group id, the
    # trainer's dedup key, and the same content.
    by_id: dict[str, set[tuple]] = {}
    for b in batches:
        by_id.setdefault(b.group_id, set()).add((tuple(b.rollout_ids), tuple(b.rewards), tuple(b.advantages), len(b.transitions)))
    assert by_id == {"feedback:p-r1": {(("p-r1",), (1.0,), (1.0,), 2)}, "feedback:p-r3": {(("p-r3",), (0.5,), (0.5,), 2)}}

    rows = query(test_env, {
        "ro": "SELECT rollout_id, final_reward, metadata['rolloutbus.feedback_id'], group_id FROM rollouts FINAL ORDER BY rollout_id",
        "tr": "SELECT rollout_id, turn, advantage, group_id FROM transitions FINAL ORDER BY rollout_id, turn",
        "dlq": "SELECT reason, uniqExact(partition, offset), any(detail) FROM dead_letters FINAL "
               f"WHERE source_topic = '{topics.feedback}' GROUP BY reason ORDER BY reason",
    })
    assert rows["ro"] == [["g-r1", 0.0, "", "g@1"], ["p-r1", 1.0, "f1", "feedback:p-r1"], ["p-r2", 0.0, "", ""],
                          ["p-r3", 0.5, "f5", "feedback:p-r3"]]
    assert rows["tr"] == [["g-r1", 0, 0.0, "g@1"], ["g-r1", 1, 0.0, "g@1"],
                          ["p-r1", 0, 1.0, "feedback:p-r1"], ["p-r1", 1, 1.0, "feedback:p-r1"],
                          ["p-r2", 0, 0.0, ""], ["p-r2", 1, 0.0, ""],
                          ["p-r3", 0, 0.5, "feedback:p-r3"], ["p-r3", 1, 0.5, "feedback:p-r3"]]
    reasons = {r[0]: (r[1], r[2]) for r in rows["dlq"]}
    assert {k: v[0] for k, v in reasons.items()} == {
        "feedback.after_window": 1, "feedback.duplicate": 1, "feedback.group_open": 1, "feedback.unknown_rollout": 1}
    assert "GRPO group g@1, not emitted yet" in reasons["feedback.group_open"][1]
    assert "window is 60s" in reasons["feedback.after_window"][1]
    assert "already has feedback f1" in reasons["feedback.duplicate"][1]
    assert "'nobody'" in reasons["feedback.unknown_rollout"][1]
