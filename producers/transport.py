"""The span transport: ``emit`` enqueues and returns; a background thread encodes, spools and produces.

The agent's cost of one span is a ``deque.append`` (plus building its small dict). The worker thread:

1. encodes the Avro dict with :func:`schemas.codec.encode_raw` (no pydantic on this path),
2. appends the bytes to the on-disk :class:`~producers.spool.Spool` (the write-ahead log; handed to
   the OS every loop, fsynced on a cadence), so neither a broker outage nor a SIGKILL loses it,
3. hands it to an idempotent confluent-kafka producer (lz4, batching; key = rollout id). When
   librdkafka's queue is full (the broker is down for a while) the worker stops handing over and
   later reads the backlog back from the spool, in order. Delivered records advance the spool's
   acknowledged watermark; a later process replays whatever is above it.

When the spool is full the configured policy applies — ``drop_newest`` or ``block`` — and it is loud:
a counter in :meth:`SpanTransport.stats` and a WARNING log. Telemetry never raises into the agent.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from enum import Enum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation.errors import ConfigError, EncodeError, ServiceError
from schemas.codec import encode_raw

from producers.spool import FRAME_OVERHEAD, Spool, open_spool

if TYPE_CHECKING:
    from producers.settings import AgentSettings

log = logging.getLogger(__name__)

SPAN = "rolloutbus.Span"
ROLLOUT_EVENT = "rolloutbus.RolloutEvent"


# How often the delivered watermark is written to the spool (a file write and rename): a process killed
# between two writes sends up to this much again on restart, which the span stage drops as duplicates.
ACK_EVERY_S = 0.25
# Records queued before a single emit wakes the transport thread; fewer wait for its next look (every
# 5 ms at most), so a steady trickle of emits costs no thread switch each.
WAKE_AT = 256


class FullPolicy(str, Enum):
    """What happens to a new record when the spool (or the in-memory queue) is full."""

    DROP_NEWEST = "drop_newest"
    BLOCK = "block"


def producer_config(kafka_conf: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """An idempotent, compressing, batching producer. ``message.timeout.ms=0``: retry until delivered
    (the spool bounds memory), so ordering per key survives a broker restart without duplicates."""
    conf: dict[str, Any] = {
        **kafka_conf,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": 10,
        "batch.num.messages": 10000,
        "batch.size": 4 << 20,
        "queue.buffering.max.messages": 200_000,
        "queue.buffering.max.kbytes": 256 << 10,
        "message.timeout.ms": 0,
        "message.max.bytes": 16 << 20,
        "log_level": 3,
    }
    conf.update(overrides or {})
    return conf


class _Barrier:
    """A mark in the queue (:meth:`SpanTransport.spooled`): its future is done once every record queued before it is
    in the spool, handed to the OS."""

    __slots__ = ("future",)

    def __init__(self, future: Future[None]) -> None:
        self.future = future


class _Encoded:
    """A record already encoded by the caller (the gateway): skips the worker's encode step."""

    __slots__ = ("key", "value")

    def __init__(self, key: bytes, value: bytes) -> None:
        self.key = key
        self.value = value


class _Range:
    """Consecutive spool records [first, end) handed to librdkafka together, and how many of them
    are still to be delivered; ``callback`` is every one's delivery callback."""

    __slots__ = ("first", "end", "left", "callback")

    def __init__(self, transport: SpanTransport, first: int, n: int) -> None:
        self.first, self.end, self.left = first, first + n, n
        self.callback = partial(transport._on_delivery, self)


