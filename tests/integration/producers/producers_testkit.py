"""Reading a topic back from the real broker, for the producer tests."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer

from schemas.codec import decode_raw


def consume_all(conf: dict[str, Any], topic: str, expect: int, timeout: float = 30.0) -> list[tuple[bytes, str, dict[str, Any], int]]:
    """Every record on ``topic`` as (key, record name, Avro dict, partition), stopping at ``expect``
    records or when the topic stays quiet for a while after ``timeout``."""
    c = Consumer({**conf, "group.id": f"check-{uuid.uuid4().hex}", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[tuple[bytes, str, dict[str, Any], int]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                if len(out) >= expect:
                    break
                continue
            if msg.error():
                continue
            name, rec = decode_raw(msg.value())
            out.append((msg.key(), name, rec, msg.partition()))
        # A short grace read: anything beyond ``expect`` (duplicates) must show up too.
        grace = time.monotonic() + 1.0
        while time.monotonic() < grace:
            msg = c.poll(0.2)
            if msg is not None and not msg.error():
                name, rec = decode_raw(msg.value())
                out.append((msg.key(), name, rec, msg.partition()))
    finally:
        c.close()
    return out
