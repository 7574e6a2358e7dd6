"""Reading the compacted ``rb.resources`` topic: the latest version per resource name.

The trainer reads it once at start (so it never reuses a version number); the inference server
follows it for as long as it runs (so it hot-reloads new weights). Both read from the beginning of
the topic without a consumer group: a compacted topic *is* the state.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from foundation.errors import DecodeError, KafkaUnavailable, ValidationError
from schemas.codec import decode
from schemas.models import ResourceVersion

log = logging.getLogger(__name__)
RESOURCE_VERSION = "rolloutbus.ResourceVersion"


def _consumer(conf: dict[str, Any]) -> Consumer:
    return Consumer(
        {
            **conf,
            "group.id": f"rolloutbus-resources-{uuid.uuid4().hex[:8]}",  # never committed; just required
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )


def _partitions(consumer: Consumer, topic: str, timeout: float) -> list[int]:
    try:
        md = consumer.list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot read topic {topic}: {exc}") from exc
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        raise KafkaUnavailable(f"topic {topic} does not exist; create it with `rolloutbus up`")
    return sorted(t.partitions)


def _parse(value: bytes | None) -> ResourceVersion | None:
    if value is None:  # a tombstone
        return None
    try:
        rec = decode(value, expect=RESOURCE_VERSION)
    except (DecodeError, ValidationError) as exc:
        log.warning("skipping an unreadable record on the resources topic: %s", exc)
        return None
    return rec if isinstance(rec, ResourceVersion) else None


def read_latest(conf: dict[str, Any], topic: str, timeout: float = 30.0) -> dict[str, ResourceVersion]:
    """Resource name → the record with the highest version on ``topic`` (read to the end, then stop)."""
    consumer = _consumer(conf)
    latest: dict[str, ResourceVersion] = {}
    try:
        parts = _partitions(consumer, topic, timeout)
        ends: dict[int, int] = {}
        assign = []
        for p in parts:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if hi > lo:
                ends[p] = hi
                assign.append(TopicPartition(topic, p, OFFSET_BEGINNING))
        if not assign:
            return latest
        consumer.assign(assign)
        import time

        deadline = time.monotonic() + timeout
        while ends and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            rec = _parse(msg.value())
            if rec is not None and (rec.name not in latest or rec.version > latest[rec.name].version):
                latest[rec.name] = rec
            if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                ends.pop(msg.partition(), None)
        if ends:
            raise KafkaUnavailable(f"timed out reading {topic} to its end after {timeout}s")
        return latest
    finally:
        consumer.close()


class ResourceFollower:
    """Calls ``on_version(record)`` from a background thread for each newer version of ``name``."""

    def __init__(
        self, conf: dict[str, Any], topic: str, name: str, on_version: Callable[[ResourceVersion], None], poll_s: float = 0.5
    ) -> None:
        self.conf, self.topic, self.name, self.on_version, self.poll_s = conf, topic, name, on_version, poll_s
        self.latest: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"follow-{topic}", daemon=True)

    def start(self) -> "ResourceFollower":
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        consumer = _consumer(self.conf)
        try:
            while not self._stop.is_set():
                try:
                    parts = _partitions(consumer, self.topic, 10.0)
                    break
                except KafkaUnavailable as exc:
                    log.warning("%s; retrying", exc)
                    self._stop.wait(2.0)
            else:
                return
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
            while not self._stop.is_set():
                msg = consumer.poll(self.poll_s)
                if msg is None or msg.error():
                    continue
                rec = _parse(msg.value())
                if rec is None or rec.name != self.name or (self.latest is not None and rec.version <= self.latest):
                    continue
                try:
                    self.on_version(rec)
                    self.latest = rec.version
                except Exception:  # a bad checkpoint must not kill the follower: keep serving the old one
                    log.exception("could not switch to %s version %s (uri %s)", rec.name, rec.version, rec.uri)
        finally:
            consumer.close()


__all__ = ["ResourceFollower", "read_latest"]
