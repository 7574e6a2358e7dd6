"""The sink's hand-off to its writer thread, and the span stage committing offsets only once their rows
are written. The ClickHouse client is a recording fake here (the inserts themselves are tested against
the real engine in tests/integration/streams)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from foundation.errors import ClickHouseError, KafkaUnavailable
from streams.attempts import PartitionState
from streams.rollout import Settings
from streams.sink import ClickHouseSink
from streams.spans_stage import SEP, SpanStage


class GatedClient:
    """Inserts wait for ``gate``; the ones named in ``fail`` raise. Records (table, rows, token)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail = 0  # how many of the next inserts raise
        self.inserts: list[tuple[str, bytes, str]] = []

    def raw_insert(self, table: str, columns: Any, data: Any, settings: dict[str, str], fmt: str) -> None:
        data = data if isinstance(data, bytes) else b"".join(data)  # the sink sends pieces
        self.started.set()
        assert self.gate.wait(10)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("Code: 241. Memory limit exceeded\nstack")
        self.inserts.append((table, data, settings.get("insert_deduplication_token", "")))


def test_submit_returns_while_the_batch_is_written_and_batches_land_in_order() -> None:
    client = GatedClient()
    sink = ClickHouseSink(client)
    client.gate.clear()
    sink.add_encoded("spans", b"a", ("s", 0, 1))
    assert sink.submit() == 1
    assert client.started.wait(5)
    assert (sink.written, sink.busy, sink.pending, sink.buffered) == (0, True, 1, 0)
    sink.add_encoded("spans", b"b", ("s", 0, 2))
    assert sink.buffered == 1 and not sink.due()  # what is in flight does not make the next batch due
    client.gate.set()
    assert sink.submit() == 2  # waited for batch 1, handed off batch 2
    sink.wait()
    assert sink.written == 2 and sink.pending == 0
    assert [data for _, data, _ in client.inserts] == [b"a", b"b"]
    assert sink.submit() == 2  # nothing buffered: no new batch


def test_a_failed_batch_is_kept_whole_and_written_first_with_its_token() -> None:
    client = GatedClient()
    sink = ClickHouseSink(client)
    client.fail = 1
    sink.add_encoded("spans", b"a", ("s", 0, 1))
    sink.submit()
    sink.add_encoded("spans", b"b", ("s", 0, 2))
    with pytest.raises(ClickHouseError, match="insert of 1 rows into spans failed: Code: 241. Memory limit exceeded$"):
        sink.submit()
    assert sink.written == 0 and sink.pending == 2 and sink.buffered == 1  # b stays buffered
    sink.submit()  # a again, then b
    sink.wait()
    assert [data for _, data, _ in client.inserts] == [b"a", b"b"]
    failed_token = client.inserts[0][2]
    fresh = GatedClient()
    again = ClickHouseSink(fresh)
    again.add_encoded("spans", b"a", ("s", 0, 1))
    again.flush()
    assert fresh.inserts[0][2] == failed_token  # the retry is the same batch to ClickHouse's dedup
    assert sink.written == 2 and sink.pending == 0


def test_flush_writes_the_batch_in_flight_then_the_rest() -> None:
    client = GatedClient()
    sink = ClickHouseSink(client)
    client.gate.clear()
    sink.add_encoded("spans", b"a", ("s", 0, 1))
    sink.submit()
    sink.add_encoded("spans", b"b", ("s", 0, 2))
    threading.Timer(0.2, client.gate.set).start()
    assert sink.flush() == {"spans": 1}  # the rows this call wrote; the batch before counts in rows_written
    assert [data for _, data, _ in client.inserts] == [b"a", b"b"]
    assert (sink.written, sink.pending, sink.rows_written["spans"]) == (2, 0, 2)


class RecordingConsumer:
    def __init__(self) -> None:
        self.commits: list[dict[int, int]] = []
        self.waited: list[bool] = []  # per commit: did the stage wait for the coordinator's answer

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.commits.append({tp.partition: tp.offset for tp in offsets})
        self.waited.append(not asynchronous)

    def get_watermark_offsets(self, tp: Any, cached: bool) -> tuple[int, int]:
        raise KafkaException("no broker here")

    def close(self) -> None:
        pass


