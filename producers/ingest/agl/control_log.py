"""Agent Lightning's control-plane records on one Kafka partition (``{prefix}agl-control``), replayed by every
gateway replica into a :class:`producers.ingest.agl.control.ControlState`.

A write is a record produced (idempotent producer, acks=all) and delivered; the writer then waits until its own
consumer has applied every record up to that one, and answers with what applying it gave (the same on every
replica: one partition, one order). A read first asks the broker for the partition's end (a round trip) and
waits until it applied that far, so it sees every write answered before it began, through any replica
(linearizable reads). A replica that starts, or restarts after a crash, replays the partition from its start:
the topic keeps its records for ever (``retention.ms=-1``); deleting a rollout is a record too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from foundation.errors import KafkaUnavailable
from producers.ingest.agl.control import ControlState, Result

log = logging.getLogger(__name__)



def control_topic(prefix: str) -> str:
    """The control partition's topic under a topic prefix (``rb.agl-control``)."""
    return f"{prefix}agl-control"


WAIT_S = 10.0  # how long a call waits for the replica to apply the log that far before it answers 503


class ControlLog:
    """The control partition of one gateway replica: its consumer thread (started on the first call), its producer."""

    def __init__(self, kafka_conf: dict[str, Any], topic: str, *, replication: int = -1) -> None:
        """``replication``: the topic's replication factor when this replica creates it (-1: the broker's default)."""
        self.kafka_conf, self.topic, self.replication = kafka_conf, topic, replication
        self.state = ControlState()
        self._lock = threading.Condition()
        self._applied = 0  # the next offset to apply
        self._results: OrderedDict[int, Result] = OrderedDict()  # recent offsets' answers, for their writers
        self._producer: Any = None
        self._consumer: Any = None
        self._ends: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._start_lock = threading.Lock()

    # ------------------------------------------------------------------ life

    def start(self) -> ControlLog:
        with self._start_lock:
            if self._thread is not None:
                return self
            from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

            self._ensure_topic()
            self._producer = Producer({**self.kafka_conf, "enable.idempotence": True, "acks": "all", "linger.ms": 0,
                                       "log_level": 0})
            # No group: every replica reads the whole partition; a short fetch wait keeps a write's answer quick.
            self._consumer = Consumer({**self.kafka_conf, "group.id": f"rb-agl-control-{uuid.uuid4().hex[:8]}",
                                       "enable.auto.commit": False, "fetch.wait.max.ms": 5, "log_level": 0})
            self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            # The end of the partition is asked on a handle of its own: asked on the polling one, it waits for the poll.
            self._ends = Consumer({**self.kafka_conf, "group.id": f"rb-agl-control-{uuid.uuid4().hex[:8]}", "log_level": 0})
            self._thread = threading.Thread(target=self._run, name="agl-control", daemon=True)
            self._thread.start()
        return self

    def _ensure_topic(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        from confluent_kafka import KafkaException

        admin = AdminClient(self.kafka_conf)
        try:
            if self.topic in admin.list_topics(timeout=10).topics:
                return
        except KafkaException as exc:
            raise KafkaUnavailable(f"cannot list the topics to find {self.topic}: {exc}") from exc
        futures = admin.create_topics([NewTopic(self.topic, num_partitions=1, replication_factor=self.replication,
                                                config={"retention.ms": "-1", "cleanup.policy": "delete"})])
        try:
            futures[self.topic].result(15)
            log.info("created %s (Agent Lightning's control records, one partition, kept for ever)", self.topic)
        except Exception as exc:  # noqa: BLE001 — another replica may have made it first
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise KafkaUnavailable(f"cannot create {self.topic}: {exc}") from exc

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._consumer is not None:
            self._consumer.close()
            self._ends.close()
        if self._producer is not None:
            self._producer.flush(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._consumer.poll(0.05)
            except Exception:  # noqa: BLE001 — the thread must outlive a bad poll; said in the log
                log.exception("polling %s failed", self.topic)
                time.sleep(0.5)
                continue
            if msg is None or msg.error():
                continue
            with self._lock:
                try:
                    result = self.state.apply(json.loads(msg.value()))
                except Exception as exc:  # noqa: BLE001 — one bad record must not stop the replica's control plane
                    log.warning("%s@%d not applied: %s", self.topic, msg.offset(), exc)
                    result = (400, {"detail": f"control record not applied: {exc}"})
                self._results[msg.offset()] = result
                while len(self._results) > 4096:
                    self._results.popitem(last=False)
                self._applied = msg.offset() + 1
                self._lock.notify_all()

    def _wait_applied(self, offset: int) -> None:
        """Until the records below ``offset`` are applied (under the lock); KafkaUnavailable after :data:`WAIT_S`."""
        deadline = time.monotonic() + WAIT_S
        while self._applied < offset:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KafkaUnavailable(f"{self.topic} not read to offset {offset} within {WAIT_S:g}s")
            self._lock.wait(left)

    # ------------------------------------------------------------------ the calls

    def write(self, record: Mapping[str, Any]) -> Result:
        """Record ``record`` and answer with what applying it gave; :class:`KafkaUnavailable` when Kafka did not
        take it or this replica could not read it back in time."""
        self.start()
        delivered: list[Any] = []
        from confluent_kafka import KafkaException

        try:
            self._producer.produce(self.topic, json.dumps(record, separators=(",", ":")).encode(), partition=0,
                                   on_delivery=lambda err, msg: delivered.append((err, msg)))
        except (KafkaException, BufferError) as exc:  # too large a record, a full local queue
            raise KafkaUnavailable(f"a control record was not taken for {self.topic}: {exc}") from exc
        self._producer.flush(30)
        if not delivered or delivered[0][0] is not None:
            raise KafkaUnavailable(f"a control record was not delivered to {self.topic}: "
                                   f"{delivered[0][0] if delivered else 'timed out'}")
        offset = delivered[0][1].offset()
        with self._lock:
            self._wait_applied(offset + 1)
            return self._results.get(offset, (503, {"detail": "the answer of this write is no longer known; read it back"}))

    def peek(self, fn: Callable[[ControlState], Any]) -> Any:
        """``fn(state)`` as this replica applied it so far: no round trip, never waits for Kafka (the state is empty
        before the first call started the replica's reader), possibly behind the partition, never ahead."""
        with self._lock:
            return fn(self.state)

    def read(self, fn: Callable[[ControlState], Any]) -> Any:
        """``fn(state)`` once every record written before this call is applied."""
        from confluent_kafka import KafkaException, TopicPartition

        self.start()
        try:
            _low, high = self._ends.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=5, cached=False)
        except KafkaException as exc:
            raise KafkaUnavailable(f"cannot read the end of {self.topic}: {exc}") from exc
        with self._lock:
            self._wait_applied(high)
            return fn(self.state)


__all__ = ["ControlLog", "WAIT_S", "control_topic"]
