"""The span stage: rb.spans → attempts → spans / rollouts / transitions rows and rollout summaries.

It reads rb.spans in batches with confluent-kafka (librdkafka fetches and decompresses in C) inside
the faust worker's event loop, and keeps each partition's in-flight attempts in memory
(:mod:`streams.attempts`, which explains why that is durable). A completed attempt's summary goes,
keyed by its group id, to ``<prefix>rollouts-done``, where the faust group stage picks it up.

Per record, the common span takes the compiled decoder (``native/``, :func:`native_decoder`): decode,
checks, span view and ``spans`` row in one pass. Everything else, and everything where it is not
installed, takes the Python path, the reference for its results and for every dead letter.

Delivery: offsets are committed only at a commit point, after the sink wrote every row the
records below them produced and the producer delivered every summary, dead letter and changelog
entry they caused. A crash replays from the last commit; see :mod:`streams.attempts`. Inserts are
pipelined: a commit point hands its rows to the sink's writer thread and settles the commit point
before it, whose rows are written by then; the order of the steps is :class:`streams.checkpoint.Checkpoint`'s,
done here on librdkafka (:meth:`SpanStage.take` to :meth:`SpanStage.commit`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client import Counter, Gauge

from foundation.errors import DecodeError, KafkaUnavailable, ValidationError
from schemas import codec
from schemas.checks import check_span
from schemas.models import MAX_ATTRIBUTE_VALUE_BYTES, MAX_ATTRIBUTES, UNNUMBERED, DeadLetter, RolloutEventType
from streams.attempts import Attempt, Key, PartitionState, span_view
from streams.checkpoint import Checkpoint
from streams.feedback import from_late_span
from streams.grouping import group_of
from streams.rollout import RolloutResult, Settings, finish_attempt
from streams import rowbinary
from streams.sink import ClickHouseSink, rollout_row

log = logging.getLogger("rolloutbus.streams")
# How long a commit point waits for what it produced (changelog entries, summaries, dead letters) before it
# gives up until the next one. The event loop waits meanwhile: well under the group's session timeout.
DELIVERY_WAIT_S = 5.0

SPANS_IN = Counter("rolloutbus_streams_spans_total", "Spans processed", ["late"])
EVENTS_IN = Counter("rolloutbus_streams_rollout_events_total", "Rollout lifecycle events processed", ["event"])
ROLLOUTS_DONE = Counter("rolloutbus_streams_rollouts_completed_total", "Attempts completed", ["status"])
DLQ_OUT = Counter("rolloutbus_streams_dead_letters_total", "Records sent to the dead-letter topic", ["source"])
INFLIGHT = Gauge("rolloutbus_streams_inflight_attempts", "Attempts being assembled (state held in memory)")
LAG = Gauge("rolloutbus_streams_lag", "Records behind the end of the partition", ["topic", "partition"])

_EVENT_COUNTERS = {e: EVENTS_IN.labels(e.value) for e in RolloutEventType}

SEP = "\x1f"
_SPAN = "rolloutbus.Span"
_NAMES = (_SPAN, "rolloutbus.RolloutEvent")


def native_decoder() -> Any | None:
    """The compiled span decoder (``native/``, import name ``rolloutbus_native``), or ``None``.

    It does the per-record work of the common span (decode, checks, view, ``spans`` row head) in one
    pass; every other record, and any span it finds unusual or refused, takes the Python path,
    which stays the reference (tests compare the two). Without it (no Rust toolchain where the
    project was set up) the stage runs the Python path and says so once."""
    global _NATIVE_SAID
    try:
        import rolloutbus_native
    except ImportError as exc:
        if not _NATIVE_SAID:
            _NATIVE_SAID = True
            log.warning("span stage: the compiled decoder is not installed (%s); spans take the Python path, "
                        "about twice the CPU per span (make setup builds it with cargo: see native/README.md)", exc)
        return None
    import array
    import types

    try:  # built for another Span schema (span.avsc changed, native/ not rebuilt): refused
        return rolloutbus_native.SpanDecoder(codec.schema_set().fingerprints[_SPAN], MAX_ATTRIBUTES,
                                             MAX_ATTRIBUTE_VALUE_BYTES, types.SimpleNamespace, array.array)
    except ValueError as exc:
        if not _NATIVE_SAID:
            _NATIVE_SAID = True
            log.warning("span stage: %s; spans take the Python path until it is (make setup)", exc)
        return None


_NATIVE_SAID = False


def _none(value: Any) -> None:
    return None


def dead_letter_reason(exc: Exception) -> str:
    """A short, stable reason for the dead-letter topic (what an operator groups by)."""
    text = str(exc)
    if isinstance(exc, ValidationError):
        return "validation"
    if "fingerprint" in text:
        return "decode.unknown_fingerprint"
    if "marker" in text or "too short" in text or "Confluent" in text:
        return "decode.not_avro"
    return "decode.invalid"


REPLAY_PREFIX = "replay_from="
_REBALANCING = {KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS, KafkaError.UNKNOWN_MEMBER_ID}
# Delivery failures that another try can mend (the idempotent producer retries everything else itself until
# its timeout, so these are what is left of a broker that was away)
_TRANSIENT = {KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
              KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
              KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NETWORK_EXCEPTION}


def parse_replay_from(metadata: str | None) -> int | None:
    """The offset a restarted worker reads from, from the commit's metadata (None: not ours)."""
    if metadata and metadata.startswith(REPLAY_PREFIX) and metadata[len(REPLAY_PREFIX):].isdigit():
        return int(metadata[len(REPLAY_PREFIX):])
    return None


