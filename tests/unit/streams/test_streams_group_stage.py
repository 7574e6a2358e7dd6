"""The group stage's emission and commit point, on a Worker with stand-ins for faust's parts.

What the scale-out fault test (tests/faults/test_scale_out.py) found, reduced: the timer and the
agent emitting one group twice, a worker emitting groups of partitions it does not own, offsets
acked before the records they caused were on the broker, and a group whose member's summary a
rebalance did not recover.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from streams.app import Config, Worker
from streams.grouping import GroupPolicy, group_id
from streams.rollout import Settings, finish_attempt
from streams.spans_stage import SEP
from tests.unit.streams.spans import finished, llm

DONE = "x.rollouts-done"
GID = group_id("task1", 3)


def result(rid: str, reward: float = 1.0) -> Any:
    ev = finished(rid, f"{rid}-1", task="task1", reward_=reward, span_count=1, resource_version=3, time_ns=10_000)
    return finish_attempt([llm(1, rid=rid, att=f"{rid}-1")], ev, Settings())


def done_future() -> asyncio.Future[Any]:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


class FakeTable:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def send_changelog(self, partition: int, key: bytes, value: bytes | None) -> Any:
        return done_future()


class FakeTopic:
    """``send`` yields to the loop as faust's does; ``send_soon`` only queues."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[bytes] = []

    def get_topic_name(self) -> str:
        return self.name

    def send_soon(self, key: bytes, value: bytes) -> Any:
        self.sent.append(key)
        return done_future()

    async def send(self, key: bytes, value: bytes) -> Any:
        await asyncio.sleep(0)
        return self.send_soon(key, value)


class FakeSink:
    pending = 0

    def add(self, *args: Any, **kwargs: Any) -> None:
        pass

    def add_transitions(self, *args: Any, **kwargs: Any) -> None:
        pass


class FakeProducer:
    async def flush(self) -> None:  # like faust's: returns with records still in its buffer
        pass


def worker(owned: tuple[int, ...] = (1,), timeout_s: float = 300.0) -> Any:
    w = Worker.__new__(Worker)
    w.cfg = Config(app_id="x", broker="kafka://", topic_prefix="x.", partitions=6,
                   groups=GroupPolicy(group_size=2, min_rollouts=1, timeout_s=timeout_s))
    w.sink = FakeSink()
    w.group_state, w.group_members = FakeTable(), FakeTable()
    w.done_topic, w.batches_topic = FakeTopic(DONE), FakeTopic("x.batches")
    w.app = SimpleNamespace(rebalancing=False, producer=FakeProducer(),
                            consumer=SimpleNamespace(assignment=lambda: {TP(DONE, p) for p in owned}))
    w._open_groups, w._incomplete, w._last_scan, w._dirty, w._sent, w._pending = set(), set(), 0, {}, [], []
    w._lock = asyncio.Lock()
    w.stats = {"groups": 0}
    return w


def arrival(rid: str, partition: int = 1) -> Any:
    return SimpleNamespace(message=SimpleNamespace(value=result(rid).to_bytes(), key=GID.encode(), partition=partition))


def open_group(w: Any, gid: str, partition: int, rid: str) -> None:
    """An open group as the table holds it (restored, a standby copy, or from before a rebalance)."""
    r = result(rid)
    w.group_state.data[gid.encode()] = json.dumps({"p": partition, "first": 0, "members": {rid: [r.attempt, r.finished_ns]},
                                                   "emitted": False}).encode()
    w.group_members.data[f"{gid}{SEP}{rid}".encode()] = r.to_bytes()


def test_the_timer_and_the_agent_never_both_emit_a_group() -> None:
    async def run() -> list[bytes]:
        w = worker()
        await w.on_rollout_done(arrival("a"))
        w._last_scan = 0  # a full scan is due on the timer's next tick
        # The last member arrives while the timer ticks: whichever runs first emits, the other sees it emitted.
        await asyncio.gather(w.on_rollout_done(arrival("b")), w.expire_groups())
        await w.expire_groups()
        return w.batches_topic.sent

    assert asyncio.run(run()) == [GID.encode()]


def test_a_worker_expires_only_groups_of_the_partitions_it_owns() -> None:
    async def run(rebalancing: bool) -> list[bytes]:
        w = worker(owned=(1,), timeout_s=1.0)
        w.app.rebalancing = rebalancing
        open_group(w, "mine@1", 1, "a")
        open_group(w, "standby@1", 4, "b")  # partition 4 is another worker's: its standby copy lags
        await w.expire_groups()
        return w.batches_topic.sent

    assert asyncio.run(run(False)) == [b"mine@1"]
    assert asyncio.run(run(True)) == []  # nor while faust rebalances and recovers the tables


def test_the_commit_point_acks_only_after_the_broker_has_what_was_produced() -> None:
    async def run(fail: bool) -> tuple[list[str], list[str], Any]:
        w = worker()
        acked: list[str] = []

        async def ack(event: str) -> None:
            acked.append(event)

        delivery = asyncio.get_running_loop().create_future()
        w._sent = [delivery]  # e.g. a changelog entry still in faust's send buffer
        w._pending = [(SimpleNamespace(ack=ack), "event")]
        task = asyncio.ensure_future(w.commit_point())
        await asyncio.sleep(0.05)
        before = list(acked)
        if fail:
            delivery.set_exception(RuntimeError("delivery failed"))
        else:
            delivery.set_result(None)
        try:
            await task
        except RuntimeError:
            pass
        return before, acked, [e for _s, e in w._pending]

    assert asyncio.run(run(False)) == ([], ["event"], [])
    before, acked, pending = asyncio.run(run(True))
    assert acked == [] and pending == ["event"]  # kept for the next commit point


def test_a_group_with_a_members_summary_missing_waits_instead_of_going_out_short() -> None:
    async def run() -> list[list[bytes]]:
        w = worker(owned=(1,), timeout_s=1.0)
        open_group(w, GID, 1, "a")
        state = json.loads(w.group_state.data[GID.encode()])
        state["members"]["b"] = [1, 10_000]  # b's summary never reached this worker's group-members table
        w.group_state.data[GID.encode()] = json.dumps(state).encode()
        sent = []
        await w.expire_groups()
        sent.append(list(w.batches_topic.sent))
        w.group_members.data[f"{GID}{SEP}b".encode()] = result("b").to_bytes()  # a later recovery brings it
        await w.expire_groups()
        sent.append(list(w.batches_topic.sent))
        return sent

    assert asyncio.run(run()) == [[], [GID.encode()]]
