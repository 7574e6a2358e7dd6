"""The resource follower outlives a topic that has no partition leader yet (right after its creation)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from trainer import resources
from trainer.resources import ResourceFollower


class _Consumer:
    """Two NOT_LEADER_FOR_PARTITION answers, then the end offsets; poll returns nothing."""

    def __init__(self) -> None:
        self.calls = 0
        self.assigned = threading.Event()

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self.calls += 1
        if self.calls <= 2:
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return 0, 0

    def assign(self, parts: Any) -> None:
        self.assigned.set()

    def poll(self, timeout: float) -> None:
        threading.Event().wait(min(timeout, 0.05))

    def close(self) -> None:
        pass


def test_a_partition_without_a_leader_yet_is_retried_not_the_end_of_the_follower(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer()
    monkeypatch.setattr(resources, "_consumer", lambda conf: consumer)
    monkeypatch.setattr(resources, "_partitions", lambda c, conf, topic, timeout: [0])
    follower = ResourceFollower({}, "rb.resources", "policy", lambda rec: None).start()
    try:
        assert consumer.assigned.wait(15.0), "the follower died on a transient error"
        assert consumer.calls == 3
    finally:
        follower.stop()
