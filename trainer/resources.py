"""Reading the compacted ``rb.resources`` topic: the latest version per resource name.

The trainer reads it once at start (so it never reuses a version number); the inference server
follows it for as long as it runs (so it hot-reloads new weights). Both read from the beginning of
the topic without a consumer group: a compacted topic *is* the state.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import uuid
from pathlib import Path
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from foundation.errors import DecodeError, KafkaNotAuthorized, KafkaUnavailable, ServiceError, ValidationError
from foundation.kafka_admin import AUTHENTICATION_CODES, AUTHORIZATION_CODES, kafka_failure
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


def _partitions(consumer: Consumer, conf: dict[str, Any], topic: str, timeout: float) -> list[int]:
    try:
        md = consumer.list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise kafka_failure(conf, exc, f"describe topic {topic}") from exc
    t = md.topics.get(topic)
    if t is not None and t.error is not None and t.error.code() in AUTHORIZATION_CODES:
        raise kafka_failure(conf, t.error, f"describe topic {topic}")
    if t is None or t.error is not None or not t.partitions:
        raise KafkaUnavailable(f"topic {topic} does not exist; create it with `rolloutbus up`")
    return sorted(t.partitions)


def _fatal(err: Any) -> bool:
    """An error no retry can mend: an ACL refusal, a refused login, or librdkafka's own fatal flag."""
    return bool(err.fatal()) or err.code() in AUTHORIZATION_CODES | AUTHENTICATION_CODES


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
        parts = _partitions(consumer, conf, topic, timeout)
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
            if msg is not None and msg.error() and _fatal(msg.error()):
                raise kafka_failure(conf, msg.error(), f"read topic {topic}")
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
    """Calls ``on_version(record)`` from a background thread for each newer version of ``name``.

    A fatal Kafka error (an ACL refusal, a refused login) ends the thread: it is kept in ``error``, handed
    to ``on_fatal`` (by default: interrupt the main thread, as Ctrl-C would) and raised again by ``stop()``,
    so an owner that stops the follower in a ``finally`` ends with that one line. Other errors are retried.
    A version whose checkpoint cannot be loaded (pruned, missing) is one warning; the old one keeps serving.
    ``lag`` N follows the version N behind the newest (after a replay: the newest, then trailing by N as versions
    come): what the staleness bench uses to make every batch at least N versions old.
    """

    def __init__(
        self, conf: dict[str, Any], topic: str, name: str, on_version: Callable[[ResourceVersion], None], poll_s: float = 0.5,
        on_fatal: Callable[[ServiceError], None] | None = None, lag: int = 0,
    ) -> None:
        self.conf, self.topic, self.name, self.on_version, self.poll_s = conf, topic, name, on_version, poll_s
        self.lag = lag  # follow the version this many behind the newest (the staleness bench; 0: the newest)
        self.on_fatal = on_fatal
        self.error: ServiceError | None = None
        self.latest: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"follow-{topic}", daemon=True)

    def start(self) -> "ResourceFollower":
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop following; raises the fatal Kafka error that ended the thread, if one did."""
        self._stop.set()
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            self._follow()
        except KafkaNotAuthorized as exc:
            self.error = exc
            log.error("%s", exc)
            if self.on_fatal is not None:
                self.on_fatal(exc)
            else:  # a real signal (not _thread.interrupt_main) also wakes a main thread blocked in an event loop
                os.kill(os.getpid(), signal.SIGINT)

    def _follow(self) -> None:
        consumer = _consumer(self.conf)
        try:
            while not self._stop.is_set():
                try:
                    parts = _partitions(consumer, self.conf, self.topic, 10.0)
                    break
                except KafkaUnavailable as exc:
                    log.warning("%s; retrying", exc)
                    self._stop.wait(2.0)
            else:
                return
            # Read to the end first and load only the newest version: on a restart the topic replays old
            # versions (compaction is lazy) whose checkpoints were pruned long ago.
            ends = self._ends(consumer, parts)
            if ends is None:
                return
            pending: ResourceVersion | None = None
            window: list[ResourceVersion] = []  # the newest lag + 1 versions seen since the replay
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
            while not self._stop.is_set():
                msg = consumer.poll(self.poll_s)
                if msg is not None and msg.error() and _fatal(msg.error()):
                    raise kafka_failure(self.conf, msg.error(), f"read topic {self.topic}")
                if msg is None or msg.error():
                    continue
                if ends and msg.offset() + 1 >= ends.get(msg.partition(), 0):
                    ends.pop(msg.partition(), None)
                rec = _parse(msg.value())
                if rec is not None and rec.name == self.name and (pending is None or rec.version > pending.version):
                    pending = rec
                if ends or pending is None:
                    continue
                window = [*window, pending][-(self.lag + 1):]
                rec, pending = window[0], None  # the newest, or with a lag N the one N behind it
                if self.latest is None or rec.version > self.latest:
                    self._switch(rec)
        finally:
            consumer.close()

    def _ends(self, consumer: Consumer, parts: list[int]) -> dict[int, int] | None:
        """Each non-empty partition's end offset; None when stopped first. A topic just created has no leader
        for a moment (NOT_LEADER_FOR_PARTITION): that is retried, not the end of the follower."""
        while not self._stop.is_set():
            try:
                return {p: hi for p in parts
                        for lo, hi in [consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10.0)] if hi > lo}
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if err is not None and _fatal(err):
                    raise kafka_failure(self.conf, err, f"read topic {self.topic}") from exc
                log.warning("reading the end of %s: %s; retrying", self.topic, exc)
                self._stop.wait(1.0)
        return None

    def _switch(self, rec: ResourceVersion) -> None:
        if "://" not in rec.uri and not Path(rec.uri).exists():
            log.warning("skipping %s version %s: its checkpoint %s is gone (pruned?)", rec.name, rec.version, rec.uri)
            return
        try:
            self.on_version(rec)
            self.latest = rec.version
        except Exception:  # a bad checkpoint must not kill the follower: keep serving the old one
            log.exception("could not switch to %s version %s (uri %s)", rec.name, rec.version, rec.uri)


__all__ = ["ResourceFollower", "read_latest"]
