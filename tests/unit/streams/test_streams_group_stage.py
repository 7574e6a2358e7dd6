"""The group stage's emission and commit point, with stand-ins for faust's parts.

What the scale-out fault test (tests/faults/test_scale_out.py) found, reduced: the timer and the
agent emitting one group twice, a worker emitting groups of partitions it does not own, offsets
acked before the records they caused were on the broker, and a group whose member's summary a
rebalance did not recover.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, NotLeaderForPartitionError

from foundation.errors import ClickHouseError, KafkaUnavailable
from streams.checkpoint import SinkWrites
from streams.grouping import GroupPolicy, group_id
from streams.groups_stage import GroupStage
from streams.health import StreamHealth
from streams.rollout import Settings, finish_attempt
from streams.sink import ClickHouseSink
from streams.spans_stage import SEP
from tests.unit.streams.spans import finished, llm
from tests.unit.streams.test_sink_pipeline import GatedClient

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
    def __init__(self, name: str = "group-state") -> None:
        self.name = name
        self.data: dict[bytes, bytes] = {}
        self.sent: list[tuple[int, bytes, bytes | None]] = []

    def send_changelog(self, partition: int, key: bytes, value: bytes | None) -> Any:
        self.sent.append((partition, key, value))
        return done_future()


class FakeTopic:
    """``send_soon`` only queues. Each record's delivery is the next of ``outcomes`` (delivered when none
    is left): ``"wait"`` stays unanswered (in ``waiting``), an exception fails it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[bytes] = []
        self.outcomes: list[Any] = []
        self.waiting: list[asyncio.Future[Any]] = []

    def get_topic_name(self) -> str:
        return self.name

    def send_soon(self, key: bytes, value: bytes) -> Any:
        self.sent.append(key)
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is None:
            return done_future()
        fut = asyncio.get_running_loop().create_future()
        if outcome == "wait":
            self.waiting.append(fut)
        else:
            fut.set_exception(outcome)
        return fut


class FakeSink:
    pending = 0

    def add(self, *args: Any, **kwargs: Any) -> None:
        pass

    def add_transitions(self, *args: Any, **kwargs: Any) -> None:
        pass


class FakeProducer:
    async def flush(self) -> None:  # like faust's: returns with records still in its buffer
        pass


def worker(owned: tuple[int, ...] = (1,), timeout_s: float = 300.0, sink: Any = None, pipelined: bool = True,
           policy: GroupPolicy | None = None) -> Any:
    sink = sink if sink is not None else FakeSink()
    health = StreamHealth()
    writes = SinkWrites(sink, health)
    app = SimpleNamespace(rebalancing=False, producer=FakeProducer(),
                          consumer=SimpleNamespace(assignment=lambda: {TP(DONE, p) for p in owned}))
    return GroupStage(app, policy=policy or GroupPolicy(group_size=2, min_rollouts=1, timeout_s=timeout_s),
                      completed_retention_s=3600.0, sink=sink, health=health, done_topic=FakeTopic(DONE),
                      batches_topic=FakeTopic("x.batches"), dlq_topic=FakeTopic("x.dlq"), group_state=FakeTable(),
                      group_members=FakeTable("group-members"), flush=writes.flush, submit=writes.submit,
                      pipelined=pipelined)


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

        w.dlq_topic.outcomes = ["wait"]
        w._produce(w.dlq_topic, b"k", b"dead letter")  # e.g. still in faust's send buffer
        w._pending = [(SimpleNamespace(ack=ack), "event")]
        task = asyncio.ensure_future(w.commit_point())
        await asyncio.sleep(0.05)
        before = list(acked)
        if fail:
            w.dlq_topic.waiting[0].set_exception(KafkaTimeoutError())
        else:
            w.dlq_topic.waiting[0].set_result(None)
        try:
            await task
        except KafkaUnavailable:
            pass
        return before, acked, [e for _s, e in w._pending]

    assert asyncio.run(run(False)) == ([], ["event"], [])
    before, acked, pending = asyncio.run(run(True))
    assert acked == [] and pending == ["event"]  # kept for the next commit point


