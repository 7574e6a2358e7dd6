"""Agent Lightning's rollout queue on rb.tasks, the I/O of one gateway replica: enqueue produces task
records; dequeue hands out the tasks of the partitions this replica owns in the consumer group
``Topics.agl_dequeue_group``; ClickHouse tells which claims ended through another replica.

The bookkeeping (claims, deadlines, what to commit, the commit mark a later owner reads) is
:mod:`producers.ingest.agl.claims`; its docstring says why a task has at most one live claim across replicas.
One thread polls the consumer and sweeps the claims; the routes call :meth:`TaskQueue.dequeue` and
:meth:`TaskQueue.enqueue` from an executor. A lock keeps the book and the consumer to one caller.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from foundation.config import Topics
from foundation.errors import DecodeError, KafkaUnavailable, ServiceError, ValidationError
from producers.ingest.agl.claims import Claim, ClaimBook, claim_mark, read_mark
from producers.ingest.agl.v0_3_queue_records import attempted_rollout, new_rollout_id, rollout_reply, task_from_request
from producers.ingest.resources import Resources
from producers.transport import SpanTransport
from schemas.codec import decode, encode
from schemas.models import SPANS_UNKNOWN, RolloutEvent, Task

log = logging.getLogger(__name__)

# rollout ids → {attempt id: status} of ended attempts (ClickHouse's rollouts); raises when it cannot tell.
Ended = Callable[[Sequence[str]], "dict[str, dict[str, str]]"]
# rollout ids of 1.x's API offered here → those that left queuing elsewhere (the control records): no longer offered.
Settled = Callable[[Sequence[str]], "set[str]"]
SUCCESS = ("succeeded", "finished")  # "finished": a FINISHED event that named no status


class TaskQueue:
    """One replica's share of the queue. Joins the consumer group on the first dequeue (:meth:`start`)."""

    def __init__(self, kafka_conf: dict[str, Any], topics: Topics, transport: SpanTransport, *,
                 claim_timeout_s: float = 600.0, max_attempts: int = 2, check_s: float = 2.0,
                 ended: Ended | None = None, resources: Resources | None = None, session_timeout_ms: int = 10_000) -> None:
        self.kafka_conf, self.topics, self.transport = kafka_conf, topics, transport
        self.book = ClaimBook(claim_timeout_s, max_attempts)
        self.check_s = check_s
        self.ended = ended
        self.settled: Settled | None = None  # 1.x's rollouts that left queuing (its control records)
        self.settled_v03: Settled | None = None  # 0.3's that a start_attempt or update_rollout took out of the queue
        self.resources = resources
        self.session_timeout_ms = session_timeout_ms
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._producer: Any = None
        # Read-your-enqueues: how long a dequeue that finds nothing waits for this replica's consumer to read the tasks
        # this replica enqueued in partitions it owns (partition → highest offset enqueued here / read here).
        self.own_enqueue_wait_s = 1.0
        self._enqueued: dict[int, int] = {}
        self._read: dict[int, int] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> TaskQueue:
        with self._lock:
            if self._thread is None:
                from confluent_kafka import Consumer

                self._consumer = Consumer({
                    **self.kafka_conf, "group.id": self.topics.agl_dequeue_group, "enable.auto.commit": False,
                    "auto.offset.reset": "earliest", "partition.assignment.strategy": "cooperative-sticky",
                    "session.timeout.ms": self.session_timeout_ms, "max.poll.interval.ms": 86_400_000, "log_level": 0})
                self._consumer.subscribe([self.topics.tasks], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                         on_lost=self._on_lost)
                self._thread = threading.Thread(target=self._run, name="rolloutbus-agl-queue", daemon=True)
                self._thread.start()
        return self

    def close(self) -> None:
        """Commit what is done (with the claims' mark) and leave the group, so another replica takes over."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        with self._lock:
            if self._consumer is not None:
                self._commit(self.book.partitions())
                self._consumer.close()
                self._consumer = None
        if self._producer is not None:
            self._producer.flush(10)

    # ------------------------------------------------------------------ the consumer's thread

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        if not partitions:
            return
        for _ in range(3):
            try:
                committed = consumer.committed(partitions, timeout=10)
                break
            except KafkaException as exc:
                log.warning("reading the commits of %s failed: %s", self.topics.tasks, exc)
        else:
            # Not knowing what the last owner handed out, hold every task of these partitions for a claim's time.
            hold = claim_mark(1 << 62, time.time() + self.book.claim_timeout_s)
            committed = [TopicPartition(tp.topic, tp.partition, metadata=hold) for tp in partitions]
        for tp in committed:
            mark = read_mark(tp.metadata)
            self.book.assign(tp.partition, mark)
            log.info("rb.tasks partition %d is ours (handed out up to offset %d by its last owner)", tp.partition, mark[0])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._commit([tp.partition for tp in partitions])
        for tp in partitions:
            self.book.revoke(tp.partition)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:
            self.book.revoke(tp.partition)

    def _commit(self, partitions: Sequence[int]) -> bool:
        """Commit each partition up to its lowest open task, with the claims' mark. Under the lock."""
        from confluent_kafka import KafkaException, TopicPartition

        offsets = []
        for p in partitions:
            offset = self.book.committable(p)
            if offset is not None:
                claimed_to, until = self.book.mark(p)
                offsets.append(TopicPartition(self.topics.tasks, p, offset, metadata=claim_mark(claimed_to, until)))
        if not offsets:
            return True
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("commit on %s failed: %s", self.topics.tasks, exc)
            return False
        for tp in offsets:
            self.book.forget_done(tp.partition, tp.offset)
        return True

    def _run(self) -> None:
        next_sweep = time.monotonic() + self.check_s
        while not self._stop.is_set():
            msg = None
            try:
                with self._lock:
                    if self.book.offered() < 256:  # read ahead a little, not the whole topic
                        msg = self._consumer.poll(0.1)
                        if msg is not None and not msg.error():
                            self._add(msg)
            except Exception:  # noqa: BLE001 — a failed callback must not end the replica's share of the queue
                log.exception("polling %s failed", self.topics.tasks)
            if msg is None:
                self._stop.wait(0.05)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.check_s
                try:
                    self.sweep()
                except Exception:  # noqa: BLE001 — the thread must outlive one bad sweep; said in the log
                    log.exception("sweep of the claims failed")

    def _add(self, msg: Any) -> None:
        self._read[msg.partition()] = max(self._read.get(msg.partition(), -1), msg.offset())
        try:
            task = decode(msg.value(), "rolloutbus.Task")
            assert isinstance(task, Task)
        except (DecodeError, ValidationError, AssertionError) as exc:
            log.warning("%s[%d]@%d is not a task (skipped): %s", msg.topic(), msg.partition(), msg.offset(), exc)
            self.book.add_unreadable(msg.partition(), msg.offset())
            return
        self.book.add(msg.partition(), msg.offset(), task, now=time.time())

    def sweep(self) -> None:
        """End claims whose attempts ended through another replica (ClickHouse); time out expired ones
        (a FINISHED ``timeout`` for the attempt, then offered again while attempts are left); drop offered 1.x
        rollouts that left queuing through another replica (:attr:`settled`) and 0.3 rollouts a start_attempt or
        update_rollout took out of the queue (:attr:`settled_v03`); commit."""
        self._settle()
        with self._lock:
            claims = self.book.claims()
        if not claims:
            with self._lock:
                self._commit(self.book.partitions())
            return
        ended: dict[str, dict[str, str]] = {}
        if self.ended is not None:
            try:
                ended = self.ended(sorted({c.slot.rollout_id for c in claims}))
            except Exception as exc:  # noqa: BLE001 — an unreachable ClickHouse delays the check, no more
                log.warning("cannot read ended attempts from ClickHouse (expired claims are offered again): %s", exc)
        now = time.time()
        with self._lock:
            for c in claims:
                attempts = ended.get(c.slot.rollout_id, {})
                if c.held:
                    if any(s in SUCCESS for s in attempts.values()):
                        self.book.end(c, "succeeded")
                elif c.attempt_id in attempts:
                    self._end(c, attempts[c.attempt_id])
            for c in self.book.expired(now):
                if not c.held:
                    self._emit(self._event(c, "FINISHED", status="timeout",
                                           error=f"no terminal update_attempt within {c.deadline - c.started:g}s"))
                again = self.book.end(c, "timeout")
                log.info("claim of %s (attempt %d) timed out%s", c.slot.rollout_id, c.attempt,
                         ": offered again" if again else ": no attempts left")
            self._commit(self.book.partitions())

    def _settle(self) -> None:
        for agl1, settled in ((True, self.settled), (False, self.settled_v03)):
            if settled is None:
                continue
            with self._lock:
                offered = [s.rollout_id for s in self.book.offered_slots(agl1=agl1)]
            if not offered:
                continue
            try:
                gone = settled(offered)
            except Exception as exc:  # noqa: BLE001 — they stay offered until the next sweep (a dequeue checks again)
                log.warning("cannot read which offered rollouts left queuing: %s", exc)
                continue
            with self._lock:
                self.book.settle(gone)

    def _left_queue(self, taken: list[Claim]) -> list[Claim]:
        """Of claims just taken for a dequeue, those whose rollouts a start_attempt or update_rollout took out of the
        queue (through any replica, answered before this dequeue): put back and settled, never handed out. Called with
        the lock held; the control records' read is one round trip to Kafka. Unreadable: none (a sweep checks again)."""
        if self.settled_v03 is None or not taken:
            return []
        try:
            gone = self.settled_v03([c.slot.rollout_id for c in taken])
        except Exception as exc:  # noqa: BLE001 — handed out as before the check; the attempts read back as two
            log.warning("cannot read which rollouts left the queue before a dequeue: %s", exc)
            return []
        left = [c for c in taken if c.slot.rollout_id in gone]
        for c in reversed(left):
            self.book.untake(c)
        self.book.settle(gone)
        return left

    # ------------------------------------------------------------------ the routes' calls

    def _end(self, claim: Claim, status: str) -> None:
        self.book.end(claim, "succeeded" if status in SUCCESS else status)

    def finished(self, attempt_id: str, status: str, rollout_id: str | None = None) -> None:
        """An ``update_attempt`` (or 1.x's terminal patch, naming its rollout) that ended an attempt reached this
        replica: its claim (if ours; one an earlier owner handed out, for 1.x's attempt ids) ends."""
        with self._lock:
            claim = self.book.claim_of(attempt_id, rollout_id)
            if claim is None and rollout_id is not None:
                claim = self.book.held_claim_of(rollout_id)
            if claim is not None:
                self._end(claim, status)

    # ------------------------------------------------------------------ Agent Lightning 1.x's controllers

    def claim_agl1(self, rollout_id: str, attempt_id: str) -> Claim | None:
        """A 1.x controller moves an offered rollout to running: its claim, with the attempt id it gives its
        agent; the STARTED on its way to rb.spans before it is answered (as :meth:`dequeue`). None: this replica
        does not offer it (claimed already, ended, or in a partition another replica owns). Raises
        :class:`KafkaUnavailable` when the STARTED cannot be recorded (it stays offered)."""
        self.start()
        with self._lock:
            if not self.transport.accepting():
                raise KafkaUnavailable("Kafka is unreachable and the local spool is full: no attempt can be started")
            claim = self.book.take(None, now=time.time(), rollout_id=rollout_id, attempt_id=attempt_id, agl1=True)
            if claim is None:
                return None
            if not self._commit([claim.slot.partition]):
                self.book.untake(claim)
                raise KafkaUnavailable(f"the claim of {rollout_id} could not be committed on {self.topics.tasks}")
            if not self._record(self._event(claim, "STARTED")):
                self.book.untake(claim)
                raise KafkaUnavailable("the attempt's STARTED could not be recorded: Kafka is unreachable and the "
                                       "local queue or spool is full")
        log.info("rollout %s (attempt %s) running through Agent Lightning 1.x's controller", rollout_id, attempt_id)
        return claim

    def _event(self, claim: Claim, kind: str, **extra: Any) -> RolloutEvent:
        task = claim.slot.task
        version = task.resource_version
        current = self.resources() if self.resources is not None else None
        if version is None and current and "policy" in current:
            version = current["policy"].version
        metadata = {"agentlightning.worker_id": claim.worker_id} if claim.worker_id else {}
        # 1.x's rollout metadata (producers.ingest.agl.v1_api.task_from_create) goes on its events, as when it was created
        metadata.update({k: v for k, v in task.metadata.items() if k.startswith("agentlightning.metadata.")})
        if kind == "FINISHED":
            metadata[SPANS_UNKNOWN] = "1"
        return RolloutEvent(rollout_id=claim.slot.rollout_id, attempt_id=claim.attempt_id, event=kind, time_ns=time.time_ns(),
                            task_id=task.task_id, mode=task.mode, attempt=claim.attempt, resource_version=version,
                            metadata=metadata, **extra)

    def _emit(self, event: RolloutEvent) -> bool:
        return self.transport.emit_encoded(event.rollout_id.encode(), encode(event))

    def _record(self, event: RolloutEvent) -> bool:
        """:meth:`_emit`, False also when the transport stopped on a fatal error (it says so in its log)."""
        try:
            return self._emit(event)
        except ServiceError:
            return False

    def dequeue(self, worker_id: str | None, limit: int = 1) -> list[dict[str, Any]]:
        """Up to ``limit`` rollouts for ``worker_id`` as ``AttemptedRollout`` dicts; [] when this replica
        has none to offer. Each is committed (with its claim's mark) before it is handed out, and handed out
        only once its attempt's STARTED is on its way to rb.spans: one the transport cannot take is offered
        again, first. Raises :class:`KafkaUnavailable` when no STARTED could be recorded (the route's 503).

        Finding none while tasks this replica enqueued, in partitions it owns, are not read back yet from rb.tasks
        (the consumer's next poll), it waits for them (at most :attr:`own_enqueue_wait_s`) and looks again: an enqueue
        followed by a dequeue on the same replica hands the rollout out when the replica owns its partition, as its
        store does; one in another replica's partition is that replica's to hand out."""
        got = self._dequeue(worker_id, limit)
        if got or not self._unread_own_enqueues():
            return got
        deadline = time.monotonic() + self.own_enqueue_wait_s
        while self._unread_own_enqueues() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self._dequeue(worker_id, limit)

    def _unread_own_enqueues(self) -> bool:
        with self._lock:
            owned = set(self.book.partitions())
            for p in [p for p, offset in self._enqueued.items() if self._read.get(p, -1) >= offset]:
                del self._enqueued[p]
            return any(p in owned for p in self._enqueued)

    def _dequeue(self, worker_id: str | None, limit: int) -> list[dict[str, Any]]:
        self.start()
        now = time.time()
        with self._lock:
            if not self.transport.accepting():
                raise KafkaUnavailable("Kafka is unreachable and the local spool is full: no attempt can be started")
            taken = []
            while len(taken) < limit and (claim := self.book.take(worker_id, now=now)) is not None:
                taken.append(claim)
            while left := self._left_queue(taken):  # settled: take others in their place
                taken = [c for c in taken if c not in left]
                while len(taken) < limit and (claim := self.book.take(worker_id, now=now)) is not None:
                    taken.append(claim)
            if not taken:
                return []
            if not self._commit(sorted({c.slot.partition for c in taken})):
                for c in reversed(taken):
                    self.book.untake(c)
                return []
            started, unrecorded = [], []
            for c in taken:
                (started if self._record(self._event(c, "STARTED")) else unrecorded).append(c)
            for c in reversed(unrecorded):
                self.book.untake(c)  # its commit's mark holds it a claim's time at most, should this replica stop
        if unrecorded:
            log.warning("%d rollouts not handed out: their STARTED could not be recorded (transport full or stopped)",
                        len(unrecorded))
            if not started:
                raise KafkaUnavailable("the attempt's STARTED could not be recorded: Kafka is unreachable and the "
                                       "local queue or spool is full")
        taken = started
        for c in taken:
            log.info("rollout %s attempt %d (%s) handed to worker %s", c.slot.rollout_id, c.attempt, c.attempt_id, worker_id)
        return [attempted_rollout(c.slot.task, c.slot.rollout_id, attempt_id=c.attempt_id, attempt=c.attempt,
                                  worker_id=c.worker_id, now=now) for c in taken]

    def enqueue(self, requests: Sequence[Mapping[str, Any]], resources_id: str | None) -> list[dict[str, Any]]:
        """Each request → a task record on rb.tasks (keyed by its rollout id), delivered before the reply."""
        replies, tasks = [], []
        now = time.time_ns()
        for req in requests:
            rid = new_rollout_id()
            task = task_from_request(req, rollout_id=rid, resources_id=req.get("resources_id") or resources_id, now_ns=now,
                                     defaults=self.book.defaults())
            tasks.append((rid, task))
            replies.append(rollout_reply(task, rid))
        self.publish(tasks)
        return replies

    def publish(self, tasks: Sequence[tuple[str, Task]]) -> None:
        """(rollout id, task) records onto rb.tasks, keyed by the rollout id; raises :class:`KafkaUnavailable`
        unless every one is delivered."""
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({**self.kafka_conf, "enable.idempotence": True, "log_level": 0})
        failed: list[Any] = []
        delivered: list[tuple[int, int]] = []
        for rid, task in tasks:
            self._producer.produce(self.topics.tasks, encode(task), rid.encode(),
                                   on_delivery=lambda err, msg: failed.append(err) if err else
                                   delivered.append((msg.partition(), msg.offset())))
        left = self._producer.flush(30)
        with self._lock:
            for p, offset in delivered:
                self._enqueued[p] = max(self._enqueued.get(p, -1), offset)
        if left or failed:
            raise KafkaUnavailable(f"{left or len(failed)} rollouts not delivered to {self.topics.tasks}: "
                                   f"{failed[0] if failed else 'timed out'}")


class ClickHouseReader:
    """A read-only ClickHouse client made on first use (a gateway nobody asks never connects), one query at
    a time (a client's session takes one), made again after a failure."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._client: Any = None
        self._lock = threading.Lock()

    def query(self, sql: str, parameters: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            try:
                return list(self._client.query(sql, parameters=parameters).result_rows)
            except Exception:
                self._client = None
                raise


def clickhouse_ended(reader: ClickHouseReader) -> Ended:
    """:data:`Ended` read from ClickHouse's ``rollouts`` (one row per ended attempt)."""

    def ended(rollout_ids: Sequence[str]) -> dict[str, dict[str, str]]:
        rows = reader.query("SELECT rollout_id, attempt_id, status FROM rollouts FINAL WHERE rollout_id IN {ids:Array(String)}",
                            {"ids": list(rollout_ids)})
        out: dict[str, dict[str, str]] = {}
        for rid, aid, status in rows:
            out.setdefault(rid, {})[aid] = status
        return out

    return ended


__all__ = ["TaskQueue", "ClickHouseReader", "clickhouse_ended"]
