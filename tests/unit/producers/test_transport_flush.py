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


def test_spooled_is_done_only_once_what_came_before_it_is_in_the_spool(tmp_path: Path) -> None:
    """The gateway answers 200 when ``spooled()`` is done: a SIGKILL after that loses nothing, because the records are
    in the spool file (no broker here: nothing is delivered, everything is read back from disk)."""
    from producers.spool import open_spool

    t = SpanTransport({"bootstrap.servers": "127.0.0.1:1"}, "rb.spans", tmp_path / "spool", producer_overrides={"log_level": 0})
    release, holding = threading.Event(), threading.Event()
    spool_many = t.spool.append_many

    def slow_append(batch: Any) -> Any:
        holding.set()
        release.wait(10)
        return spool_many(batch)

    t.spool.append_many = slow_append  # type: ignore[method-assign]
    try:
        assert t.emit_encoded_many([(b"r1", b"a"), (b"r1", b"b")]) == 2
        done = t.spooled()
        assert holding.wait(5)
        assert not done.done(), "spooled() must wait for the spool write"
        release.set()
        done.result(5)
        assert t.spool.head == 2
        left = t.close(0.2)
        assert left == 2
        again = open_spool(tmp_path / "spool", "agent")
        assert [v for _i, _k, v in again.read_from(0, 10)] == [b"a", b"b"]
        again.close()
    finally:
        release.set()
        t.close(0.2)


def test_spooled_fails_once_the_transport_has_stopped(tmp_path: Path) -> None:
    import pytest

    from foundation.errors import ServiceError

    t = SpanTransport({"bootstrap.servers": "127.0.0.1:1"}, "rb.spans", tmp_path / "spool", producer_overrides={"log_level": 0})
    t._fail(ServiceError("refused for good"))
    with pytest.raises(ServiceError, match="refused for good"):
        t.spooled().result(5)
    t.close(0.2)
