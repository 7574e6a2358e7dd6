#!/bin/bash
# The broker: KAFKA_* variables -> /opt/kafka/config/server.properties (KAFKA_NODE_ID -> node.id; '___' -> '-',
# '__' -> '_', '_' -> '.'), storage formatted with CLUSTER_ID on first start, then kafka.Kafka in the foreground.
set -euo pipefail
props=/opt/kafka/config/server.properties
: > "$props"
skip=" KAFKA_HEAP_OPTS KAFKA_OPTS KAFKA_LOG4J_OPTS KAFKA_JVM_PERFORMANCE_OPTS KAFKA_VERSION KAFKA_TOOLS_HEAP_OPTS "
while IFS='=' read -r name value; do
  case "$name" in KAFKA_*) ;; *) continue ;; esac
  [[ "$skip" == *" $name "* ]] && continue
  key=${name#KAFKA_}; key=${key,,}; key=${key//___/-}; key=${key//__/@}; key=${key//_/.}; key=${key//@/_}
  printf '%s=%s\n' "$key" "$value" >> "$props"
done < <(env)
: "${CLUSTER_ID:?set CLUSTER_ID (22 characters, base64url) to format the KRaft storage}"
/opt/kafka/bin/kafka-storage.sh format --cluster-id "$CLUSTER_ID" --config "$props" --ignore-formatted >/dev/null
export KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xmx512m -Xms512m}
export KAFKA_LOG4J_OPTS=-Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties
exec /opt/kafka/bin/kafka-run-class.sh kafka.Kafka "$props"
