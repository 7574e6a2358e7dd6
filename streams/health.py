"""What ``/readyz`` of the stream worker means: connected to Kafka and ClickHouse, and making progress.

The worker's span-stage loop reports here (:class:`StreamHealth`); :func:`foundation.health.serve_health`
serves the verdict with ``/healthz`` and ``/metrics`` on the worker's metrics port. Ready when:

* kafka — the span stage holds at least one partition of the spans topic, and its last commit point
  delivered what it produced, with no offset commit refused or left unanswered for 5 s (a worker with
  no partition, more workers than partitions, is not ready: it does no work);
* clickhouse — the last insert succeeded or, with no rows to write, the server answered a ping within
  ``PING_EVERY_S``;
* progress — records read from the spans topic were written and committed within ``stall_s``, or
  nothing is waiting to be read.
"""

from __future__ import annotations

import time
from prometheus_client import Gauge

from foundation.errors import ClickHouseError, KafkaUnavailable
from foundation.health import Readiness

LAST_PROGRESS = Gauge("rolloutbus_streams_last_progress_timestamp_seconds",
                      "Unix time the worker last wrote and committed records it read from the spans topic")
PING_EVERY_S = 10.0  # with no rows to write, how often ClickHouse is asked whether it answers


class StreamHealth(Readiness):
    """Readiness of one stream worker, updated by its span-stage loop (one thread); read by the probes."""

    def __init__(self, stall_s: float = 120.0) -> None:
        super().__init__(input_name="the spans topic", stall_s=stall_s)
        self._consumed = False
        self._last_contact = time.monotonic()  # connected at start: the migrations ran

    # -------------------------------------------------------------- what the loop reports

    def polled(self, records: int) -> None:
        if records:
            self._consumed = True

    def commit_ok(self, now: float | None = None) -> None:
        """A commit point wrote, delivered and committed everything read before it."""
        self.clear("kafka")
        if self._consumed:
            self._consumed = False
            self.progress(now)

    def commit_failed(self, exc: BaseException) -> None:
        if isinstance(exc, KafkaUnavailable):
            self.problem("kafka", "commit or delivery failing (see the worker log)")
        elif isinstance(exc, ClickHouseError):
            self.clickhouse(False)

    def clickhouse(self, ok: bool, what: str = "inserts failing") -> None:
        """An insert (or a ping) to ClickHouse succeeded or failed."""
        self._last_contact = time.monotonic()
        if ok:
            self.clear("clickhouse")
        else:
            self.problem("clickhouse", f"{what} (see the worker log)")

    def progress(self, now: float | None = None) -> None:
        super().progress(now)
        LAST_PROGRESS.set(time.time())

    # -------------------------------------------------------------- what the loop asks

    def ping_due(self, now: float | None = None) -> bool:
        """True when ClickHouse was not contacted for ``PING_EVERY_S`` (no rows to write)."""
        return (time.monotonic() if now is None else now) - self._last_contact >= PING_EVERY_S


__all__ = ["LAST_PROGRESS", "PING_EVERY_S", "StreamHealth"]
