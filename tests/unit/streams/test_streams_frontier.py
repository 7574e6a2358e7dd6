"""The worker's per-partition frontier: records faust skips are read again, never passed over.

Pure logic: ``Frontier.admit`` runs with a fake consumer that records seeks.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest

from streams import faust_guards
from streams.frontier import Frontier
from streams.groups_stage import GroupStage

TOPIC = "x.spans"


class FakeConsumer:
    def __init__(self) -> None:
        self.seeks: list[tuple[Any, int]] = []
        self.log_start = 0  # the broker's earliest offset (retention moves it)

    async def earliest_offsets(self, *tps: Any) -> dict[Any, int]:
        return {tp: self.log_start for tp in tps}

    async def seek_wait(self, partitions: dict[Any, int]) -> None:
        self.seeks.extend(partitions.items())


def stand_in(gap_accept_s: float = 2.0) -> Any:
    return Frontier(SimpleNamespace(consumer=FakeConsumer()), gap_accept_s)


def msg(offset: int, partition: int = 0) -> Any:
    return SimpleNamespace(topic=TOPIC, partition=partition, offset=offset, tp=(TOPIC, partition))


@pytest.fixture(autouse=True)
def frontier() -> Any:
    faust_guards.FRONTIER.clear()
    yield faust_guards.FRONTIER
    faust_guards.FRONTIER.clear()


def admit(w: Any, offset: int) -> str:
    return asyncio.run(w.admit(msg(offset)))


def test_in_order_records_are_processed_and_redeliveries_only_acked(frontier: dict) -> None:
    w = stand_in()
    frontier[(TOPIC, 0)] = 5
    assert [admit(w, o) for o in (5, 6, 7)] == ["process"] * 3
    assert [admit(w, o) for o in (5, 6)] == ["duplicate", "duplicate"]
    assert admit(w, 8) == "process" and frontier[(TOPIC, 0)] == 9
    assert w.app.consumer.seeks == []


def test_a_skipped_range_is_read_again_from_the_frontier(frontier: dict) -> None:
    w = stand_in()
    frontier[(TOPIC, 0)] = 4
    # offsets 4..8 never reached the stream: 9 arrives; the worker seeks back instead of going on
    assert admit(w, 9) == "drop"
    assert w.app.consumer.seeks == [((TOPIC, 0), 4)]
    # stale records past the frontier that were already buffered are dropped, with no second seek
    assert admit(w, 10) == "drop"
    assert len(w.app.consumer.seeks) == 1
    # the re-read arrives in order
    assert [admit(w, o) for o in range(4, 11)] == ["process"] * 7
    assert frontier[(TOPIC, 0)] == 11


def test_a_range_retention_deleted_is_passed_over_after_one_re_read(frontier: dict) -> None:
    w = stand_in(gap_accept_s=0.0)
    w.app.consumer.log_start = 7  # 3..6 are gone from the broker
    frontier[(TOPIC, 0)] = 3
    assert admit(w, 7) == "drop"  # first: read again from 3
    assert admit(w, 7) == "process"  # the broker no longer has 3..6
    assert frontier[(TOPIC, 0)] == 8
    assert w.app.consumer.seeks == [((TOPIC, 0), 3)]


def test_records_still_on_the_broker_are_never_passed_over_however_late_the_re_read(frontier: dict) -> None:
    """A busy worker takes longer than gap_accept_s to drain what faust buffered before the seek (seen
    in the scale-out test: offsets 18..23 of a partition skipped right after a rebalance)."""
    w = stand_in(gap_accept_s=0.0)
    frontier[(TOPIC, 0)] = 18
    assert admit(w, 19) == "drop"
    assert [admit(w, o) for o in (20, 24)] == ["drop", "drop"]  # still stale: seek again, skip nothing
    assert w.app.consumer.seeks == [((TOPIC, 0), 18)] * 3 and frontier[(TOPIC, 0)] == 18
    assert [admit(w, o) for o in range(18, 25)] == ["process"] * 7


def test_before_the_start_is_known_everything_is_processed(frontier: dict) -> None:
    w = stand_in()
    assert admit(w, 12) == "process" and admit(w, 3) == "process"
    assert (TOPIC, 0) not in frontier


def test_commit_floor_holds_a_commit_above_an_unacked_head() -> None:
    """faust would commit 7 here (acked 5, 6 with nothing committed) and offsets 3, 4 would be lost."""
    faust_guards._patch_faust_commit_floor()
    from faust.transport.consumer import Consumer

    faust_guards.STRICT_TOPICS.add(TOPIC)
    faust_guards.START[(TOPIC, 0)] = 3
    from faust.types import TP
    from intervaltree import IntervalTree

    tp = TP(TOPIC, 0)
    fake = SimpleNamespace(_acked={tp: [5, 6]}, _committed_offset={tp: None}, _gap={tp: IntervalTree()},
                           _acked_index={tp: {5, 6}})
    try:
        assert Consumer._new_offset(fake, tp) is None
        fake._committed_offset[tp] = 4  # committed: next to read is 4; 5, 6 acked, 4 is not
        assert Consumer._new_offset(fake, tp) is None
        fake._acked[tp] = [4, 5, 6]  # once 4 is acked the run commits
        assert Consumer._new_offset(fake, tp) == 7
    finally:
        faust_guards.STRICT_TOPICS.discard(TOPIC)
        faust_guards.START.clear()


class FakeTable:
    def __init__(self, data: dict[bytes, bytes] | None = None) -> None:
        self.data = dict(data or {})
        self.sent: list[tuple[int, bytes, bytes | None]] = []

    def send_changelog(self, partition: int, key: bytes, value: bytes | None) -> None:
        self.sent.append((partition, key, value))


def table_worker() -> Any:
    w = SimpleNamespace(_dirty={})
    w._put = lambda table, p, key, value: GroupStage._put(w, table, p, key, value)
    def flush() -> None:  # what a commit point sends once its rows are written
        for (_, k), (table, partition, _fresh), value in GroupStage._take_changelogs(w):
            table.send_changelog(partition, k, value)

    w.flush = flush
    return w


def test_table_changes_reach_the_changelog_once_per_key_at_the_commit_point() -> None:
    w, t = table_worker(), FakeTable({b"old": b"v0"})
    for i in range(5):
        w._put(t, 2, "r1", f"state{i}".encode())
    w._put(t, 2, "old", None)
    assert t.data == {b"r1": b"state4"} and t.sent == []  # readers see the change at once
    w.flush()
    assert sorted(t.sent) == [(2, b"old", None), (2, b"r1", b"state4")]
    w.flush()
    assert len(t.sent) == 2  # nothing dirty any more


def test_an_entry_created_and_dropped_between_commit_points_never_reaches_the_changelog() -> None:
    w, t = table_worker(), FakeTable()
    w._put(t, 0, "span-a", b"x")
    w._put(t, 0, "span-a", None)
    w.flush()
    assert t.sent == [] and t.data == {}
    # but one the changelog has seen gets its tombstone, even if re-created and dropped again
    w._put(t, 1, "span-b", b"y")
    w.flush()
    w._put(t, 1, "span-b", b"z")
    w._put(t, 1, "span-b", None)
    w.flush()
    assert t.sent == [(1, b"span-b", b"y"), (1, b"span-b", None)]


class TP(NamedTuple):
    topic: str
    partition: int


class FakeAioConsumer:
    """aiokafka's consumer as the rewind guard uses it: committed offsets, seeks to the beginning."""

    def __init__(self, committed: dict[Any, int], earliest: int, ends: dict[Any, int] | None = None) -> None:
        self.committed, self.earliest, self.ends = committed, earliest, ends or {}
        self.to_beginning: list[Any] = []

    async def seek_to_committed(self) -> dict[Any, int]:
        return dict(self.committed)

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.ends.get(tp, 1000) for tp in tps}

    async def seek_to_beginning(self, *tps: Any) -> None:
        self.to_beginning.extend(tps)

    async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.earliest for tp in tps}


