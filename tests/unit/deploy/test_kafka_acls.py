"""ACLs as Strimzi KafkaUser resources spell them, read and judged the way Kafka's authorizer does (no broker:
tests/integration/deploy/test_acls.py applies them to a real one)."""

from __future__ import annotations

import pytest

from foundation.kafka_admin import Acl, acl_allows, acl_bindings, kafka_user_acls

USER = {
    "apiVersion": "kafka.strimzi.io/v1beta2", "kind": "KafkaUser", "metadata": {"name": "rolloutbus-worker"},
    "spec": {"authentication": {"type": "scram-sha-512"}, "authorization": {"type": "simple", "acls": [
        {"resource": {"type": "topic", "name": "rb.spans", "patternType": "literal"}, "operations": ["Read"]},
        {"resource": {"type": "topic", "name": "rb.streams", "patternType": "prefix"}, "operations": ["Read", "Write", "Create"]},
        {"resource": {"type": "group", "name": "rb.streams", "patternType": "prefix"}, "operations": ["Read"]},
        {"resource": {"type": "topic", "name": "rb.streams-secret"}, "operations": ["Write"], "type": "deny"},
        {"resource": {"type": "topic", "name": "rb.config"}, "operations": ["AlterConfigs"]},
        {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"]},
    ]}},
}


def test_one_entry_per_operation() -> None:
    acls = kafka_user_acls(USER)
    assert len(acls) == 8
    assert acls[0] == Acl("topic", "rb.spans", "literal", "Read")
    assert Acl("cluster", "kafka-cluster", "literal", "IdempotentWrite") in acls


@pytest.mark.parametrize(("kind", "name", "op", "allowed"), [
    ("topic", "rb.spans", "Read", True),
    ("topic", "rb.spans", "Describe", True),  # Read implies Describe
    ("topic", "rb.spans", "Write", False),
    ("topic", "rb.spansx", "Read", False),  # literal: the name, not a prefix
    ("topic", "rb.streams-group-state-changelog", "Create", True),  # prefix
    ("topic", "rb.stream", "Read", False),
    ("group", "rb.streams.spans", "Read", True),
    ("group", "rolloutbus-runners", "Read", False),
    ("topic", "rb.streams-secret", "Write", False),  # a matching deny wins over the prefix's allow
    ("topic", "rb.streams-secret", "Read", True),
    ("topic", "rb.config", "DescribeConfigs", True),  # AlterConfigs implies DescribeConfigs
    ("topic", "rb.config", "Describe", False),
    ("cluster", "kafka-cluster", "IdempotentWrite", True),
])
def test_acl_allows_like_the_authorizer(kind: str, name: str, op: str, allowed: bool) -> None:
    assert acl_allows(kafka_user_acls(USER), kind, name, op) is allowed


def test_bindings_for_the_admin_api() -> None:
    from confluent_kafka.admin import AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    bindings = acl_bindings("rolloutbus-worker", kafka_user_acls(USER))
    assert len(bindings) == 8
    prefixed = bindings[1]
    assert (prefixed.restype, prefixed.name, prefixed.resource_pattern_type, prefixed.principal, prefixed.host,
            prefixed.operation, prefixed.permission_type) == (
        ResourceType.TOPIC, "rb.streams", ResourcePatternType.PREFIXED, "User:rolloutbus-worker", "*",
        AclOperation.READ, AclPermissionType.ALLOW)
    assert bindings[5].permission_type == AclPermissionType.DENY
    assert bindings[-1].restype == ResourceType.BROKER and bindings[-1].name == "kafka-cluster"