def sink_worker(client: GatedClient, pipelined: bool = True) -> tuple[Any, list[str]]:
    """A worker with a real sink on ``client``, one row buffered, one entry changed and one event to ack."""
    w = worker(sink=ClickHouseSink(client), pipelined=pipelined)
    acked: list[str] = []

    async def ack(event: str) -> None:
        acked.append(event)

    w.sink.add_encoded("spans", b"row", ("s", 0, 1))
    w._put(w.group_state, 1, "g", b"v1")
    w._pending = [(SimpleNamespace(ack=ack), "event")]
    return w, acked


def test_the_commit_point_sends_entries_and_acks_only_once_the_rows_are_written_and_the_loop_runs_meanwhile() -> None:
    """The rows go to the sink's writer thread; the event loop (the span stage, the agents) runs on while they are
    inserted. The changelog gets the entries as they were when the rows were handed off, never a later value
    whose rows are not written yet (a crash then would restore a state that ClickHouse does not have)."""
    async def run() -> tuple[list[Any], list[str], list[Any], list[Any], list[str]]:
        client = GatedClient()
        client.gate.clear()
        w, acked = sink_worker(client)
        task = asyncio.ensure_future(w.commit_point())
        for _ in range(100):  # the loop is free while the insert waits
            await asyncio.sleep(0.01)
            if client.started.is_set():
                break
        w._put(w.group_state, 1, "g", b"v2")  # an agent changes the entry meanwhile
        during = (list(w.group_state.sent), list(acked))
        client.gate.set()
        await task
        after = (list(w.group_state.sent), list(acked))
        w.sink.add_encoded("spans", b"row2", ("s", 0, 2))
        await w.commit_point()
        return during[0], during[1], after[0], list(w.group_state.sent), [d.decode() for _, d, _ in client.inserts]

    sent_during, acked_during, sent_after, sent_next, inserted = asyncio.run(run())
    assert (sent_during, acked_during) == ([], [])
    assert sent_after == [(1, b"g", b"v1")]
    assert sent_next == [(1, b"g", b"v1"), (1, b"g", b"v2")]
    assert inserted == ["row", "row2"]


