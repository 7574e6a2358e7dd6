"""The newest resource versions on ``rb.resources``, as the gateway's routes read and publish them.

One follower per gateway process, shared by Agent Lightning's two APIs and started on the first call
(:class:`FollowedResources`, over the runners' :class:`producers.runner.ResourceFollower`); what this
replica publishes (0.3's ``add_resources``) it answers with at once, before its follower reads it back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from foundation.errors import KafkaUnavailable
from producers.runner import ResourceFollower
from schemas.codec import encode
from schemas.models import ResourceVersion

Resources = Callable[[], "dict[str, ResourceVersion] | None"]  # None: rb.resources not read to its end yet
Publish = Callable[[Sequence[ResourceVersion]], None]  # onto rb.resources, delivered; raises KafkaUnavailable


def newest(current: Mapping[str, ResourceVersion], versions: Iterable[ResourceVersion]) -> dict[str, ResourceVersion]:
    """``current`` with each of ``versions`` that is newer than the one it has."""
    out = dict(current)
    for rv in versions:
        if rv.name not in out or out[rv.name].version < rv.version:
            out[rv.name] = rv
    return out


class FollowedResources:
    """The newest versions on ``rb.resources``, read by a follower started on the first call (a gateway
    no Agent Lightning runner talks to never reads the topic). None until it was read to its end."""

    def __init__(self, kafka_conf: dict[str, Any], topic: str) -> None:
        self.kafka_conf, self.topic = kafka_conf, topic
        self._follower: Any = None
        self._producer: Any = None
        self._published: dict[str, ResourceVersion] = {}  # what this replica published, until the follower reads it

    def __call__(self) -> dict[str, ResourceVersion] | None:
        if self._follower is None:
            self._follower = ResourceFollower(self.kafka_conf, self.topic).start()
        if not self._follower.ready.is_set():
            return None
        return newest(self._follower.current(), list(self._published.values()))

    def publish(self, versions: Sequence[ResourceVersion]) -> None:
        """Each version onto rb.resources (keyed by its name), delivered before it returns; this replica answers
        with them at once. Raises :class:`KafkaUnavailable` when Kafka did not take them."""
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({**self.kafka_conf, "enable.idempotence": True, "log_level": 0})
        failed: list[Any] = []
        for rv in versions:
            self._producer.produce(self.topic, encode(rv), rv.name.encode(),
                                   on_delivery=lambda err, _msg: failed.append(err) if err else None)
        left = self._producer.flush(30)
        if left or failed:
            raise KafkaUnavailable(f"{left or len(failed)} resource versions not delivered to {self.topic}: "
                                   f"{failed[0] if failed else 'timed out'}")
        self._published = newest(self._published, versions)

    def close(self) -> None:
        if self._follower is not None:
            self._follower.stop()
        if self._producer is not None:
            self._producer.flush(10)


__all__ = ["FollowedResources", "Resources", "Publish", "newest"]
