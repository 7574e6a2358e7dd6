"""The runners' and the gateway's view of rb.resources: ready means read to the end the topic had."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Producer

from producers.runner import ResourceFollower
from schemas.codec import encode
from schemas.models import ResourceVersion

pytestmark = pytest.mark.integration


def test_ready_only_once_the_versions_already_on_the_topic_are_read(kafka_conf: dict[str, Any], topics: Any) -> None:
    p = Producer(kafka_conf)
    for v in range(1, 401):
        p.produce(topics.resources, encode(ResourceVersion(name="policy", version=v, uri=f"/ckpt/{v}", created_ns=v)), b"policy")
    assert p.flush(10) == 0
    # A broker slow to answer the first fetch (it waits 1.5 s for more bytes): the follower's first polls
    # come back empty before any record arrived, which is not the end of the topic.
    slow = {**kafka_conf, "fetch.min.bytes": 50_000_000, "fetch.wait.max.ms": 1500}
    for _ in range(2):
        follower = ResourceFollower(slow, topics.resources).start()
        try:
            assert follower.ready.wait(20), "never ready"
            assert follower.current()["policy"].version == 400, "ready before the topic's versions were read"
        finally:
            follower.stop()


def test_an_empty_topic_is_ready_at_once(kafka_conf: dict[str, Any], topics: Any) -> None:
    follower = ResourceFollower(kafka_conf, topics.resources).start()
    try:
        t0 = time.monotonic()
        assert follower.ready.wait(20) and follower.current() == {}
        assert time.monotonic() - t0 < 10
    finally:
        follower.stop()
