"""Guards against three faust/aiokafka behaviours that lose or stall records after a crash or a rebalance,
and one that crash-loops the worker on a record too large to send.

Patches of a library belong here and nowhere else. :func:`install` refuses to patch a faust-streaming or
aiokafka version these guards were not checked against (an upgrade must re-read the four code paths
below, re-run the fault suite, and then add the version to ``CHECKED``), and checks that the patched
functions still exist with the names and arguments the patches assume.
"""

from __future__ import annotations

import inspect
import logging
from collections import defaultdict
from typing import Any

log = logging.getLogger(__name__)

# (faust-streaming, aiokafka) versions whose Consumer._new_offset, Consumer._drain_messages,
# AIOKafkaConsumerThread.seek_to_committed and ProducerBuffer._send_pending were read and the fault suite
# (tests/faults) passed with these guards installed.
CHECKED: set[tuple[str, str]] = {("0.15.3", "0.14.0")}


class FaustGuardError(RuntimeError):
    """faust or aiokafka changed under the guards: see this module's docstring."""


# Two faust/aiokafka behaviours lose records after a crash or a rebalance; the SIGKILL test shows both
# (and a third, (3) below, that stalls them). (1) faust's Consumer._new_offset commits past the longest
# run of acked offsets and checks for an unacked head only when the partition has a (truthy) committed
# offset, and even then lets one unacked offset through. (2) faust fetches while it recovers its
# tables, drops what it fetched when it suspends the flow, and rewinds with aiokafka's
# seek_to_committed — which seeks only partitions with a committed offset above 0: a partition with no
# commit yet stays where the fetcher got to, and the records fetched (and dropped) are never processed
# by anyone.
#
# So, for the topics whose records must each be processed (STRICT_TOPICS): after faust's rewind we
# seek partitions with no commit to their beginning (what auto_offset_reset=earliest reads) and note
# where this assignment starts (START: the committed offset, else the earliest one). A commit is held
# back while the lowest acked offset is above that floor. The worker keeps a frontier per partition
# (FRONTIER: the next offset it must process) and, when records arrive past it, seeks back to it
# instead of skipping them (streams.frontier.Frontier.admit).
#
# A compacted topic has gaps in its offsets, so the frontier cannot hold it; its records are few and
# its table deduplicates. For those (REPLAY_TOPICS) every assignment reads the partition again from its
# beginning, whatever was committed: a record skipped by (1) or (2) is read on the next assignment.
#
# (3) faust's Consumer._drain_messages drops every fetched record below its read offset, and sets that
# offset after handing each record to its stream — over the offset a seek has just set (the seek runs
# in the consumer's thread, the hand-over goes on meanwhile). The records the worker's seek back to its
# frontier fetches again then fall below it and are dropped before the agent sees them; with nothing new
# arriving, the partition stands still (tests/faults/test_crash.py: rb.metrics after a restart, because
# faust hands over records while it is still seeking to the committed offsets, before the frontier is
# known). For STRICT_TOPICS the frontier already tells a record read again (below it) from one fetched
# before a seek (past it), so their read offset reads as None: every fetched record reaches the agent.
# That also keeps faust's gap bookkeeping (Consumer._add_gap, counted as acked) off these partitions.
# A STRICT_TOPICS partition whose committed offset lies past its end (the topic deleted and created again
# while the broker kept the group's offsets: a reset) is read from its beginning, as one with no commit is;
# else the frontier would take every record of the new topic for one already processed.
STRICT_TOPICS: set[str] = set()
REPLAY_TOPICS: set[str] = set()
START: dict[tuple[str, int], int] = {}
FRONTIER: dict[tuple[str, int], int] = {}