def _stage(client: GatedClient) -> tuple[SpanStage, ClickHouseSink, RecordingConsumer]:
    sink = ClickHouseSink(client)
    s = SpanStage({"bootstrap.servers": "127.0.0.1:1"}, group="g", spans_topic="s", done_topic="d", dlq_topic="q",
                  state_topic="c", sink=sink, flush_sink=sink.flush, submit_sink=sink.submit, core=Settings())
    s.consumer.close()
    consumer = RecordingConsumer()
    s.consumer = consumer  # type: ignore[assignment]
    s.parts = {0: PartitionState(0)}
    return s, sink, consumer


def _read(s: SpanStage, sink: ClickHouseSink, offset: int) -> None:
    sink.add_encoded("spans", f"row{offset}".encode(), ("s", 0, offset))
    s.parts[0].position = offset + 1


def test_the_stage_commits_an_offset_only_after_its_row_is_written() -> None:
    client = GatedClient()
    s, sink, consumer = _stage(client)
    client.gate.clear()
    _read(s, sink, 0)
    s.commit_point()  # handed off; the insert waits
    assert consumer.commits == []
    _read(s, sink, 1)  # the stage reads on meanwhile
    client.gate.set()
    s.commit_point()  # row 0 written: offset 1 committed; row 1 handed off
    assert consumer.commits == [{0: 1}]
    s.commit_point(final=True)
    assert consumer.commits == [{0: 1}, {0: 2}]
    assert [data for _, data, _ in client.inserts] == [b"row0", b"row1"]


def test_the_stage_commits_nothing_past_a_failed_insert_until_it_is_written() -> None:
    client = GatedClient()
    s, sink, consumer = _stage(client)
    client.fail = 1
    _read(s, sink, 0)
    s.commit_point()
    _read(s, sink, 1)
    with pytest.raises(ClickHouseError):
        s.commit_point()
    assert consumer.commits == []
    s.commit_point()  # row 0 again, with row 1
    s.commit_point()
    assert consumer.commits == [{0: 2}]
    assert [data for _, data, _ in client.inserts] == [b"row0", b"row1"]


def test_a_revoked_partition_keeps_no_offset_to_commit() -> None:
    client = GatedClient()
    s, sink, consumer = _stage(client)
    client.gate.clear()
    _read(s, sink, 0)
    s.commit_point()
    s._forget([type("TP", (), {"partition": 0})()])  # lost while its batch was being written
    client.gate.set()
    s.commit_point()
    assert consumer.commits == []


def test_sink_sync_is_a_flag_and_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from streams.cli import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from_args(parser.parse_args([])).sink_pipelined is True
    assert settings_from_args(parser.parse_args(["--sink-sync"])).sink_pipelined is False
    monkeypatch.setenv("ROLLOUTBUS_SINK_PIPELINED", "false")
    assert settings_from_args(parser.parse_args([])).sink_pipelined is False


class FlakyProducer:
    """Queues records; each ``flush`` with records queued takes the next outcome: "fail" (librdkafka gave up on every
    queued record: its timeout), "refuse" (the broker refuses them for good), "slow" (still queued when the wait
    ends), "ok" (delivered). After the list: "ok"."""

    ERRORS = {"fail": KafkaError(KafkaError._MSG_TIMED_OUT), "refuse": KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "ok": None}

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes
        self.sent: list[tuple[str, bytes, int]] = []
        self.queued: list[tuple[Any, Any]] = []
        self.refused_now: set[bytes] = set()  # keys produce() raises for

    def produce(self, topic: str, value: bytes | None, key: bytes, partition: int = -1, on_delivery: Any = None) -> None:
        if key in self.refused_now:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        self.sent.append((topic, key, partition))
        msg = SimpleNamespace(topic=lambda: topic, key=lambda: key, value=lambda: value, partition=lambda: partition)
        self.queued.append((msg, on_delivery))

    def flush(self, timeout: float) -> int:
        if not self.queued:
            return 0
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        if outcome == "slow":
            return len(self.queued)
        queued, self.queued = self.queued, []
        for msg, callback in queued:
            callback(self.ERRORS[outcome], msg)
        return 0

    def poll(self, timeout: float) -> int:
        return 0


ENTRY = ("c", f"r1{SEP}a1".encode(), 0)


def _completed(outcomes: list[str]) -> tuple[SpanStage, RecordingConsumer, FlakyProducer]:
    """A stage that read one record and completed one attempt, its producer answering ``outcomes``."""
    s, sink, consumer = _stage(GatedClient())
    producer = s.producer = FlakyProducer(outcomes)  # type: ignore[assignment]
    _read(s, sink, 0)
    s.parts[0].completing[("r1", "a1")] = 0
    return s, consumer, producer  # type: ignore[return-value]