def resume_point(committed: int, metadata: str | None, end: int) -> tuple[int, int]:
    """Where a newly assigned partition is read from, and below which offset its rows are already written, from
    its committed offset (negative: none), the commit's metadata and the partition's end offset.

    A committed offset past the end belongs to an earlier topic of the same name (deleted and created again, as
    ``rolloutbus demo``'s reset does, while the broker kept the group's offsets): the partition is read from its
    beginning and nothing in it counts as written — else every span of the new topic would be taken for a replay
    and dropped. ``end`` negative: not known (the commit is taken as it is). Pure."""
    if committed > end >= 0:
        return OFFSET_BEGINNING, 0
    replay_from = parse_replay_from(metadata) if committed >= 0 else None
    if replay_from is None:
        return committed, 0
    return replay_from, committed


def state_topic_name(app_id: str) -> str:
    """The compacted changelog of completed attempts (one partition per rb.spans partition). It
    belongs to the application, as its consumer group does: a new app id starts from nothing."""
    return f"{app_id}-spans-state-changelog"


def span_group(app_id: str) -> str:
    """The span stage's consumer group (faust's own group is ``app_id``; the two cannot be one)."""
    return f"{app_id}.spans"


class SpanStage:
    """Consumes rb.spans in batches; call :meth:`poll` repeatedly and :meth:`commit_point` when due."""

    def __init__(
        self,
        kafka_conf: dict[str, Any],
        *,
        group: str,
        spans_topic: str,
        done_topic: str,
        dlq_topic: str,
        state_topic: str,
        sink: ClickHouseSink,
        flush_sink: Callable[[], None],
        core: Settings,
        submit_sink: Callable[[], int] | None = None,
        finish_grace_s: float = 10.0,
        rollout_timeout_s: float = 600.0,
        completed_retention_s: float = 3600.0,
        session_timeout_s: float = 10.0,
        batch: int = 5000,
        native: bool = True,
        feedback_topic: str | None = None,
    ) -> None:
        self.kafka_conf = kafka_conf
        # A reward span read after its attempt completed → a Feedback record here (None: stored late only)
        self.feedback_topic = feedback_topic
        # (rb.spans partition, key, Feedback) of late reward spans since the last commit point: sent at the commit
        # point that wrote their rows (the rollout's row is in ClickHouse before the feedback stage looks it up)
        self._late_feedback: list[tuple[int, bytes, bytes]] = []
        self.group = group
        self.spans_topic, self.done_topic, self.dlq_topic, self.state_topic = spans_topic, done_topic, dlq_topic, state_topic
        self.sink = sink
        # Its commit points; submit_sink None: each writes its rows before it goes on (the tests' stages).
        # What one takes: ((partition, changelog key, value) entries, partition → offset to commit).
        self.checkpoint = Checkpoint(self, sink, flush_sink, submit_sink)
        self.core = core
        self.finish_grace_s = finish_grace_s
        self.rollout_timeout_s = rollout_timeout_s
        self.retention_ns = int(completed_retention_s * 1e9)
        self.batch = batch
        # native=False: the Python path only (the reference; tests compare the two)
        self.decoder = native_decoder() if native else None
        self.parts: dict[int, PartitionState] = {}
        self.stats = {"spans": 0, "late": 0, "dlq": 0, "rollouts": 0, "replayed": 0, "assigned": 0, "late_feedback": 0}
        self._said_no_task = False  # a training rollout without a task id was logged
        self.consumer = Consumer({
            **kafka_conf,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # A worker joining or leaving moves only the partitions that must move; the others go on
            # being read instead of being revoked, committed, restored and replayed everywhere.
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": int(session_timeout_s * 1000),
            "heartbeat.interval.ms": int(min(3.0, session_timeout_s / 3) * 1000),
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "log_level": 3,
            "on_commit": self._committed,
        })
        self.producer = Producer({
            **kafka_conf,
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.max.bytes": 16 * 1024 * 1024,
            "log_level": 3,
        })
        self._failed: list[str] = []  # delivery errors since the last commit point
        self._commit_error: Any = None  # an asynchronous commit refused since the last commit point
        self._commit_sent: float | None = None  # when the asynchronous commit not yet answered was sent (one at a time)
        self._consumed_at = 0.0  # when the last poll began
        self._redo: list[tuple[str, bytes | None, bytes | None, int]] = []  # (topic, key, value, partition) refused
        self._closed = False
        self._held = False
        self.consumer.subscribe([spans_topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)

    # ------------------------------------------------------------------ rebalance

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Restore the completed attempts, then read each partition from its oldest in-flight attempt.

        ``partitions`` are only the ones added (the cooperative protocol), often none."""
        if not partitions:
            return  # librdkafka applies the (empty) change itself
        self.stats["assigned"] += len(partitions)
        committed = consumer.committed(partitions, timeout=30)
        start = []
        for tp in committed:
            try:
                end = consumer.get_watermark_offsets(TopicPartition(self.spans_topic, tp.partition), timeout=30)[1]
            except KafkaException as exc:  # the broker busy (a restart): the commit is taken as it is, as before
                log.warning("%s[%d]: its end offset could not be read (%s): resuming from the commit",
                            self.spans_topic, tp.partition, exc)
                end = -1
            at, sunk = resume_point(tp.offset, tp.metadata, end)
            if at == OFFSET_BEGINNING and tp.offset >= 0:
                log.warning("%s[%d]: the committed offset %d lies past the partition's end %d (the topic was created "
                            "again): read from its beginning", self.spans_topic, tp.partition, tp.offset, end)
            self.parts[tp.partition] = PartitionState(tp.partition, sunk_below=sunk)
            start.append(TopicPartition(self.spans_topic, tp.partition, at))
        restored = self._restore([tp.partition for tp in partitions])
        consumer.incremental_assign(start)  # the cooperative protocol: add these, keep the rest
        log.info("span stage assigned %s (reading from %s, rows written below %s); %d completed attempts restored",
                 sorted(tp.partition for tp in partitions), {tp.partition: tp.offset for tp in start},
                 {tp.partition: tp.offset for tp in committed}, restored)

    def _restore(self, partitions: list[int]) -> int:
        """Read the completed-attempts changelog of ``partitions`` from its beginning to its end."""
        # assign() only: no group is joined; the id stays under the application's prefix for ACLs.
        reader = Consumer({**self.kafka_conf, "group.id": f"{self.group}-restore", "enable.auto.commit": False, "log_level": 3})
        n = 0
        try:
            ends: dict[int, int] = {}
            for p in partitions:
                lo, hi = reader.get_watermark_offsets(TopicPartition(self.state_topic, p), timeout=30)
                if hi > lo:
                    ends[p] = hi
            if not ends:
                return 0
            reader.assign([TopicPartition(self.state_topic, p, OFFSET_BEGINNING) for p in ends])
            deadline = time.monotonic() + 300
            while ends and time.monotonic() < deadline:
                msgs: list[Any] = reader.consume(10000, 1.0)  # Any: key/offset are set on records without error
                if not msgs:  # compaction can leave the last offsets empty: the position tells
                    for tp in reader.position([TopicPartition(self.state_topic, p) for p in list(ends)]):
                        if tp.offset >= ends[tp.partition]:
                            ends.pop(tp.partition, None)
                for msg in msgs:
                    if msg.error():
                        continue
                    p = msg.partition()
                    rid, att = msg.key().decode().split(SEP, 1)
                    value = msg.value()
                    if value is None:
                        self.parts[p].restore((rid, att), None)
                    else:
                        entry = json.loads(value)
                        self.parts[p].restore((rid, att), entry["o"], entry["t"])
                    n += 1
                    if msg.offset() + 1 >= ends.get(p, 0):
                        ends.pop(p, None)
            if ends:
                raise KafkaUnavailable(f"could not read the changelog {self.state_topic} partitions {sorted(ends)} to their end")
        finally:
            reader.close()
        return n

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        try:
            self.commit_point(final=True)
        except Exception:  # noqa: BLE001 - the next owner replays what was not committed
            log.exception("commit on revoke failed; the next owner of %s replays from the last commit", partitions)
        self._forget(partitions)
        for tp in partitions:
            self.parts.pop(tp.partition, None)

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        log.warning("span stage lost %s (session expired); the new owner replays from the last commit", partitions)
        self._forget(partitions)
        for tp in partitions:
            self.parts.pop(tp.partition, None)

    # ------------------------------------------------------------------ records

    def poll(self, timeout: float = 0.0) -> int:
        """Process the records librdkafka has fetched (at most ``batch``); → how many."""
        self._consumed_at = time.monotonic()  # commit answers that arrived by now are served in this call
        msgs: list[Any] = self.consumer.consume(self.batch, timeout)  # Any: fields are set on records without error
        if not msgs:
            return 0
        now = time.monotonic()
        ingested_ns = time.time_ns()
        spans = late = 0
        # The compiled decoder's (span view, row head), None where the Python path does the record.
        # One record at a time: a batch's views held at once would be the garbage collector's work.
        decode = self.decoder.decode_one if self.decoder is not None else _none
        for msg in msgs:
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error on %s: %s", self.spans_topic, msg.error())
                continue
            st = self.parts.get(msg.partition())
            if st is None:  # revoked while this batch was fetched
                continue
            offset = msg.offset()
            record: Any
            head: bytes | None = None
            done = decode(msg.value())
            if done is not None:
                name = _SPAN
                record, head = done
                if record.sequence_id == UNNUMBERED:
                    head = None  # the stage may number it (sequence id, attribute): its row is built below
            else:
                try:
                    name, d = codec.decode_raw(msg.value(), _NAMES)
                    if name == _SPAN:
                        check_span(d)
                        record = span_view(d)
                    else:
                        record = codec.from_avro(name, d)
                except (DecodeError, ValidationError) as exc:
                    if offset >= st.sunk_below:
                        self.dead_letter(msg, dead_letter_reason(exc), str(exc))
                    st.skip(offset)
                    continue
            try:
                if name == _SPAN:
                    write, is_late, ready = st.on_span(record, offset, now)
                    if write:
                        row = (head + rowbinary.span_tail(is_late, st.partition, offset, ingested_ns) if head is not None
                               else rowbinary.span(record, st.partition, offset, is_late, ingested_ns))
                        self.sink.add_encoded("spans", row, (self.spans_topic, st.partition, offset))
                        if is_late and self.feedback_topic is not None:
                            self._late_reward(msg, st.partition, record)
                    else:
                        self.stats["replayed"] += 1
                    spans += 1
                    late += is_late
                    if ready is not None:
                        self._finish(st, ready, max(offset, ready.finished_offset))
                else:
                    _EVENT_COUNTERS[record.event].inc()
                    ready = st.on_event(record, offset, now)
                    if ready is not None:
                        self._finish(st, ready, offset)
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the stream
                log.exception("processing %s[%s]@%s failed", msg.topic(), msg.partition(), offset)
                if offset >= st.sunk_below:
                    self.dead_letter(msg, "processing_error", f"{type(exc).__name__}: {exc} (see the worker log)")
        if spans:
            SPANS_IN.labels("false").inc(spans - late)
            if late:
                SPANS_IN.labels("true").inc(late)
            self.stats["spans"] += spans
            self.stats["late"] += late
        return len(msgs)

    def _late_reward(self, msg: Any, partition: int, span: Any) -> None:
        """A span of a completed attempt: feedback when it gives a reward (:func:`streams.feedback.from_late_span`)."""
        ts_ms = msg.timestamp()[1]
        fb = from_late_span(span, True, ts_ms * 1_000_000 if ts_ms > 0 else time.time_ns())
        if fb is not None:
            self._late_feedback.append((partition, fb["rollout_id"].encode(), codec.encode_raw("rolloutbus.Feedback", fb)))
            self.stats["late_feedback"] += 1

    def dead_letter(self, msg: Any, reason: str, detail: str) -> None:
        dl = DeadLetter(
            source_topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), key=msg.key(), value=msg.value(),
            reason=reason, detail=detail[:4000], stage="streams", time_ns=time.time_ns(),
        )
        self._produce(self.dlq_topic, msg.key(), codec.encode(dl))
        DLQ_OUT.labels(msg.topic()).inc()
        self.stats["dlq"] += 1
        log.warning("dead letter %s[%s]@%s: %s: %s", msg.topic(), msg.partition(), msg.offset(), reason, detail)

    # ------------------------------------------------------------------ completion

    def _finish(self, st: PartitionState, att: Attempt, offset: int) -> None:
        """Complete an attempt whose FINISHED arrived (all spans in, or its grace period over)."""
        ev = att.finished
        assert ev is not None
        with self._completing(st, att, offset):
            result = finish_attempt(list(att.spans.values()), ev, self.core, started_ns=att.started_ns)
            self._complete(st, att, result, offset)

    def _time_out(self, st: PartitionState, att: Attempt) -> None:
        # Spans of this attempt after what was read so far are late.
        offset = st.position - 1
        with self._completing(st, att, offset):
            result = finish_attempt(
                list(att.spans.values()), None, self.core, rollout_id=att.rollout_id, attempt_id=att.attempt_id,
                task_id=att.task_id, mode=att.mode, attempt=att.attempt, started_ns=att.started_ns, finished_ns=time.time_ns(),
            )
            if result.resource_version is None:
                result.resource_version = att.resource_version
            self._complete(st, att, result, offset)

    @staticmethod
    @contextmanager
    def _completing(st: PartitionState, att: Attempt, offset: int) -> Iterator[None]:
        """A completion that fails anywhere still ends the attempt: its spans are stored, and it must not stay
        in flight (tried again on every record, holding the partition's replay point back for good)."""
        try:
            yield
        except Exception:
            if att.key in st.inflight:
                st.complete(att, offset)
            raise

    def _complete(self, st: PartitionState, att: Attempt, result: RolloutResult, offset: int) -> None:
        gid = group_of(result.mode, result.task_id, result.resource_version)
        if not gid and result.mode == "train" and not self._said_no_task:
            self._said_no_task = True
            log.warning("rollout %s has no task id (no STARTED event named one): stored, not grouped or trained; "
                        "start rollouts with their task (LitAgent, `rolloutbus tasks`, or Agent Lightning's "
                        "start_rollout/enqueue) to train on them (said once)", result.rollout_id)
        now = time.time_ns()
        source = (self.spans_topic, st.partition, offset)
        self.sink.add("rollouts", rollout_row(result, gid, now), source)
        self.sink.add_transitions(result, gid, now, source)
        if gid:
            self._produce(self.done_topic, gid.encode(), result.to_bytes())
        st.complete(att, offset)
        ROLLOUTS_DONE.labels(result.status).inc()
        self.stats["rollouts"] += 1

    def finish_graced(self) -> None:
        """Complete the attempts whose grace period has just run out (cheap: asked after every poll)."""
        now = time.monotonic()
        for st in list(self.parts.values()):
            for att in st.graced(now, self.finish_grace_s):
                self._complete_due(st, att)

    def tick(self) -> None:
        """Complete attempts whose grace period ran out and time out idle ones."""
        self.finish_graced()
        now = time.monotonic()
        inflight = 0
        for st in list(self.parts.values()):
            for att in st.idle(now, self.rollout_timeout_s):
                self._complete_due(st, att)
            inflight += len(st.inflight)
        INFLIGHT.set(inflight)

    def _complete_due(self, st: PartitionState, att: Attempt) -> None:
        try:
            if att.finished is not None:
                self._finish(st, att, att.finished_offset)
            else:
                self._time_out(st, att)
        except Exception:  # noqa: BLE001 - logged; the attempt is dropped, its spans are stored
            log.exception("completing %s/%s failed; its spans are stored, it is not trained", att.rollout_id, att.attempt_id)

    # ------------------------------------------------------------------ commit point

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            return
        # A changelog entry, a summary or a dead letter librdkafka gave up on: the offsets of this commit point are
        # not committed. One it gave up on for lack of time (the broker away) goes out again at the next commit
        # point; one the broker refuses for good (too large, not authorised) would be refused again at every one,
        # and no offset would ever be committed again: it is logged and left.
        self._failed.append(f"{msg.topic()}: {err}")
        if err.code() in _TRANSIENT or err.retriable():
            self._redo.append((msg.topic(), msg.key(), msg.value(), msg.partition()))
        else:
            log.error("%s refused a record for good (%s): not sent again%s", msg.topic(), err,
                      "; that rollout is stored, not trained" if msg.topic() == self.done_topic else "")

    def _send(self, topic: str, key: bytes | None, value: bytes | None, partition: int = -1) -> None:
        """``_produce`` at a commit point: a record librdkafka refuses at once fails this commit point (its
        offsets wait), is logged, and does not stop the rest from going out."""
        try:
            self._produce(topic, key, value, partition)
        except KafkaException as exc:
            self._failed.append(f"{topic}: {exc}")
            log.error("%s refused a record (%s): not sent", topic, exc)

    def _produce(self, topic: str, key: bytes | None, value: bytes | None, partition: int = -1) -> None:
        while True:
            try:
                if partition >= 0:
                    self.producer.produce(topic, value=value, key=key, partition=partition, on_delivery=self._delivered)
                else:
                    self.producer.produce(topic, value=value, key=key, on_delivery=self._delivered)
                return
            except BufferError:  # librdkafka's queue is full: let it drain
                self.producer.poll(0.05)

    def commit_point(self, *, final: bool = False) -> None:
        """Hand the rows buffered since the last commit point to the sink, and settle every earlier commit
        point whose rows are written: deliver what was produced and the completed attempts' changelog
        entries, then commit the offsets those rows came from (:class:`streams.checkpoint.Checkpoint`).

        The rows go to the sink's writer thread and the stage reads on while ClickHouse inserts them; the
        next commit point waits for them (at most one batch in flight) and commits their offsets then.
        ``final`` (revoke, stop) writes everything and commits before it returns."""
        if self._closed:
            return
        self.checkpoint.commit_now(final)

    # The checkpoint's steps on librdkafka (streams.checkpoint.Committing). They wait here, holding the event loop.

    def take(self, final: bool) -> tuple[list[tuple[int, bytes, bytes | None]], dict[int, TopicPartition],
                                         list[tuple[int, bytes, bytes]]]:
        """(partition, changelog key, value) entries of the attempts completed since the last commit point,
        partition → offset to commit, and the late reward spans' feedback records (partition, key, value)."""
        if final and self._commit_sent is not None:  # an earlier commit may yet be refused: this one waits, with every offset
            self._commit_again()
        now_ns = time.time_ns()
        entries: list[tuple[int, bytes, bytes | None]] = []
        offsets: dict[int, TopicPartition] = {}
        for st in self.parts.values():
            done, offset = st.commit_point(now_ns, self.retention_ns)
            for (rid, att), fin in done:
                value = None if fin is None else json.dumps({"o": fin, "t": now_ns}).encode()
                entries.append((st.partition, f"{rid}{SEP}{att}".encode(), value))
            if offset is not None:
                position, replay_from = offset
                offsets[st.partition] = TopicPartition(self.spans_topic, st.partition, position, metadata=f"{REPLAY_PREFIX}{replay_from}")
        feedback, self._late_feedback = self._late_feedback, []
        return entries, offsets, feedback

    async def deliver(self) -> float:
        """What was refused before is sent again, then every summary and dead letter waited for."""
        redo, self._redo = self._redo, []
        for topic, key, value, partition in redo:  # refused before: sent again, before what follows them
            self._send(topic, key, value, partition=partition)
        # What these attempts produced (their summaries, dead letters) is on the broker before the entries that
        # say they are done are sent: those go to other partitions, maybe another broker, and an entry landing
        # first, then a crash, would restore an attempt as done with its summary lost (its group short of it).
        # Both waits together take at most DELIVERY_WAIT_S.
        deadline = time.monotonic() + DELIVERY_WAIT_S
        self._flush(deadline)
        return deadline

    async def send_changelog(self, points: list[Any], by: float | None) -> None:
        # Their rows are written: the late reward spans' feedback goes now (one not delivered is sent again
        # from _redo; a restart before the offsets reads the span again, the same feedback id: counted once).
        late = [(key, value) for _, _, feedback in points for _, key, value in feedback]
        if late:
            assert self.feedback_topic is not None  # only then are they collected
            for key, value in late:
                self._send(self.feedback_topic, key, value)
        for entries, _, _ in points:
            for partition, key, value in entries:
                self._send(self.state_topic, key, value, partition=partition)
        assert by is not None
        self._flush(by)

    async def commit(self, points: list[Any], final: bool) -> None:
        offsets: dict[int, TopicPartition] = {}
        for _, later, _ in points:
            offsets.update(later)
        if offsets and self._commit_sent is not None and not final:
            # One asynchronous commit at a time. librdkafka sends a commit again after a backoff when the coordinator
            # moved or timed out, and answers only then; a later commit sent meanwhile could land first and be
            # overwritten by the older one. These offsets go with the first commit point after the answer.
            self._commit_again()
        elif offsets:
            try:
                # A revoke or a stop hands the partitions on: their offsets are in before it returns. Otherwise the
                # loop does not wait for the group coordinator (with the broker gone, 45 s): ``_committed`` hears
                # the answer at a later poll, and a refused commit is made again at the next commit point.
                self.consumer.commit(offsets=list(offsets.values()), asynchronous=not final)
                if not final:
                    self._commit_sent = time.monotonic()
            except KafkaException as exc:
                self._commit_again()
                self._commit_refused(exc.args[0] if exc.args else exc)
        if points:
            self._lag()
        refused, self._commit_error = self._commit_error, None
        if final:  # its own commit was waited for: what an earlier one got is behind it
            return
        if refused is not None:  # an earlier commit: its offsets are committed again
            self._commit_refused(refused)
        if self._commit_sent is not None and self._consumed_at - self._commit_sent > DELIVERY_WAIT_S:
            # Not answered by a poll 5 s after it was sent (the coordinator unknown, the broker gone): not ready, as
            # a refused commit would be. Counted to the last poll: answers are served there, not while we insert.
            raise KafkaUnavailable(f"offset commit unanswered for {self._consumed_at - self._commit_sent:.0f} s")

    def put_back(self, points: list[Any], sent: bool) -> bool:
        """Nothing to take back: a point that failed before its entries stays queued in the checkpoint, and every
        partition's offset goes with the next commit point (``_flush``); entries librdkafka gave up on are in
        ``_redo``."""
        return False

    def _flush(self, deadline: float) -> None:
        """Wait until the broker has everything produced; raise (offsets not committed) if it does not by
        ``deadline`` (monotonic): the loop (faust's heartbeats among it) waits meanwhile. What is still queued stays
        queued; librdkafka delivers it or reports it failed, and then it is sent again (``_delivered``)."""
        left = self.producer.flush(max(deadline - time.monotonic(), 0.0))
        if left or self._failed:
            failed, self._failed = self._failed, []
            self._commit_again()
            raise KafkaUnavailable(f"{left} records undelivered, {len(failed)} failed ({failed[:3]}): offsets not committed")

    def _committed(self, err: Any, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to the asynchronous commit in flight (called inside ``consume``)."""
        self._commit_sent = None
        err = err if err is not None else next((tp.error for tp in partitions or () if tp.error is not None), None)
        if err is not None:
            self._commit_again()
            self._commit_error = err

    def _commit_again(self) -> None:
        """Every partition's offset goes with the next commit point, changed or not."""
        for st in self.parts.values():
            st.committed = (-1, -1)

    def _commit_refused(self, err: Any) -> None:
        """Say that a commit was refused (its offsets are committed again at the next commit point)."""
        if getattr(err, "code", lambda: None)() in _REBALANCING:
            # Expected while a cooperative rebalance is under way: committed at the next commit point.
            log.info("span stage commit deferred, the group is rebalancing: %s", err)
        else:
            raise KafkaUnavailable(f"offset commit failed: {err}")

    def _forget(self, partitions: list[TopicPartition]) -> None:
        """Drop what is not settled for partitions no longer ours: their next owner replays them."""
        gone = {tp.partition for tp in partitions}
        self._redo = [r for r in self._redo if r[0] != self.state_topic or r[3] not in gone]
        self._late_feedback = [f for f in self._late_feedback if f[0] not in gone]
        for _, (entries, offsets, feedback) in self.checkpoint.unsettled:
            entries[:] = [e for e in entries if e[0] not in gone]
            feedback[:] = [f for f in feedback if f[0] not in gone]
            for p in gone:
                offsets.pop(p, None)

    def _lag(self) -> None:
        for st in self.parts.values():
            if st.position < 0:
                continue
            try:
                _, hi = self.consumer.get_watermark_offsets(TopicPartition(self.spans_topic, st.partition), cached=True)
            except KafkaException:
                continue
            if hi >= 0:
                LAG.labels(self.spans_topic, str(st.partition)).set(max(hi - st.position, 0))

    def hold(self, on: bool) -> None:
        """Pause (``on``) or resume fetching every assigned partition; idempotent."""
        if on == self._held:
            if on:  # partitions assigned since are paused too
                self.consumer.pause(self.consumer.assignment())
            return
        self._held = on
        assigned = self.consumer.assignment()
        if on:
            log.error("ClickHouse is not taking rows (%d buffered): fetching paused until a flush succeeds", self.sink.pending)
            self.consumer.pause(assigned)
        else:
            log.warning("ClickHouse flushed: fetching resumed")
            self.consumer.resume(assigned)

    def inflight(self) -> dict[Key, Attempt]:
        return {k: a for st in self.parts.values() for k, a in st.inflight.items()}

    def close(self) -> None:
        """Leave the consumer group (after the caller's last commit point)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.producer.flush(10)
            self.consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the span stage's Kafka clients: %s", exc)


__all__ = ["SpanStage", "dead_letter_reason", "parse_replay_from", "resume_point", "span_group", "state_topic_name"]