def test_rewind_reads_uncommitted_strict_partitions_and_every_replay_partition_from_the_beginning() -> None:
    from faust.transport.drivers import aiokafka as faust_aiokafka

    faust_guards._patch_faust_seek_uncommitted()
    spans, metrics, resources, other = (TP(t, 0) for t in ("x.spans", "x.metrics", "x.resources", "x.other"))
    fake = FakeAioConsumer({spans: 0, metrics: 12, resources: 7, other: 5}, earliest=3)

    async def call_thread(fn: Any) -> Any:
        return await fn()

    thread = SimpleNamespace(_ensure_consumer=lambda: fake, call_thread=call_thread)
    faust_guards.STRICT_TOPICS.update({"x.spans", "x.metrics"})
    faust_guards.REPLAY_TOPICS.add("x.resources")
    try:
        offsets = asyncio.run(faust_aiokafka.AIOKafkaConsumerThread.seek_to_committed(thread))
    finally:
        faust_guards.STRICT_TOPICS.difference_update({"x.spans", "x.metrics"})
        faust_guards.REPLAY_TOPICS.discard("x.resources")
    # spans: no commit → its beginning; resources: compacted, read again whatever was committed (faust
    # must not drop what arrives below its commit: 0 returned); metrics and other: from their commits.
    assert fake.to_beginning == [spans, resources]
    assert offsets == {spans: 0, metrics: 12, resources: 0, other: 5}
    assert faust_guards.START[("x.spans", 0)] == 3 and faust_guards.START[("x.metrics", 0)] == 12
    assert ("x.resources", 0) not in faust_guards.START