def test_the_commit_point_ends_while_the_span_stage_keeps_a_batch_in_flight() -> None:
    """The span stage hands off its next batch on the loop's thread as soon as the one before is written, so
    by the time the group stage's commit point wakes there is always another batch in flight. It waited for
    that one too, and the next, for as long as spans came in: nothing of the group stage was acked."""

    class SlowClient(GatedClient):
        def raw_insert(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(0.03)
            super().raw_insert(*args, **kwargs)

    async def run() -> list[str]:
        w, acked = sink_worker(SlowClient())
        going = True

        async def span_stage() -> None:
            i = 0
            while going:
                i += 1
                w.sink.add_encoded("spans", b"s%d" % i, ("s", 0, 100 + i))
                w.sink.submit()  # blocks the loop until the batch before is written, then hands this one off
                await asyncio.sleep(0)

        stage = asyncio.ensure_future(span_stage())
        await asyncio.sleep(0.05)
        try:
            await asyncio.wait_for(w.commit_point(), 5)
        finally:
            going = False
            await stage
        return acked

    assert asyncio.run(run()) == ["event"]


def test_a_batch_that_failed_after_its_first_table_went_in_leaves_clickhouse_unhealthy() -> None:
    async def run() -> tuple[str, dict[str, Any]]:
        client = GatedClient()  # takes RowBinary rows only: the rollouts row's insert fails
        client.gate.clear()
        w, _ = sink_worker(client)
        w.sink.add("rollouts", {"rollout_id": "r1"})
        threading.Timer(0.1, client.gate.set).start()  # the spans row goes in after the hand-off
        try:
            await w.commit_point()
        except ClickHouseError as exc:
            return str(exc), dict(w.health.problems)
        return "", dict(w.health.problems)

    error, problems = asyncio.run(run())
    assert error.startswith("insert of 1 rows into rollouts failed")
    assert problems["clickhouse"][0].startswith("inserts failing")


def test_a_sync_worker_writes_its_rows_on_the_loop_before_the_commit_point_goes_on() -> None:
    async def run() -> tuple[list[str], list[Any], list[str]]:
        client = GatedClient()
        w, acked = sink_worker(client, pipelined=False)
        await w.commit_point()
        assert w.sink._writer is None  # written on the loop's thread: no writer thread
        return [d.decode() for _, d, _ in client.inserts], w.group_state.sent, acked

    assert asyncio.run(run()) == (["row"], [(1, b"g", b"v1")], ["event"])


def test_a_failed_insert_leaves_the_entries_unsent_and_the_events_unacked_for_the_next_commit_point() -> None:
    async def run() -> tuple[str, list[Any], list[str], list[Any], list[str]]:
        client = GatedClient()
        client.fail = 1
        w, acked = sink_worker(client)
        try:
            await w.commit_point()
            error = ""
        except ClickHouseError as exc:
            error = str(exc)
        failed = (list(w.group_state.sent), list(acked))
        await w.commit_point()
        return error, failed[0], failed[1], list(w.group_state.sent), acked

    error, sent_failed, acked_failed, sent, acked = asyncio.run(run())
    assert error.startswith("insert of 1 rows into spans failed")
    assert (sent_failed, acked_failed) == ([], [])
    assert (sent, acked) == ([(1, b"g", b"v1")], ["event"])


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


def test_a_group_that_can_never_be_emitted_is_said_once_with_its_task_and_what_to_set(caplog: pytest.LogCaptureFixture) -> None:
    """Tasks published without group_size (1 by default): each task ran once, the worker waits for groups of 4
    and emits a timed-out group only with 2. Nothing trains: one line says so (not one per tick)."""
    async def run() -> list[bytes]:
        w = worker(owned=(1,), policy=GroupPolicy(group_size=4, min_rollouts=2, timeout_s=1.0))
        open_group(w, GID, 1, "a")  # its first rollout finished long ago ("first": 0)
        open_group(w, "task2@3", 1, "b")
        for _ in range(3):
            w._last_scan = 0
            await w.expire_groups()
        return w.batches_topic.sent

    with caplog.at_level("WARNING", logger="rolloutbus.streams"):
        assert asyncio.run(run()) == []
    lines = [r.getMessage() for r in caplog.records if "nothing trains on it" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "(task 'task1') has 1 rollout" in lines[0] or "(task 'task2') has 1 rollout" in lines[0]
    assert "needs 2 to be emitted (group size 4)" in lines[0] and "group_size=4" in lines[0]


def test_a_short_group_within_its_timeout_or_one_the_timeout_emits_is_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> list[bytes]:
        w = worker(owned=(1,), policy=GroupPolicy(group_size=4, min_rollouts=1, timeout_s=1.0))
        open_group(w, GID, 1, "a")
        await w.expire_groups()
        w2 = worker(owned=(1,), policy=GroupPolicy(group_size=4, min_rollouts=2, timeout_s=3600.0))
        await w2.on_rollout_done(arrival("a"))
        await w2.expire_groups()
        return w.batches_topic.sent + w2.batches_topic.sent

    with caplog.at_level("WARNING", logger="rolloutbus.streams"):
        assert asyncio.run(run()) == [GID.encode()]
    assert not [r for r in caplog.records if "nothing trains on it" in r.getMessage()]


def acks(w: Any) -> list[str]:
    """The group's two arrivals pending ack, as the agent leaves them; → what gets acked."""
    acked: list[str] = []

    async def ack(event: str) -> None:
        acked.append(event)

    w._pending = [(SimpleNamespace(ack=ack), "a"), (SimpleNamespace(ack=ack), "b")]
    return acked


def emitted_on(table: FakeTable) -> list[bool]:
    """What the changelog says of the group, entry by entry."""
    return [json.loads(v)["emitted"] for _p, k, v in table.sent if k == GID.encode() and v is not None]


def test_the_group_is_marked_emitted_on_its_changelog_only_once_its_batch_is_on_the_broker() -> None:
    """Seen in the container test: the batch's broker was killed with the worker. The changelog (another
    broker) had the marker, the batch was still being retried; the restarted worker restored the group as
    emitted and never sent the batch. Here the batch's delivery hangs, the worker dies, and a worker
    restored from what the changelog has and replaying what was not acked sends it."""
    async def run() -> tuple[list[bool], list[str], list[bytes], list[bool], list[str]]:
        w = worker()
        acked = acks(w)
        w.batches_topic.outcomes = ["wait"]
        await w.on_rollout_done(arrival("a"))
        await w.on_rollout_done(arrival("b"))  # complete: emitted, its batch queued
        task = asyncio.ensure_future(w.commit_point())
        await asyncio.sleep(0.05)
        on_changelog, acked_then = emitted_on(w.group_state), list(acked)
        task.cancel()  # SIGKILL: the batch never arrives
        # A new worker: the tables as their changelogs have them, the unacked arrivals replayed.
        again = worker()
        for table, old in ((again.group_state, w.group_state), (again.group_members, w.group_members)):
            for _p, k, v in old.sent:
                if v is None:
                    table.data.pop(k, None)
                else:
                    table.data[k] = v
        await again.on_rollout_done(arrival("a"))
        await again.on_rollout_done(arrival("b"))
        acked_again = acks(again)
        await again.commit_point()
        return on_changelog, acked_then, again.batches_topic.sent, emitted_on(again.group_state), acked_again

    on_changelog, acked_then, resent, marker, acked_again = asyncio.run(run())
    assert (on_changelog, acked_then) == ([], [])  # nothing says emitted while the batch is unanswered
    assert resent == [GID.encode()]
    assert (marker, acked_again) == ([True], ["a", "b"])


def test_a_batch_the_broker_did_not_take_is_sent_again_and_its_group_marked_emitted_after() -> None:
    """Without a crash: the batch's delivery failed (the broker away past the producer's timeout). The
    commit point failed, the acks waited, but the batch was not sent again and the group was already
    marked emitted: once the broker was back, the next commit point acked the group's rollouts without it."""
    async def run() -> tuple[str, list[bytes], list[bool], list[str], list[bytes], list[bool], list[str]]:
        w = worker()
        acked = acks(w)
        w.batches_topic.outcomes = [KafkaTimeoutError(), NotLeaderForPartitionError()]
        await w.on_rollout_done(arrival("a"))
        await w.on_rollout_done(arrival("b"))
        errors = []
        for _ in range(2):
            with pytest.raises(KafkaUnavailable) as exc:
                await w.commit_point()
            errors.append(str(exc.value))
        failed = (list(w.batches_topic.sent), emitted_on(w.group_state), list(acked))
        await w.commit_point()  # the broker is back
        await w.commit_point()  # nothing new: nothing sent again
        return errors[0], *failed, w.batches_topic.sent, emitted_on(w.group_state), acked

    error, sent_failed, marker_failed, acked_failed, sent, marker, acked = asyncio.run(run())
    assert error.startswith("1 records not delivered (x.batches: KafkaTimeoutError")
    assert (sent_failed, marker_failed, acked_failed) == ([GID.encode()] * 3, [], [])
    assert (sent, marker, acked) == ([GID.encode()] * 3, [True], ["a", "b"])


def test_a_batch_the_broker_refuses_for_good_is_logged_and_the_commit_point_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """Sent again at every commit point, it would be refused at every one, and nothing would be acked again. Failing
    its commit point instead ended the worker (the timer raised it) before the group was marked emitted, and the
    restarted worker emitted the group again: a crash loop (tests/integration/streams: a group too large to send)."""
    async def run() -> tuple[list[bytes], list[bool], list[str]]:
        w = worker()
        acked = acks(w)
        w.batches_topic.outcomes = [MessageSizeTooLargeError()]
        await w.on_rollout_done(arrival("a"))
        await w.on_rollout_done(arrival("b"))
        await w.commit_point()
        await w.commit_point()
        return w.batches_topic.sent, emitted_on(w.group_state), acked

    assert asyncio.run(run()) == ([GID.encode()], [True], ["a", "b"])
    assert "x.batches refused a record for good" in caplog.text and "that group is stored, not trained" in caplog.text


def failing_changelog(table: FakeTable, outcomes: list[BaseException | None]) -> None:
    """``table``'s changelog answers each entry with the next of ``outcomes`` (delivered when none is left)."""
    def send_changelog(partition: int, key: bytes, value: bytes | None) -> Any:
        FakeTable.send_changelog(table, partition, key, value)
        fut = asyncio.get_running_loop().create_future()
        outcome = outcomes.pop(0) if outcomes else None
        fut.set_exception(outcome) if outcome is not None else fut.set_result(None)
        return fut

    table.send_changelog = send_changelog  # type: ignore[method-assign]


def test_a_changelog_entry_not_delivered_is_sent_again_before_the_acks() -> None:
    """Its failure failed the commit point, but the entry was not sent again: the next commit point acked the
    events whose state the changelog never got, and a restart lost that state."""
    async def run() -> tuple[list[bool], list[str], list[bool], list[str]]:
        w = worker()
        acked = acks(w)
        failing_changelog(w.group_state, [KafkaTimeoutError()])
        await w.on_rollout_done(arrival("a"))
        await w.on_rollout_done(arrival("b"))
        with pytest.raises(KafkaUnavailable, match="1 changelog entries not delivered"):
            await w.commit_point()
        failed = (emitted_on(w.group_state), list(acked))
        await w.commit_point()
        return *failed, emitted_on(w.group_state), acked

    assert asyncio.run(run()) == ([True], [], [True, True], ["a", "b"])


def test_a_changelog_entry_the_broker_refuses_for_good_is_logged_and_not_sent_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """Put back at every failure, an entry too large for its changelog failed every commit point after it: nothing
    of the group stage was acked again."""
    async def run() -> tuple[int, list[str]]:
        w = worker()
        acked = acks(w)
        failing_changelog(w.group_members, [MessageSizeTooLargeError()])
        await w.on_rollout_done(arrival("a"))
        await w.commit_point()
        await w.commit_point()
        return len(w.group_members.sent), acked

    assert asyncio.run(run()) == (1, ["a", "b"])
    assert "the changelog of table group-members refused a record for good" in caplog.text


def test_the_timers_commit_point_logs_a_failure_and_the_next_one_acks(caplog: pytest.LogCaptureFixture) -> None:
    """Raised from faust's timer (or an agent, or the revoke handler), a commit point's failure ended the worker:
    a broker or ClickHouse away for a moment restarted it, instead of the commit point being tried again."""
    async def run() -> tuple[list[str], str, list[str], bool]:
        w = worker()
        acked = acks(w)
        w.batches_topic.outcomes = [KafkaTimeoutError()]
        await w.on_rollout_done(arrival("a"))
        await w.on_rollout_done(arrival("b"))
        await w.try_commit()
        failed, reason = list(acked), w.health.problems["groups"][0]  # /readyz says so until one succeeds
        await w.try_commit()
        return failed, reason, acked, "groups" in w.health.problems

    assert asyncio.run(run()) == ([], "the group stage's commit point is failing (see the worker log)", ["a", "b"], False)
    assert "group stage commit point failed (retrying" in caplog.text and "1 records not delivered" in caplog.text


def test_a_key_dropped_after_its_entry_failed_gets_its_tombstone() -> None:
    """The entry's send failed, but it may have landed: restored as never sent, the key's drop before the next commit
    point sent nothing, and a restart restored the key from the changelog."""
    async def run() -> list[tuple[int, bytes, bytes | None]]:
        w = worker()
        w._pending = []
        failing_changelog(w.group_state, [KafkaTimeoutError()])
        w._put(w.group_state, 1, "k", b"v")  # new: not on the changelog yet
        with pytest.raises(KafkaUnavailable):
            await w.commit_point()
        w._put(w.group_state, 1, "k", None)  # dropped before the next commit point
        await w.commit_point()
        return w.group_state.sent

    assert asyncio.run(run()) == [(1, b"k", b"v"), (1, b"k", None)]