def _patch_faust_commit_floor() -> None:
    from faust.transport import consumer as faust_consumer

    original = faust_consumer.Consumer._new_offset
    if getattr(original, "_rolloutbus_floor", False):
        return

    def _new_offset(self: Any, tp: Any) -> Any:
        acked = self._acked[tp]
        if acked and tp.topic in STRICT_TOPICS:
            committed = self._committed_offset[tp]
            floor = committed if committed is not None else START.get((tp.topic, tp.partition))
            if floor is None or min(acked) > floor:
                return None
        return original(self, tp)

    _new_offset._rolloutbus_floor = True  # type: ignore[attr-defined]
    faust_consumer.Consumer._new_offset = _new_offset


class _ReadOffsets(defaultdict):  # type: ignore[type-arg]
    """faust's read offsets per partition, except that a STRICT_TOPICS partition has none (see (3))."""

    def __getitem__(self, tp: Any) -> Any:
        if tp.topic in STRICT_TOPICS:
            return None
        return super().__getitem__(tp)


def _patch_faust_strict_read_offsets() -> None:
    from faust.transport import consumer as faust_consumer

    original = faust_consumer.Consumer._drain_messages
    if getattr(original, "_rolloutbus_read_offsets", False):
        return

    async def _drain_messages(self: Any, fetcher: Any) -> None:
        # _drain_messages binds self._read_offset.__getitem__ as it starts: swap the mapping in first, once,
        # before faust's first fetch (the same entries; faust's seeks look the attribute up and write to it).
        if not isinstance(self._read_offset, _ReadOffsets):
            self._read_offset = _ReadOffsets(lambda: None, self._read_offset)
        await original(self, fetcher)

    _drain_messages._rolloutbus_read_offsets = True  # type: ignore[attr-defined]
    faust_consumer.Consumer._drain_messages = _drain_messages


def _patch_faust_seek_uncommitted() -> None:
    from faust.transport.drivers import aiokafka as faust_aiokafka

    cls = faust_aiokafka.AIOKafkaConsumerThread
    if getattr(cls.seek_to_committed, "_rolloutbus_rewind", False):
        return

    async def seek_to_committed(self: Any) -> Any:
        consumer = self._ensure_consumer()

        async def seek() -> tuple[Any, Any]:
            offsets = await consumer.seek_to_committed()
            rewind = [tp for tp, off in offsets.items() if tp.topic in STRICT_TOPICS and not off]
            held = [tp for tp, off in offsets.items() if tp.topic in STRICT_TOPICS and off]
            try:
                ends = await consumer.end_offsets(held) if held else {}
            except Exception as exc:  # noqa: BLE001 - the broker busy (a restart): the commits are taken as they are
                log.warning("end offsets of %s could not be read (%s): resuming from the commits", sorted(held), exc)
                ends = {}
            past = [tp for tp in held if offsets[tp] > ends.get(tp, offsets[tp])]
            if past:  # an earlier topic's offsets (the topic was created again): this one is read from its start
                log.warning("committed offsets past the end of %s (the topics were created again): reading them "
                            "from the beginning", sorted((tp, offsets[tp], ends[tp]) for tp in past))
                rewind += past
                offsets = {**offsets, **{tp: 0 for tp in past}}
            earliest = {}
            if rewind:
                await consumer.seek_to_beginning(*rewind)
                earliest = await consumer.beginning_offsets(rewind)
            replay = [tp for tp in offsets if tp.topic in REPLAY_TOPICS]
            if replay:
                await consumer.seek_to_beginning(*replay)
                # faust drops what arrives below the offset returned here: none for these.
                offsets = {**offsets, **{tp: 0 for tp in replay}}
            return offsets, earliest

        offsets, earliest = await self.call_thread(seek)
        for tp, off in offsets.items():
            if tp.topic in STRICT_TOPICS:
                START[(tp.topic, tp.partition)] = FRONTIER[(tp.topic, tp.partition)] = off if off else earliest.get(tp, 0)
        if earliest:
            log.info("no committed offset for %s: reading them from the beginning", sorted(earliest))
        return offsets

    seek_to_committed._rolloutbus_rewind = True  # type: ignore[attr-defined]
    cls.seek_to_committed = seek_to_committed


