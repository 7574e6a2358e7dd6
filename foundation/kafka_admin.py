"""Topic creation and cluster status, over confluent-kafka's AdminClient."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from foundation.config import Topics
from foundation.errors import KafkaUnavailable


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(topics: Topics, span_partitions: int = 4) -> list[TopicSpec]:
    """The topics of the design, with partitions and configs that fit them."""
    return [
        # Spans and lifecycle events, keyed by rollout_id: partitions divide the stream workers' work.
        TopicSpec(topics.spans, span_partitions, {"compression.type": "producer", "max.message.bytes": "16777216"}),
        TopicSpec(topics.tasks, span_partitions),
        # Groups for the trainer: one partition keeps them in the order they completed.
        TopicSpec(topics.batches, 1, {"max.message.bytes": "16777216"}),
        # Latest version per resource name survives compaction forever.
        TopicSpec(topics.resources, 1, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}),
        TopicSpec(topics.metrics, 1),
        TopicSpec(topics.dlq, 1, {"max.message.bytes": "16777216"}),
    ]


def admin(conf: dict[str, Any]) -> AdminClient:
    return AdminClient({**conf, "log_level": 0})


def ensure_topics(conf: dict[str, Any], specs: list[TopicSpec], timeout: float = 30.0) -> list[str]:
    """Create the topics that do not exist. Returns the names it created."""
    client = admin(conf)
    try:
        existing = set(client.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise KafkaUnavailable(f"Kafka at {conf.get('bootstrap.servers')} does not answer: {exc}") from exc
    new = [NewTopic(s.name, num_partitions=s.partitions, replication_factor=-1, config=s.config) for s in specs if s.name not in existing]
    created = []
    if new:
        for name, fut in client.create_topics(new, request_timeout=timeout).items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise KafkaUnavailable(f"could not create topic {name}: {exc}") from exc
    return created


@dataclass
class TopicStatus:
    name: str
    partitions: int
    messages: int
    config: dict[str, str]


@dataclass
class GroupStatus:
    group: str
    lag: dict[str, int]  # topic → total lag
    partitions: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, partition) → lag


def cluster_status(conf: dict[str, Any], prefix: str, timeout: float = 10.0) -> tuple[list[str], list[TopicStatus], list[GroupStatus]]:
    """Brokers, the prefix's topics (partitions, messages, config) and consumer groups' lag."""
    from confluent_kafka import Consumer

    client = admin(conf)
    try:
        md = client.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"Kafka at {conf.get('bootstrap.servers')} does not answer: {exc}") from exc
    brokers = [f"{b.id}@{b.host}:{b.port}" for b in md.brokers.values()]
    names = sorted(t for t in md.topics if t.startswith(prefix))
    consumer = Consumer({**conf, "group.id": "rolloutbus-status", "enable.auto.commit": False, "log_level": 0})
    ends: dict[tuple[str, int], int] = {}
    topics = []
    try:
        from confluent_kafka.admin import ConfigResource, ResourceType

        configs: dict[str, dict[str, str]] = {}
        if names:
            res = client.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names])
            for r, fut in res.items():
                try:
                    entries = fut.result()
                    configs[r.name] = {k: v.value for k, v in entries.items() if k in ("cleanup.policy", "retention.ms") and v.value is not None}
                except KafkaException:
                    configs[r.name] = {}
        for name in names:
            total = 0
            parts = md.topics[name].partitions
            for p in parts:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=timeout)
                ends[(name, p)] = hi
                total += hi - lo
            topics.append(TopicStatus(name, len(parts), total, configs.get(name, {})))
    finally:
        consumer.close()
    groups = []
    try:
        listed = client.list_consumer_groups(request_timeout=timeout).result()
        for g in sorted(listed.valid, key=lambda g: g.group_id):
            if g.group_id == "rolloutbus-status":
                continue
            offs = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g.group_id)])
            lag: dict[str, int] = {}
            per_partition: dict[tuple[str, int], int] = {}
            for fut in offs.values():
                for tp in fut.result().topic_partitions:
                    if tp.topic.startswith(prefix) and tp.offset >= 0:
                        n = max(0, ends.get((tp.topic, tp.partition), tp.offset) - tp.offset)
                        per_partition[(tp.topic, tp.partition)] = n
                        lag[tp.topic] = lag.get(tp.topic, 0) + n
            if lag:
                groups.append(GroupStatus(g.group_id, lag, per_partition))
    except KafkaException:
        pass
    return brokers, topics, groups
