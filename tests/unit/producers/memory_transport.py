"""An in-memory stand-in for the gateway's span transport (no broker), for the route tests."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any


class MemoryTransport:
    """Takes every record (kept in ``records``); Kafka is up."""

    kafka_up = True

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []

    def accepting(self, nbytes: int = 0) -> bool:
        return True

    def emit_encoded(self, key: bytes, value: bytes) -> bool:
        self.records.append((key, value))
        return True

    def emit_encoded_many(self, records: list[tuple[bytes, bytes]]) -> int:
        """As SpanTransport's: the records taken, from the first (through ``emit_encoded``, which a subclass may refuse)."""
        for n, (key, value) in enumerate(records):
            if not self.emit_encoded(key, value):
                return n
        return len(records)

    def spooled(self) -> Future[None]:
        """As SpanTransport's: done once what was taken is kept (here, at once)."""
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def stats(self) -> dict[str, Any]:
        return {"spool_pending": 0}