def test_a_changelog_entry_librdkafka_refused_is_sent_again_before_the_offset_is_committed() -> None:
    """The entry that says an attempt is done was sent once: when its delivery failed (the broker gone past
    librdkafka's timeout), a worker restarted later found the attempt not done and completed it a second time."""
    s, consumer, producer = _completed(["fail"])
    with pytest.raises(KafkaUnavailable):
        s.commit_point(final=True)  # the row is written; the entry is refused
    assert producer.sent == [ENTRY] and consumer.commits == []
    s.commit_point()  # nothing new read: the entry goes again, then the offset
    assert producer.sent == [ENTRY, ENTRY] and consumer.commits == [{0: 1}]
    s.commit_point()
    assert producer.sent == [ENTRY, ENTRY] and consumer.commits == [{0: 1}], "settled once"


def test_the_entry_that_says_an_attempt_is_done_waits_until_its_summary_is_on_the_broker() -> None:
    """Sent together, the two went to different brokers: with the summary's broker killed and the worker with it,
    the entry landed and the summary did not. The restarted worker found the attempt done and never sent it."""
    s, consumer, producer = _completed(["fail"])
    s._produce("d", b"group", b"summary")  # what completing the attempt produced
    with pytest.raises(KafkaUnavailable):
        s.commit_point(final=True)  # the row is written; the summary is not delivered
    assert [key for _, key, _ in producer.sent] == [b"group"] and consumer.commits == []
    s.commit_point()
    assert producer.sent == [("d", b"group", -1), ("d", b"group", -1), ENTRY] and consumer.commits == [{0: 1}]


def test_a_record_the_broker_refuses_for_good_fails_one_commit_point_and_is_not_sent_again() -> None:
    """Sent again at every commit point, it was refused at every one, and no offset was ever committed again."""
    s, consumer, producer = _completed(["refuse"])
    with pytest.raises(KafkaUnavailable):
        s.commit_point(final=True)
    s.commit_point()
    assert producer.sent == [ENTRY] and consumer.commits == [{0: 1}]


def test_an_entry_still_queued_is_waited_for_not_sent_twice() -> None:
    s, consumer, producer = _completed(["slow", "slow"])
    for _ in range(2):
        with pytest.raises(KafkaUnavailable):
            s.commit_point(final=True)
    s.commit_point()
    assert producer.sent == [ENTRY] and consumer.commits == [{0: 1}]


def test_the_stage_does_not_wait_for_a_commit_and_makes_a_refused_one_again() -> None:
    """Each commit waited for the group coordinator's answer, holding the event loop: with the broker gone, 45 s.
    A stop or a revoke still waits (the partitions are handed on)."""
    from confluent_kafka import KafkaError

    s, sink, consumer = _stage(GatedClient())
    _read(s, sink, 0)
    s.commit_point()
    s.commit_point()
    assert consumer.commits == [{0: 1}] and consumer.waited == [False]
    s._committed(KafkaError(KafkaError._WAIT_COORD), [])  # the answer, at a later poll
    with pytest.raises(KafkaUnavailable, match="offset commit failed"):
        s.commit_point()  # made again, and the refusal reported (readiness)
    assert consumer.commits == [{0: 1}, {0: 1}]
    s.commit_point()
    assert consumer.commits == [{0: 1}, {0: 1}], "accepted: nothing to commit again"
    _read(s, sink, 1)
    s.commit_point(final=True)
    assert consumer.commits[-1] == {0: 2} and consumer.waited[-1] is True


def test_one_asynchronous_commit_at_a_time() -> None:
    """librdkafka sends a commit again after a backoff (the coordinator moved, the request timed out) and answers only
    then: a commit sent meanwhile could land first and be overwritten by the older one, the group's offset going back."""
    s, sink, consumer = _stage(GatedClient())
    _read(s, sink, 0)
    s.commit_point()
    s.commit_point()  # {0: 1} sent, not answered
    _read(s, sink, 1)
    s.commit_point()
    s.commit_point()  # row 1 written: its offset waits for the answer
    assert consumer.commits == [{0: 1}]
    s._committed(None, [])  # the answer, at a later poll
    s.commit_point()
    assert consumer.commits == [{0: 1}, {0: 2}] and consumer.waited == [False, False]


