"""Topic creation, cluster status, and ACLs/SCRAM users from Strimzi KafkaUser specs, over confluent-kafka's AdminClient."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from foundation.config import Topics
from foundation.errors import KafkaNotAuthorized, KafkaUnavailable, ServiceError


# The largest record a topic takes (the broker's default is 1 MB): a rollout's summary, a group's batch or an
# LLM span with a long prompt's token ids is larger; the producers allow as much (message.max.bytes).
MAX_RECORD_BYTES = str(16 * 1024 * 1024)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(topics: Topics, span_partitions: int = 4) -> list[TopicSpec]:
    """The topics of the design, with partitions and configs that fit them."""
    return [
        # Spans and lifecycle events, keyed by rollout_id: partitions divide the stream workers' work.
        TopicSpec(topics.spans, span_partitions, {"compression.type": "producer", "max.message.bytes": MAX_RECORD_BYTES}),
        TopicSpec(topics.tasks, span_partitions),
        # Groups for the trainer: one partition keeps them in the order they completed.
        TopicSpec(topics.batches, 1, {"max.message.bytes": MAX_RECORD_BYTES}),
        # Latest version per resource name survives compaction forever.
        TopicSpec(topics.resources, 1, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}),
        TopicSpec(topics.metrics, 1),
        TopicSpec(topics.dlq, 1, {"max.message.bytes": MAX_RECORD_BYTES}),
    ]


def admin(conf: dict[str, Any], errors: list[KafkaError] | None = None) -> AdminClient:
    """An AdminClient; with ``errors``, the client-level errors (a refused login among them) land there
    whenever the client is polled."""
    extra: dict[str, Any] = {"error_cb": errors.append} if errors is not None else {}
    return AdminClient({**conf, "log_level": 0, **extra})


def list_topic_names(client: AdminClient, conf: dict[str, Any], errors: list[KafkaError], timeout: float) -> Any:
    """The cluster's metadata (``list_topics``), a failure turned into one line by :func:`kafka_failure`:
    a refused login shows only among the client's errors, so they are served and looked at first."""
    try:
        return client.list_topics(timeout=timeout)
    except KafkaException as exc:
        client.poll(0)
        refused = next((e for e in errors if e.code() in AUTHENTICATION_CODES), None)
        raise kafka_failure(conf, refused or exc, "list the topics") from exc


def ensure_topics(conf: dict[str, Any], specs: list[TopicSpec], timeout: float = 30.0) -> list[str]:
    """Create the topics that do not exist. Returns the names it created.

    A topic this client's user may not Describe is left out of the cluster's listing whether it exists
    or not, so each one missing from it is asked for by name; a refusal is one line naming the user,
    the operation and the topic (:func:`not_authorized`), never a "could not create" of a topic that exists.
    """
    errors: list[KafkaError] = []
    client = admin(conf, errors)
    existing = set(list_topic_names(client, conf, errors, timeout).topics)
    missing = [s.name for s in specs if s.name not in existing]
    if missing:
        for name, fut in client.describe_topics(TopicCollection(missing), request_timeout=timeout).items():
            try:
                fut.result()
                existing.add(name)  # created since the listing
            except KafkaException as exc:
                if _code(exc) != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise kafka_failure(conf, exc, f"describe topic {name}") from exc
    new = [NewTopic(s.name, num_partitions=s.partitions, replication_factor=-1, config=s.config) for s in specs if s.name not in existing]
    created = []
    if new:
        for name, fut in client.create_topics(new, request_timeout=timeout).items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as exc:
                if _code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise kafka_failure(conf, exc, f"create topic {name}") from exc
    return created


# Refusals by the broker's authorizer, and a login it did not accept.
AUTHORIZATION_CODES = frozenset({
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
})
AUTHENTICATION_CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
ACLS_DOC = "deploy/k8s/base/kafka-user.yaml"


def _code(exc: KafkaException | KafkaError) -> int | None:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    return err.code() if isinstance(err, KafkaError) else None


def kafka_user(conf: dict[str, Any]) -> str:
    """Who this client is to the broker, for messages: ``Kafka user 'name'`` (or the anonymous client)."""
    user = conf.get("sasl.username")
    return f"Kafka user {user!r}" if user else "this Kafka client (no SASL user: principal ANONYMOUS)"


def not_authorized(conf: dict[str, Any], action: str) -> str:
    """The one line for an ACL refusal: who, may not do what, on which cluster, and where ACLs are listed."""
    return (f"{kafka_user(conf)} is not authorized to {action} on {conf.get('bootstrap.servers')}: "
            f"grant it that ACL (each process kind's ACLs: {ACLS_DOC})")