class SpanTransport:
    """Never-blocking (by default), never-losing producer of Avro records keyed by rollout id."""

    def __init__(
        self,
        kafka_conf: dict[str, Any],
        topic: str,
        spool_dir: Path,
        *,
        spool_name: str = "agent",
        spool_max_bytes: int = 1 << 30,
        max_queue: int = 500_000,
        on_full: FullPolicy | str = FullPolicy.DROP_NEWEST,
        fsync_interval_s: float = 1.0,
        producer_overrides: dict[str, Any] | None = None,
    ) -> None:
        from confluent_kafka import Producer

        try:
            self.policy = FullPolicy(on_full)
        except ValueError:
            raise ConfigError(f"spool full policy must be drop_newest or block, got {on_full!r}") from None
        self.topic = topic
        self.max_queue = max_queue
        self.fsync_interval_s = fsync_interval_s
        self._q: deque[Any] = deque()
        self._wake = threading.Event()
        self._space = threading.Condition()
        self._sleeping = False
        self._held = 0  # records the worker took off the queue and has not spooled yet
        self._stop = False
        self._closed = False
        self.spool: Spool = open_spool(Path(spool_dir), spool_name, spool_max_bytes)
        self._low = self.spool.acked  # every record below is delivered
        self._done: dict[int, int] = {}  # delivered ranges above the watermark: first index → end
        self._inflight = 0
        # Backlog: records on disk not yet handed to librdkafka (replay after restart, or a full queue).
        self._cursor: int | None = self._low if self.spool.pending else None
        self.kafka_up = True
        self.counters = {
            "enqueued": 0,
            "produced": 0,
            "delivered": 0,
            "dropped_queue_full": 0,
            "dropped_spool_full": 0,
            "blocked": 0,
            "encode_errors": 0,
            "delivery_failed": 0,
            "replayed": 0,
        }
        self._last_warn = 0.0
        conf = producer_config(kafka_conf, producer_overrides)
        conf["error_cb"] = self._on_error
        self._conf = conf
        # A fatal Kafka error (ACL refusal, refused login, fatal producer): the worker stops and every
        # later emit/flush raises it; what was not delivered stays in the spool for the next process.
        self.error: ServiceError | None = None
        self._producer = Producer(conf)
        if self.spool.pending:
            log.info("spool %s: replaying %d records left by an earlier process", self.spool.dir, self.spool.pending)
        self._thread = threading.Thread(target=self._run, name="rolloutbus-transport", daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(cls, s: AgentSettings, spool_name: str = "agent") -> SpanTransport:
        """The transport an agent-side process's settings describe (spool under ``<data dir>/spool``)."""
        return cls(
            s.kafka_conf(),
            s.topics.spans,
            s.data_dir / "spool",
            spool_name=spool_name,
            spool_max_bytes=s.spool_max_bytes,
            on_full=s.spool_full_policy,
            fsync_interval_s=s.spool_fsync_interval_s,
        )

    # ------------------------------------------------------------------ agent side (hot path)

    def _raise_failure(self) -> None:
        if self.error is not None:
            raise self.error

    def _fail(self, error: ServiceError) -> None:
        if self.error is None:
            self.error = error
            log.error("rolloutbus transport stopped: %s; undelivered records stay in %s", error, self.spool.dir)
        self._wake.set()

    def emit(self, key: str, name: str, record: dict[str, Any]) -> bool:
        """Enqueue one Avro dict of record type ``name``. Returns False when it was dropped (full).

        Raises the transport's fatal :class:`ServiceError` (an ACL refusal, a refused login) once it met one."""
        self._raise_failure()
        q = self._q
        if len(q) >= self.max_queue and not self._full_queue():
            return False
        q.append((key, name, record))
        if self._sleeping and len(q) >= WAKE_AT:
            self._wake.set()
        return True

    def emit_encoded(self, key: bytes, value: bytes) -> bool:
        """Enqueue an already-encoded record (single-object Avro bytes); raises as :meth:`emit` does."""
        self._raise_failure()
        q = self._q
        if len(q) >= self.max_queue and not self._full_queue():
            return False
        q.append(_Encoded(key, value))
        if self._sleeping and len(q) >= WAKE_AT:
            self._wake.set()
        return True

    def emit_encoded_many(self, records: list[tuple[bytes, bytes]]) -> int:
        """Enqueue already-encoded records in order and wake the worker once; returns how many were taken,
        from the first (the rest were dropped: the queue is full). Raises as :meth:`emit` does."""
        self._raise_failure()
        q = self._q
        if len(q) + len(records) > self.max_queue:  # record by record, as the policy says
            for n, (key, value) in enumerate(records):
                if not self.emit_encoded(key, value):
                    return n
            return len(records)
        q.extend([_Encoded(key, value) for key, value in records])
        if self._sleeping:
            self._wake.set()
        return len(records)

    def spooled(self) -> Future[None]:
        """A future done once every record emitted before this call is in the spool (written and handed to the OS: a
        SIGKILL of this process loses none of them; the next start sends them). The gateway answers 200 only then.
        Failed with the transport's error when it stopped first."""
        future: Future[None] = Future()
        if self.error is not None:
            future.set_exception(self.error)
            return future
        self._q.append(_Barrier(future))
        if self._sleeping:
            self._wake.set()
        return future

    def _full_queue(self) -> bool:
        """The in-memory queue is full: block until there is room, or drop (loudly). True: go on."""
        if self.policy is FullPolicy.BLOCK and not self._stop:
            self.counters["blocked"] += 1
            with self._space:
                while len(self._q) >= self.max_queue and not self._stop:
                    self._wake.set()
                    self._space.wait(0.1)
            return True
        self.counters["dropped_queue_full"] += 1
        self._warn_drop("in-memory queue")
        return False

    def _warn_drop(self, where: str) -> None:
        now = time.monotonic()
        if now - self._last_warn > 5.0:
            self._last_warn = now
            log.warning(
                "rolloutbus transport: %s full, dropping newest records (policy drop_newest): "
                "%d dropped at the queue, %d at the spool so far; spool %s holds %d bytes",
                where, self.counters["dropped_queue_full"], self.counters["dropped_spool_full"],
                self.spool.dir, self.spool.size_bytes,
            )

    # ------------------------------------------------------------------ status

    def accepting(self, nbytes: int = 0) -> bool:
        """False when Kafka is down and the spool has no room for ``nbytes`` more (records about to be
        emitted, with their framing): a caller (the gateway) should push back rather than accept them."""
        return self.error is None and (self.kafka_up or not self.spool.full(nbytes))

    def stats(self) -> dict[str, Any]:
        return {
            **self.counters,
            "queued": len(self._q),
            "inflight": self._inflight,
            "spool_pending": self.spool.head - self._low,
            "spool_bytes": self.spool.size_bytes,
            "kafka_up": self.kafka_up,
        }

    # ------------------------------------------------------------------ worker

    def _fatal(self, err: Any) -> bool:
        from foundation.kafka_admin import AUTHENTICATION_CODES, AUTHORIZATION_CODES

        return bool(err.fatal()) or err.code() in AUTHORIZATION_CODES | AUTHENTICATION_CODES

    def _on_error(self, err: Any) -> None:
        from confluent_kafka import KafkaError

        from foundation.kafka_admin import kafka_failure

        if self._fatal(err):
            self._fail(kafka_failure(self._conf, err, f"write topic {self.topic}"))
        elif err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            if self.kafka_up:
                log.warning("rolloutbus transport: Kafka unreachable (%s); spooling to %s", err.str(), self.spool.dir)
            self.kafka_up = False
        else:
            log.debug("kafka client: %s", err)

    def _on_delivery(self, rng: _Range, err: Any, msg: Any) -> None:
        """A record of ``rng`` delivered or failed (librdkafka's callback, on the worker thread)."""
        self._inflight -= 1
        if err is not None:
            if self._fatal(err):  # not acknowledged: the record stays in the spool
                from foundation.kafka_admin import kafka_failure

                self._fail(kafka_failure(self._conf, err, f"write topic {self.topic}"))
                return
            if err.retriable():
                # Resend the same bytes in the same range; the watermark waits for it.
                self._produce(rng, msg.key(), msg.value())
                return
            self.counters["delivery_failed"] += 1
            log.error("rolloutbus transport: Kafka rejected a record of %d..%d for good (%s); kept in %s/rejected",
                      rng.first, rng.end - 1, err.str(), self.spool.dir)
            try:
                with open(self.spool.dir / "rejected", "ab") as fh:
                    from producers.spool import _encode_frame

                    fh.write(_encode_frame(msg.key() or b"", msg.value() or b""))
            except OSError:
                log.exception("could not keep the rejected record")
        else:
            self.counters["delivered"] += 1
            if not self.kafka_up:
                log.info("rolloutbus transport: Kafka reachable again")
            self.kafka_up = True
        rng.left -= 1
        if rng.left == 0:
            self._range_done(rng.first, rng.end)

    def _range_done(self, first: int, end: int) -> None:
        """Every record in [first, end) is delivered: move the watermark over it and the ranges above it."""
        if first != self._low:
            self._done[first] = end
            return
        done = self._done
        while end in done:
            end = done.pop(end)
        self._low = end

    def _produce(self, rng: _Range, key: bytes, value: bytes) -> bool:
        """One record of ``rng`` to librdkafka (a resend, or one record of the backlog)."""
        try:
            self._producer.produce(self.topic, value, key, on_delivery=rng.callback)
        except BufferError:
            return False
        self._inflight += 1
        self.counters["produced"] += 1
        return True

    def _encode(self, item: Any) -> tuple[bytes, bytes] | None:
        if type(item) is _Encoded:
            return item.key, item.value
        key, name, record = item
        try:
            return key.encode(), encode_raw(name, record)
        except EncodeError as exc:
            self.counters["encode_errors"] += 1
            log.error("rolloutbus transport: cannot encode a %s for rollout %s, not sent: %s", name, key, exc)
            return None

    def _spool_room(self, nbytes: int) -> bool:
        spool = self.spool
        if not spool.full(nbytes):
            return True
        if self.policy is FullPolicy.BLOCK:
            self.counters["blocked"] += 1
            log.warning("rolloutbus transport: spool %s full (%d bytes); blocking until Kafka takes records", spool.dir, spool.size_bytes)
            while spool.full(nbytes) and not (self._stop and not self.kafka_up):
                if self._cursor is not None:
                    self._drain_backlog()
                self._producer.poll(0.1)
                self._ack()
            return not spool.full(nbytes)
        self.counters["dropped_spool_full"] += 1
        self._warn_drop("spool")
        return False

    def _ack(self) -> None:
        if self._low > self.spool.acked:
            self.spool.ack_to(self._low)

    def _drain_backlog(self, limit: int = 5000) -> None:
        assert self._cursor is not None
        head = self.spool.head
        while self._cursor < head and limit > 0:
            records = self.spool.read_from(self._cursor, min(limit, 2000))
            if not records:
                break
            for idx, key, value in records:
                if not self._produce(_Range(self, idx, 1), key, value):
                    return
                self._cursor = idx + 1
                self.counters["replayed"] += 1
                limit -= 1
        if self._cursor >= head:
            self._cursor = None

    def _hand_off(self, batch: list[tuple[bytes, bytes]]) -> None:
        """Write records to the spool, then give them to librdkafka (unless a backlog waits on disk)."""
        first = self.spool.append_many(batch)
        self.counters["enqueued"] += len(batch)
        if self._cursor is not None:
            return
        # _produce, inlined: this loop runs once per record at the producer's full rate. The batch
        # shares one delivery callback (no Python object per record).
        rng = _Range(self, first, len(batch))
        produce, delivered, topic = self._producer.produce, rng.callback, self.topic
        idx = first
        try:
            for key, value in batch:
                produce(topic, value, key, on_delivery=delivered)
                idx += 1
        except BufferError:
            self._cursor = idx  # librdkafka is full: the rest waits on disk, sent one by one
            rng.end, rng.left = idx, idx - first  # no callback has run yet: they run in poll(), on this thread
        finally:
            self._inflight += idx - first
            self.counters["produced"] += idx - first

    def _run(self) -> None:
        from confluent_kafka import KafkaException

        from foundation.kafka_admin import kafka_failure

        try:
            self._work()
        except KafkaException as exc:
            self._fail(kafka_failure(self._conf, exc, f"write topic {self.topic}"))
        except Exception as exc:  # the caller must learn of it at its next emit/flush, not find a dead thread
            log.exception("rolloutbus transport worker failed")
            self._fail(ServiceError(f"the span transport to topic {self.topic} stopped: {exc!r}"))
        finally:  # a caller waiting on spooled() learns that it will not be
            stopped = self.error or ServiceError(f"the span transport to topic {self.topic} stopped")
            for item in list(self._q):
                if type(item) is _Barrier and not item.future.done():
                    item.future.set_exception(stopped)

    def _work(self) -> None:
        last_fsync = time.monotonic()
        last_ack = last_fsync
        q = self._q
        barriers: list[_Barrier] = []
        while True:
            n = 0
            while q and n < 10000:
                # Popped records are in neither the queue nor the spool until handed off: flush()
                # waits while ``_held`` says so, and it is set before the first pop.
                take = self._held = min(len(q), 1000)
                items = [q.popleft() for _ in range(take)]
                batch = []
                nbytes = 0
                for item in items:
                    if type(item) is _Barrier:
                        barriers.append(item)  # done once what came before it is in the spool (below)
                        continue
                    enc = self._encode(item)
                    if enc is not None:
                        batch.append(enc)
                        nbytes += len(enc[0]) + len(enc[1]) + FRAME_OVERHEAD
                n += 1000
                if batch and not self.spool.full(nbytes):
                    self._hand_off(batch)
                elif batch:  # record by record: each waits for room or is dropped, as the policy says
                    for kv in batch:
                        if self._spool_room(len(kv[0]) + len(kv[1]) + FRAME_OVERHEAD):
                            self._hand_off([kv])
                self._held = 0
            if n and self.policy is FullPolicy.BLOCK:
                with self._space:
                    self._space.notify_all()
            now = time.monotonic()
            fsync = now - last_fsync >= self.fsync_interval_s
            self.spool.flush(fsync=fsync)
            if fsync:
                last_fsync = now
            if barriers:
                for b in barriers:
                    b.future.set_result(None)
                barriers.clear()
            if self._cursor is not None:
                self._drain_backlog()
            self._producer.poll(0)
            if now - last_ack >= ACK_EVERY_S:
                self._ack()
                last_ack = now
            if (self._stop and not q) or self.error is not None:
                break
            if not q:
                self._sleeping = True
                if not q:
                    self._wake.wait(0.005)
                self._wake.clear()
                self._sleeping = False
        self.spool.flush(fsync=True)

    # ------------------------------------------------------------------ shutdown

    def flush(self, timeout: float = 10.0) -> int:
        """Wait until everything emitted so far is delivered. Returns how many are still pending."""
        deadline = time.monotonic() + timeout
        target = None
        while time.monotonic() < deadline:
            self._raise_failure()
            if not self._q and not self._held:
                target = target if target is not None else self.spool.head
                if self._low >= target:
                    return 0
            self._wake.set()
            time.sleep(0.005)
        return self.spool.head - self._low + len(self._q) + self._held

    def close(self, timeout: float = 10.0) -> int:
        """Flush (up to ``timeout``), stop the worker and release the spool. What is not delivered
        stays in the spool for the next process. Returns the number of records left there."""
        if self._closed:
            return 0
        self._closed = True
        try:
            left = self.flush(timeout)
        except ServiceError:  # already told; what is not delivered stays in the spool
            left = self.spool.head - self._low
        self._stop = True
        self._wake.set()
        with self._space:
            self._space.notify_all()
        self._thread.join(timeout=max(1.0, timeout))
        self._producer.flush(0.5 if left else 2.0)
        self._producer.poll(0)
        self._ack()
        left = self.spool.head - self._low
        self.spool.close()
        if left:
            log.warning("rolloutbus transport: %d records not delivered yet; kept in %s for the next start", left, self.spool.dir)
        return left


# --------------------------------------------------------------------------- process default

_default: SpanTransport | None = None
_default_lock = threading.Lock()


def set_transport(transport: SpanTransport | None) -> SpanTransport | None:
    """Install the transport ``emit_*`` helpers use (returns the previous one)."""
    global _default
    with _default_lock:
        prev, _default = _default, transport
    return prev


def get_transport() -> SpanTransport:
    """The process's transport; built on first use from ``ROLLOUTBUS_*`` settings, closed at exit."""
    global _default
    if _default is not None:
        return _default
    with _default_lock:
        if _default is None:
            from producers.settings import AgentSettings

            _default = SpanTransport.from_settings(AgentSettings())
            atexit.register(_default.close)
        return _default


__all__ = ["SpanTransport", "FullPolicy", "producer_config", "get_transport", "set_transport", "SPAN", "ROLLOUT_EVENT"]
