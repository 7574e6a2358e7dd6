"""The feedback stage decides a batch of records (their ClickHouse reads shared) exactly as it decides each alone,
on a real store (``rolloutbus store`` over HTTP, as the demo's worker reads it); Kafka replaced by stand-ins."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from schemas import codec
from schemas.models import Feedback, GroupBatch
from bench.bench_feedback_stage import _Producer, _Stream, _Table, _Topic  # the bench's stand-ins for Kafka
from tests.integration.store.conftest import start_store
from tests.integration.streams.helpers import rollout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FINISHED = 10**18  # the helper's rollouts finish at this time_ns


def _seed(client: Any) -> None:
    from streams.rollout import Settings, finish_attempt
    from streams.sink import ClickHouseSink, rollout_row

    sink = ClickHouseSink(client)

    def add(rid: str, gid: str = "", turns: int = 2, mode: str = "train", attempt: int = 1) -> None:
        spans, ev = rollout(rid, gid.split("@")[0], reward=0.25, turns=turns)
        aid = f"{rid}-a{attempt}"
        spans = [s.model_copy(update={"attempt_id": aid}) for s in spans]
        ev = ev.model_copy(update={"attempt_id": aid, "attempt": attempt, "mode": mode, "time_ns": FINISHED + attempt})
        result = finish_attempt(spans, ev, Settings())
        sink.add("rollouts", rollout_row(result, gid, FINISHED + attempt))
        sink.add_transitions(result, gid, FINISHED + attempt)

    add("a")
    add("b", turns=1)
    add("b", turns=3, attempt=2)  # its latest attempt: the one feedback reads, with its own steps
    add("g-open", "t1@1")
    add("g-done", "t2@1")
    add("test", mode="test")
    add("late")
    add("c")
    sink.flush()
    client.command("INSERT INTO groups (group_id, task_id, group_size, rollouts, complete, zero_variance, credit, rollout_ids, "
                   "rewards, advantages, reward_mean, reward_std, created_ns) VALUES ('t2@1', 't2', 4, 4, true, false, "
                   "'identical', [], [], [], 0, 0, 1)")


FEEDBACK = [
    ("a", "f1", 1.0, 5), ("a", "f1", 1.0, 5),  # again: counted, not applied twice
    ("a", "f2", -1.0, 6),                      # a second one: duplicate
    ("b", "f3", 1.0, 7), ("g-open", "f4", 1.0, 8), ("g-done", "f5", 0.5, 9), ("test", "f6", 1.0, 10),
    ("late", "f7", 1.0, 3600), ("nobody", "f8", 1.0, 1), ("c", "f9", 0.0, 2),
]


async def _run(client: Any, batch: int) -> dict[str, Any]:
    from streams.feedback_stage import FeedbackStage
    from streams.sink import ClickHouseSink

    sink = ClickHouseSink(client)
    sent: dict[str, list[tuple[bytes | None, bytes]]] = {"rb.batches": [], "rb.dlq": []}

    class Topic(_Topic):
        def send_soon(self, key: bytes | None, value: bytes) -> Any:
            sent[self.name].append((key, value))
            return super().send_soon(key, value)

    table = _Table()
    stage = FeedbackStage(SimpleNamespace(producer=_Producer()), sink=sink, health=None, batches_topic=Topic("rb.batches"),  # type: ignore[arg-type]
                          dlq_topic=Topic("rb.dlq"), table=table, flush=sink.flush, submit=sink.submit, window_s=60.0,
                          baseline="loo", batch=batch)
    reads = []
    query = stage._query

    async def counted(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        reads.append(sql.split(" FROM ")[1].split()[0])
        return await query(sql, params)

    stage._query = counted  # type: ignore[method-assign]
    values = [codec.encode(Feedback(feedback_id=fid, rollout_id=rid, value=v, time_ns=FINISHED + int(after * 1e9), source="t"))
              for rid, fid, v, after in FEEDBACK] + [b"\x00garbage"]
    stream = _Stream()
    for i, value in enumerate(values):
        event = SimpleNamespace(message=SimpleNamespace(topic="rb.feedback", partition=0, offset=i, key=b"k", value=value))
        await stage.on_feedback(event)
        stage.ack_later(stream, event)
        assert stage._pending == [] or batch == 1, "no ack before its record is decided"
    await stage.drain()
    dead = [codec.decode(v) for _, v in sent["rb.dlq"]]
    return {
        "rollouts": sink._buffers["rollouts"].rows, "transitions": sink._buffers["transitions"].rows,
        "batches": [codec.decode(v) for _, v in sent["rb.batches"]],
        "dead": [(d.offset, d.reason, d.detail) for d in dead],  # type: ignore[attr-defined]
        "stats": stage.stats, "table": table.data, "acks": len(stage._pending), "reads": reads,
    }


def test_a_batch_is_decided_as_each_record_alone_with_three_reads(tmp_path: Path) -> None:
    from foundation.clickhouse import open_store

    store = start_store(tmp_path / "store")
    try:
        client = open_store(store.url, "rolloutbus")
        _seed(client)
        alone = asyncio.run(_run(client, batch=1))
        together = asyncio.run(_run(client, batch=64))
    finally:
        store.proc.terminate()
        store.proc.wait(30)
    assert together["reads"] == ["rollouts", "groups", "transitions"]
    # alone: each record's rollout, then its group (g-open, g-done) or its steps (a, b, c: task-less train rollouts applied)
    assert len(alone["reads"]) == 10 + 2 + 3
    reads_alone, reads_together = alone.pop("reads"), together.pop("reads")
    assert together == alone, (reads_alone, reads_together)

    assert alone["stats"] == {"feedback_applied": 5, "feedback_redelivered": 1, "feedback_dead": 4}  # + 1 undecodable
    assert alone["acks"] == 11
    assert sorted((o, r) for o, r, _ in alone["dead"]) == [
        (2, "feedback.duplicate"), (4, "feedback.group_open"), (7, "feedback.after_window"), (8, "feedback.unknown_rollout"),
        (10, "decode.not_avro")]
    batches = {b.group_id: b for b in alone["batches"]}
    assert all(isinstance(b, GroupBatch) for b in batches.values()) and sorted(batches) == ["feedback:a", "feedback:b", "feedback:c"]
    assert [t.attempt_id for t in batches["feedback:b"].transitions] == ["b-a2"] * 3, "the latest attempt's steps"
    assert {r["rollout_id"]: r["final_reward"] for r in alone["rollouts"]} == {"a": 1.0, "b": 1.0, "g-done": 0.5, "test": 1.0, "c": 0.0}