def kafka_failure(conf: dict[str, Any], exc: KafkaException | KafkaError, action: str) -> ServiceError:
    """A librdkafka error met while doing ``action`` ("create topic rb.spans", "read group rb.streams") as
    the project's error, in one line: an ACL refusal and a refused login say so and what to change;
    anything else is the cluster not answering."""
    code = _code(exc)
    if code in AUTHORIZATION_CODES:
        return KafkaNotAuthorized(not_authorized(conf, action))
    if code in AUTHENTICATION_CODES:
        mechanism = conf.get("sasl.mechanism", "SASL")
        return KafkaNotAuthorized(f"Kafka at {conf.get('bootstrap.servers')} refused the login of {kafka_user(conf)} ({mechanism}): "
                            "check ROLLOUTBUS_KAFKA_SASL_USERNAME, ROLLOUTBUS_KAFKA_SASL_PASSWORD and ROLLOUTBUS_KAFKA_SASL_MECHANISM")
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    text = err.str() if isinstance(err, KafkaError) else str(err)
    return KafkaUnavailable(f"could not {action} on Kafka at {conf.get('bootstrap.servers')}: {text}")


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

    errors: list[KafkaError] = []
    client = admin(conf, errors)
    md = list_topic_names(client, conf, errors, timeout)
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


# --------------------------------------------------------------------------- ACLs and SCRAM users
# Kubernetes gets them from Strimzi KafkaUser resources (deploy/k8s/base/kafka-user.yaml); any other
# cluster (and the ACL test's local broker) gets the same ones through the Admin API from those specs.

# Operations a granted one implies (Kafka's rules): Read/Write/Delete/Alter → Describe, AlterConfigs → DescribeConfigs.
_IMPLIED_BY = {"Describe": {"Read", "Write", "Delete", "Alter"}, "DescribeConfigs": {"AlterConfigs"}}


@dataclass(frozen=True)
class Acl:
    """One ACL entry as a Strimzi KafkaUser spells it (``type``, ``name``, ``patternType``, one operation)."""

    resource_type: str  # topic | group | cluster | transactionalId
    name: str  # "kafka-cluster" for the cluster
    pattern: str  # literal | prefix
    operation: str  # Read, Write, Create, Describe, ..., All
    host: str = "*"
    permission: str = "allow"  # allow | deny

    def matches(self, resource_type: str, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern == "prefix":
            return name.startswith(self.name)
        return self.name in ("*", name)


def kafka_user_acls(user: Mapping[str, Any]) -> list[Acl]:
    """The ACL entries of one Strimzi ``KafkaUser`` resource (``spec.authorization.acls``), one per operation."""
    acls = []
    for entry in (user.get("spec", {}).get("authorization") or {}).get("acls", []):
        res = entry["resource"]
        kind = res["type"]
        name = "kafka-cluster" if kind == "cluster" else res.get("name", "*")
        ops = entry.get("operations") or [entry["operation"]]
        for op in ops:
            acls.append(Acl(kind, name, res.get("patternType", "literal"), op, entry.get("host", "*"), entry.get("type", "allow")))
    return acls


def acl_allows(acls: Iterable[Acl], resource_type: str, name: str, operation: str) -> bool:
    """Whether ``acls`` let their user do ``operation`` on the resource, as Kafka's authorizer decides
    (a matching deny wins; ``All`` and the implied operations count)."""
    granted = {operation, "All", *_IMPLIED_BY.get(operation, ())}
    matching = [a for a in acls if a.matches(resource_type, name) and a.operation in granted]
    return bool(matching) and not any(a.permission == "deny" for a in matching)


def acl_bindings(username: str, acls: Iterable[Acl]) -> list[Any]:
    """confluent-kafka ``AclBinding`` objects for ``acls`` granted to ``User:<username>``."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.BROKER,
             "transactionalId": ResourceType.TRANSACTIONAL_ID}
    patterns = {"literal": ResourcePatternType.LITERAL, "prefix": ResourcePatternType.PREFIXED}
    ops = {"Read": AclOperation.READ, "Write": AclOperation.WRITE, "Create": AclOperation.CREATE,
           "Delete": AclOperation.DELETE, "Alter": AclOperation.ALTER, "Describe": AclOperation.DESCRIBE,
           "ClusterAction": AclOperation.CLUSTER_ACTION, "AlterConfigs": AclOperation.ALTER_CONFIGS,
           "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS, "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE,
           "All": AclOperation.ALL}
    return [
        AclBinding(kinds[a.resource_type], a.name, patterns[a.pattern], f"User:{username}", a.host, ops[a.operation],
                   AclPermissionType.ALLOW if a.permission == "allow" else AclPermissionType.DENY)
        for a in acls
    ]


def apply_kafka_users(conf: dict[str, Any], users: Iterable[Mapping[str, Any]], passwords: Mapping[str, str],
                      timeout: float = 30.0) -> None:
    """Create each KafkaUser's SCRAM-SHA-512 credentials (from ``passwords``) and its ACLs, through the
    Admin API of the cluster ``conf`` reaches (as a user allowed to alter ACLs and SCRAM credentials)."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    client = admin(conf)
    users = list(users)
    upserts = [UserScramCredentialUpsertion(u["metadata"]["name"], ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                            passwords[u["metadata"]["name"]].encode()) for u in users]
    bindings = [b for u in users for b in acl_bindings(u["metadata"]["name"], kafka_user_acls(u))]
    try:
        for fut in client.alter_user_scram_credentials(upserts, request_timeout=timeout).values():
            fut.result()
        for fut in client.create_acls(bindings, request_timeout=timeout).values():
            fut.result()
    except KafkaException as exc:
        raise KafkaUnavailable(f"could not create Kafka users and ACLs on {conf.get('bootstrap.servers')}: {exc}") from exc