def test_a_committed_offset_past_a_partitions_end_reads_the_partition_from_its_beginning() -> None:
    """A reset deletes the topics and creates them again; offsets the broker kept for the worker's group lie past
    the new partitions' ends. Taken as they are, the frontier would count every record of the new topic as one
    already processed (seen in the demo: every finished rollout 'redelivered', no group formed)."""
    from faust.transport.drivers import aiokafka as faust_aiokafka

    faust_guards._patch_faust_seek_uncommitted()
    old, kept, fresh = (TP("y.done", p) for p in range(3))
    fake = FakeAioConsumer({old: 5000, kept: 10, fresh: 0}, earliest=0, ends={old: 37, kept: 20, fresh: 0})

    async def call_thread(fn: Any) -> Any:
        return await fn()

    thread = SimpleNamespace(_ensure_consumer=lambda: fake, call_thread=call_thread)
    faust_guards.STRICT_TOPICS.add("y.done")
    try:
        offsets = asyncio.run(faust_aiokafka.AIOKafkaConsumerThread.seek_to_committed(thread))
    finally:
        faust_guards.STRICT_TOPICS.discard("y.done")
    assert sorted(fake.to_beginning) == [old, fresh]
    assert offsets == {old: 0, kept: 10, fresh: 0}
    assert faust_guards.START[("y.done", 0)] == faust_guards.FRONTIER[("y.done", 0)] == 0
    assert faust_guards.START[("y.done", 1)] == 10 and faust_guards.START[("y.done", 2)] == 0

    async def unknown(tps: list[Any]) -> dict[Any, int]:
        raise TimeoutError("no leader yet")  # the broker restarting: the commits are taken as they are

    fake = FakeAioConsumer({old: 5000, kept: 10}, earliest=0)
    fake.end_offsets = unknown  # type: ignore[method-assign]
    faust_guards.STRICT_TOPICS.add("y.done")
    try:
        offsets = asyncio.run(faust_aiokafka.AIOKafkaConsumerThread.seek_to_committed(thread))
    finally:
        faust_guards.STRICT_TOPICS.discard("y.done")
    assert offsets == {old: 5000, kept: 10} and fake.to_beginning == []