def test_a_commit_left_unanswered_makes_the_commit_point_fail_until_it_is_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the broker gone an asynchronous commit may get no answer at all: readiness must still say so."""
    import streams.spans_stage as spans_stage

    s, sink, consumer = _stage(GatedClient())
    _read(s, sink, 0)
    s.commit_point()
    s.commit_point()  # sent, not answered
    monkeypatch.setattr(spans_stage, "DELIVERY_WAIT_S", 0.0)
    s.commit_point()  # no poll since it was sent (the stage was inserting): its answer may be waiting there
    s._consumed_at = time.monotonic()  # a poll that served no answer
    with pytest.raises(KafkaUnavailable, match="unanswered"):
        s.commit_point()
    s._committed(None, [])  # answered: accepted
    s.commit_point()
    assert consumer.commits == [{0: 1}]


def test_a_revoke_while_a_commit_is_unanswered_commits_every_offset_and_waits() -> None:
    """The earlier commit could still be refused, after the partition is gone: its offset was never sent again."""
    s, sink, consumer = _stage(GatedClient())
    _read(s, sink, 0)
    s.commit_point()
    s.commit_point()  # {0: 1} sent, not answered
    s.commit_point(final=True)  # nothing new read
    assert consumer.commits == [{0: 1}, {0: 1}] and consumer.waited == [False, True]


def test_a_record_produce_refuses_at_once_fails_its_commit_point_and_the_others_go_out() -> None:
    """The error left the commit point with its entries taken off the list and the refused ones forgotten; a
    revoke, which carries on after a failed commit point, then committed past entries never sent."""
    s, consumer, producer = _completed([])
    s.parts[0].completing[("r2", "a2")] = 0
    producer.refused_now.add(f"r1{SEP}a1".encode())
    with pytest.raises(KafkaUnavailable):
        s.commit_point(final=True)
    assert producer.sent == [("c", f"r2{SEP}a2".encode(), 0)] and consumer.commits == []
    s.commit_point()
    assert consumer.commits == [{0: 1}]


def test_an_insert_failing_with_an_empty_message_is_a_clickhouse_error() -> None:
    class Silent:
        def raw_insert(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("")

    sink = ClickHouseSink(Silent())
    sink.add_encoded("spans", b"a", ("s", 0, 1))
    with pytest.raises(ClickHouseError, match="RuntimeError"):
        sink.flush()
    assert sink.pending == 1


def test_a_large_batch_goes_to_clickhouse_in_pieces_of_whole_rows_in_order() -> None:
    """Joined whole, a batch of LLM rows (tens of MB) was fresh memory on every insert, and over HTTP a second copy
    with the INSERT statement in front."""
    pieces: list[bytes] = []

    class PieceClient(GatedClient):
        def raw_insert(self, table: str, columns: Any, data: Any, settings: dict[str, str], fmt: str) -> None:
            pieces.extend(data)

    sink = ClickHouseSink(PieceClient())
    rows = [bytes([i % 251]) * (4000 + i % 700) for i in range(1000)]  # ~4.4 MB
    for i, row in enumerate(rows):
        sink.add_encoded("spans", row, ("s", 0, i))
    sink.flush()
    assert b"".join(pieces) == b"".join(rows)
    assert len(pieces) == 5 and all(len(p) >= 1 << 20 for p in pieces[:-1]) and all(len(p) < (1 << 20) + 4700 for p in pieces)
    starts = {0}
    for p in pieces[:-1]:
        starts.add(max(starts) + len(p))
    offsets, at = set(), 0
    for row in rows:
        offsets.add(at)
        at += len(row)
    assert starts <= offsets  # no row split between two pieces


def test_the_two_waits_for_the_broker_take_at_most_the_delivery_wait_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """What was produced, then the entries: each waited up to 5 s, and the loop (faust's heartbeats) was held 10 s
    against a 10 s session timeout."""
    from streams import spans_stage

    s, consumer, producer = _completed([])
    s._produce("d", b"group", b"summary")
    clock = [1000.0]
    monkeypatch.setattr(spans_stage.time, "monotonic", lambda: clock[0])
    asked: list[float] = []
    flush = producer.flush

    def slow_flush(timeout: float) -> int:
        asked.append(timeout)
        clock[0] += min(timeout, 4.0)  # the broker takes 4 s to answer (or the whole wait, if shorter)
        return flush(timeout)

    producer.flush = slow_flush  # type: ignore[method-assign]
    s.commit_point(final=True)
    assert asked[0] == spans_stage.DELIVERY_WAIT_S and asked[1] == pytest.approx(spans_stage.DELIVERY_WAIT_S - 4.0)
    assert consumer.commits == [{0: 1}]
