"""The task runner against the real broker: groups, retries, resource versions, committed offsets."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from producers import SpanTransport, emit_state
from rolloutbus import LitAgent
from producers.runner import TaskRunner
from producers.tasks_cli import parse_tasks
from producers_testkit import consume_all
from schemas.codec import encode
from schemas.models import ResourceVersion

pytestmark = pytest.mark.integration


class Flaky(LitAgent):
    name = "flaky"

    def __init__(self) -> None:
        self.failed: set[str] = set()
        self.versions: list[int] = []

    async def rollout(self, task: Any, resources: Any, rollout: Any) -> float:
        self.versions.append(resources["main_llm"].version)
        emit_state(task)
        if task.get("flaky") and rollout.rollout_id not in self.failed:
            self.failed.add(rollout.rollout_id)
            raise RuntimeError("first attempt fails")
        await asyncio.sleep(0.01)
        return float(task["x"])


def test_runner_runs_groups_retries_and_commits(kafka_conf: dict[str, Any], topics: Any, tmp_path: Path) -> None:
    p = Producer(kafka_conf)
    p.produce(topics.resources, encode(ResourceVersion(name="policy", version=3, created_ns=1)), b"policy")
    tasks = parse_tasks([json.dumps({"task_id": "a", "input": {"x": 1}, "group_size": 2}),
                         json.dumps({"task_id": "b", "input": {"x": 2, "flaky": True}, "group_size": 2})])
    for t in tasks:
        p.produce(topics.tasks, encode(t), t.task_id.encode())
    p.produce(topics.tasks, b"not avro", b"junk")
    p.flush(10)

    transport = SpanTransport(kafka_conf, topics.spans, tmp_path / "spool")
    agent = Flaky()
    group = f"runners-{uuid.uuid4().hex[:6]}"
    runner = TaskRunner(agent.as_runner_agent(), kafka_conf, topics, transport, group=group, concurrency=3, max_attempts=2, timeout_s=30, heartbeat_s=None)
    assert runner.resources.ready.wait(15)
    stats = asyncio.run(runner.run(idle_exit_s=3))
    runner.resources.stop()
    assert transport.close(30) == 0
    assert (stats.tasks, stats.succeeded, stats.failed, stats.dead_letters) == (2, 4, 2, 1)
    assert set(agent.versions) == {3}

    records = consume_all(kafka_conf, topics.spans, expect=4 * 2 + 2 * 2 + 6, timeout=30)
    finished = [r for _k, n, r, _p in records if n == "rolloutbus.RolloutEvent" and r["event"] == "FINISHED"]
    by_task: dict[str, list[tuple[str, int, str, float | None]]] = defaultdict(list)
    for f in finished:
        by_task[f["task_id"]].append((f["rollout_id"], f["attempt"], f["status"], f["final_reward"]))
    assert sorted((a, s, r) for _id, a, s, r in by_task["a"]) == [(1, "succeeded", 1.0), (1, "succeeded", 1.0)]
    b = sorted((a, s, r) for _id, a, s, r in by_task["b"])
    assert b == [(1, "failed", None), (1, "failed", None), (2, "succeeded", 2.0), (2, "succeeded", 2.0)]
    assert len({rid for rid, *_ in by_task["b"]}) == 2, "a retry keeps its rollout id"
    assert all(f["resource_version"] == 3 for f in finished)

    c = Consumer({**kafka_conf, "group.id": group})
    committed = c.committed([TopicPartition(topics.tasks, i) for i in range(4)], timeout=10)
    ends = {i: c.get_watermark_offsets(TopicPartition(topics.tasks, i), timeout=10)[1] for i in range(4)}
    c.close()
    assert sum(max(tp.offset, 0) for tp in committed) == sum(ends.values()) == 3, "every task (and the junk) committed"
    dlq = consume_all(kafka_conf, topics.dlq, expect=1, timeout=10)
    assert dlq[0][2]["reason"] == "decode.task" and dlq[0][2]["value"] == b"not avro"