# (4) faust sends what send_soon queued from one task (ProducerBuffer._handle_pending), and a send that
# raises at once ends that task, and the app with it. aiokafka raises MessageSizeTooLargeError at once for a
# record over producer_max_request_size (faust's driver raises it as the cause of a ProducerSendError): a
# group's batch that large (many long rollouts) crashed the worker, and it crashed again after every restart,
# when the group was emitted again. aiokafka's error goes to the send's future instead, as the broker's own
# refusal of a record would; whoever awaits it decides (streams.app logs the record as refused for good: the
# group is stored in ClickHouse, not trained). Any other failure of a send still ends the task, as before.
def _patch_faust_send_too_large() -> None:
    from aiokafka.errors import MessageSizeTooLargeError
    from faust.exceptions import ProducerSendError
    from faust.transport import producer as faust_producer

    original = faust_producer.ProducerBuffer._send_pending
    if getattr(original, "_rolloutbus_too_large", False):
        return

    async def _send_pending(self: Any, fut: Any) -> None:
        try:
            await original(self, fut)
        except (ProducerSendError, MessageSizeTooLargeError) as exc:
            refusal = exc if isinstance(exc, MessageSizeTooLargeError) else exc.__cause__
            if not isinstance(refusal, MessageSizeTooLargeError):
                raise
            if not fut.done():
                fut.set_exception(refusal)

    _send_pending._rolloutbus_too_large = True  # type: ignore[attr-defined]
    faust_producer.ProducerBuffer._send_pending = _send_pending


def check_versions() -> None:
    """Raise :class:`FaustGuardError` unless the installed faust and aiokafka are ones the guards were checked against."""
    import aiokafka
    import faust
    from faust.transport import consumer as faust_consumer
    from faust.transport import producer as faust_producer
    from faust.transport.drivers import aiokafka as faust_aiokafka

    installed = (str(faust.__version__), str(aiokafka.__version__))
    if installed not in CHECKED:
        raise FaustGuardError(
            f"faust-streaming {installed[0]} / aiokafka {installed[1]} are not the versions streams/faust_guards.py was "
            f"checked against ({', '.join(f'{f} / {a}' for f, a in sorted(CHECKED))}): re-read Consumer._new_offset, "
            "Consumer._drain_messages, AIOKafkaConsumerThread.seek_to_committed and ProducerBuffer._send_pending, run tests/faults, then add the pair to CHECKED"
        )
    for owner, name, params in ((faust_consumer.Consumer, "_new_offset", ["self", "tp"]),
                                (faust_consumer.Consumer, "_drain_messages", ["self", "fetcher"]),
                                (faust_aiokafka.AIOKafkaConsumerThread, "seek_to_committed", ["self"]),
                                (faust_producer.ProducerBuffer, "_send_pending", ["self", "fut"])):
        fn = getattr(owner, name, None)
        if fn is None or list(inspect.signature(fn).parameters) != params:
            raise FaustGuardError(f"{owner.__qualname__}.{name} is gone or changed its arguments: the guard on it no longer applies")
    drain = faust_consumer.Consumer._drain_messages
    if not getattr(drain, "_rolloutbus_read_offsets", False) and "self._read_offset.__getitem__" not in inspect.getsource(drain):
        raise FaustGuardError("Consumer._drain_messages no longer reads self._read_offset.__getitem__: the read-offset guard no longer applies")


def install() -> None:
    """Check the versions, then patch (idempotent)."""
    check_versions()
    _patch_faust_commit_floor()
    _patch_faust_strict_read_offsets()
    _patch_faust_seek_uncommitted()
    _patch_faust_send_too_large()


__all__ = ["CHECKED", "FRONTIER", "REPLAY_TOPICS", "START", "STRICT_TOPICS", "FaustGuardError", "check_versions", "install"]