class FetchLog:
    """One partition, offsets ``0..end-1``, as faust's Fetcher reads it: each ``getmany`` hands over what
    lies past the fetch position; ``seek_wait`` moves the position and sets faust's read offset, as
    faust's aiokafka driver does (``AIOKafkaConsumerThread._seek_wait``, in the consumer's thread)."""

    def __init__(self, consumer: Any, tp: Any, position: int, end: int) -> None:
        self.consumer, self.tp, self.position, self.end = consumer, tp, position, end
        self.seeks: list[int] = []
        self.idle = 0  # getmany calls that found nothing: two, and the fetcher stops
        self.fetcher = SimpleNamespace(_stopped=SimpleNamespace(is_set=lambda: self.idle > 1))

    async def getmany(self, timeout: float) -> Any:
        if self.position >= self.end:
            self.idle += 1
        batch, self.position = range(self.position, self.end), self.end  # a seek from here on moves the next batch
        for offset in batch:
            yield self.tp, SimpleNamespace(topic=self.tp.topic, partition=self.tp.partition, offset=offset, tp=self.tp,
                                           key=None, value=None)

    async def seek_wait(self, partitions: dict[Any, int]) -> None:
        for tp, offset in partitions.items():
            self.seeks.append(offset)
            self.position = offset
            self.consumer._read_offset[tp] = offset


def test_records_fetched_again_after_a_seek_back_reach_the_worker(frontier: dict) -> None:
    """Seen in tests/faults/test_crash.py after a restart (TrainSteps 46.. not stored): faust handed over
    metrics@44 while it was still seeking to the committed offsets, so the frontier (44) became known
    after the fetch position had passed it. 45 arrived, the worker sought back to 44, and faust, handing
    over what it had fetched before that seek, set its read offset to 45, 46, ... over the 44 the seek
    had set. The records fetched again (44..50) were below it and dropped before the agent saw them;
    nothing new came, and the partition stood still until reread_missing_tails (quiet for 5 ×
    gap_accept_s) or the next restart."""
    from faust.transport.consumer import Consumer
    from faust.types import TP

    faust_guards._patch_faust_strict_read_offsets()
    tp = TP(TOPIC, 0)
    w = stand_in()
    frontier[(TOPIC, 0)] = 44
    verdicts: list[tuple[int, str]] = []
    dropped_by_faust: list[int] = []

    async def callback(message: Any) -> None:  # the agent, inline
        verdicts.append((message.offset, await w.admit(message)))

    async def wait_first(coro: Any, other: Any) -> None:
        other.close()
        await coro

    async def no_gap(*_: Any) -> None: ...

    async def drain() -> None:
        consumer = SimpleNamespace(
            callback=callback, _read_offset=defaultdict(lambda: None), _commit_every=None, _n_acked=0,
            _stopped=SimpleNamespace(is_set=lambda: False), should_stop=False, sleep=asyncio.sleep,
            wait_first=wait_first, suspend_flow=asyncio.Event(), _add_gap=no_gap, consumer_stopped_errors=(),
            diag=SimpleNamespace(set_flag=lambda flag: None, unset_flag=lambda flag: None),
            log=SimpleNamespace(dev=lambda fmt, offset, *_: dropped_by_faust.append(offset)),
            app=SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True)),
        )
        consumer._read_offset[tp] = 44  # faust's perform_seek: the committed offset
        fetch = FetchLog(consumer, tp, position=45, end=51)  # but 44 was fetched (and handed over) before it
        consumer.getmany = fetch.getmany
        w.app.consumer.seek_wait = fetch.seek_wait
        await asyncio.wait_for(Consumer._drain_messages(consumer, fetch.fetcher), 5)
        assert fetch.seeks == [44]

    faust_guards.STRICT_TOPICS.add(TOPIC)
    try:
        asyncio.run(drain())
    finally:
        faust_guards.STRICT_TOPICS.discard(TOPIC)
    assert verdicts[:6] == [(45, "drop")] + [(o, "drop") for o in range(46, 51)]  # stale: fetched before the seek
    assert [o for o, v in verdicts if v == "process"] == list(range(44, 51))  # the re-read, all of it
    assert frontier[(TOPIC, 0)] == 51 and dropped_by_faust == []
