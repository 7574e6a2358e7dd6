"""Admission of the faust agents' records: each partition's frontier, and reading again what faust skipped.

Offsets of the STRICT_TOPICS (the done topic, rb.metrics, rb.dlq) are contiguous (no compaction, no
transactions), so a record arriving past a partition's frontier (``FRONTIER``: the next offset the
worker must process) means faust skipped some: the worker seeks back to the frontier instead of going on.
The faust guards (:mod:`streams.faust_guards`) set where each assignment starts and keep faust from
dropping what the seek fetches again; this module decides, record by record, on the event loop.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prometheus_client import Counter

from streams.faust_guards import FRONTIER, START

log = logging.getLogger("rolloutbus.streams")

REREADS = Counter("rolloutbus_streams_rereads_total", "Partitions sought back to their frontier", ["reason"])


class Frontier:
    """Per partition of the faust consumer (``app.consumer``): admit, re-read, forget on revoke."""

    def __init__(self, app: Any, gap_accept_s: float = 2.0) -> None:
        self.app = app
        # Records past a partition's frontier this long after seeking back to it: ask the broker whether the
        # records at the frontier are still there (read again) or gone by retention (go on).
        self.gap_accept_s = gap_accept_s
        self._seeks: dict[tuple[str, int], tuple[int, float]] = {}  # partition → (frontier sought to, when)
        self._last_in: dict[tuple[str, int], float] = {}
        self.stats = {"rereads": 0, "dropped": 0, "redelivered": 0}

    async def admit(self, msg: Any) -> str:
        """``process``, ``duplicate`` (below the frontier) or ``drop`` (past it: seek back to it).

        Offsets of rb.spans and the done topic are contiguous (no compaction, no transactions); records
        arriving past the frontier mean faust skipped some. We seek back and drop what arrives past the
        frontier for ``gap_accept_s`` (stale buffered records). Past that, the broker decides: records
        it still has at the frontier are read again (a busy worker can take longer than that to drain
        what faust buffered before the seek); only a range that retention deleted is passed over."""
        key = (msg.topic, msg.partition)
        now = time.monotonic()
        self._last_in[key] = now
        expected = FRONTIER.get(key)
        offset = msg.offset
        if expected is None:  # before this assignment's start is known; faust re-delivers after its seek
            return "process"
        if offset == expected:
            FRONTIER[key] = offset + 1
            return "process"
        if offset < expected:
            self.stats["redelivered"] += 1
            return "duplicate"
        seek = self._seeks.get(key)
        if seek is None or seek[0] != expected:
            log.warning("%s[%d]: offsets %d..%d were not delivered; reading again from %d",
                        msg.topic, msg.partition, expected, offset - 1, expected)
            self._seeks[key] = (expected, now)
            await self._seek(msg.tp, expected, "gap")
            return "drop"
        if now - seek[1] < self.gap_accept_s:
            self.stats["dropped"] += 1
            return "drop"
        earliest = (await self.app.consumer.earliest_offsets(msg.tp)).get(msg.tp)
        if earliest is not None and earliest > expected:
            log.warning("%s[%d]: offsets %d..%d are no longer on the broker (retention); going on from %d",
                        msg.topic, msg.partition, expected, earliest - 1, earliest)
            FRONTIER[key] = earliest
            return await self.admit(msg)
        log.warning("%s[%d]: offsets from %d still not delivered; reading again from %d", msg.topic, msg.partition,
                    expected, expected)
        self._seeks[key] = (expected, now)
        await self._seek(msg.tp, expected, "gap")
        self.stats["dropped"] += 1
        return "drop"

    async def reread_missing_tails(self) -> None:
        """Seek back a partition whose records past the frontier never arrived (nothing later came to
        show the gap): quiet for a while with the high watermark above the frontier."""
        now = time.monotonic()
        for tp in list(self.app.consumer.assignment()):
            key = (tp.topic, tp.partition)
            expected = FRONTIER.get(key)
            if expected is None:
                continue
            try:
                hw = self.app.consumer.highwater(tp)
            except Exception:  # noqa: BLE001 - not known yet
                continue
            quiet = now - max(self._last_in.get(key, 0.0), self._seeks.get(key, (0, 0.0))[1])
            if hw is not None and hw > expected and quiet >= self.gap_accept_s * 5:
                log.info("%s[%d]: high watermark %d but nothing past %d arrived; reading again from %d",
                         tp.topic, tp.partition, hw, expected - 1, expected)
                self._seeks[key] = (expected, now)
                await self._seek(tp, expected, "tail")

    def forget(self, tp: Any) -> None:
        """A revoked partition: its next assignment starts afresh."""
        for d in (START, FRONTIER, self._seeks, self._last_in):
            d.pop((tp.topic, tp.partition), None)

    async def _seek(self, tp: Any, offset: int, reason: str) -> None:
        self.stats["rereads"] += 1
        REREADS.labels(reason).inc()
        # In the consumer's own thread (faust's seek() touches aiokafka's fetcher from this one, which
        # races with a fetch in flight and crashes the fetcher).
        await self.app.consumer.seek_wait({tp: offset})


__all__ = ["Frontier", "REREADS"]
