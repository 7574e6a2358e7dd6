"""``SpanTransport.flush`` waits for the records its worker has taken off the queue and not yet spooled."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from producers import SpanTransport, emit_state, rollout


def test_flush_counts_the_records_the_worker_holds(tmp_path: Path) -> None:
    # No broker: nothing is delivered, so flush must report every record emitted, including one the
    # worker is still encoding (out of the queue, not in the spool yet).
    t = SpanTransport({"bootstrap.servers": "127.0.0.1:1"}, "rb.spans", tmp_path / "spool", producer_overrides={"log_level": 0})
    release, holding = threading.Event(), threading.Event()
    encode = t._encode

    def slow_encode(item: Any) -> Any:
        if type(item) is tuple and item[1] == "rolloutbus.Span":
            holding.set()
            release.wait(10)
        return encode(item)

    t._encode = slow_encode  # type: ignore[method-assign]
    try:
        with rollout("task", transport=t):
            emit_state(1)
            assert holding.wait(5), "the worker took the span"
            # STARTED (spooled or held with the span) and the span: neither delivered
            assert t.flush(0.3) == 2, "flush must not return while the worker holds an undelivered span"
            release.set()
        assert t.flush(0.5) == 3  # STARTED, the span, FINISHED: in the spool, undelivered
    finally:
        release.set()
        t.close(0.5)
