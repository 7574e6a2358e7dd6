#!/bin/bash
KAFKA_HEAP_OPTS=${KAFKA_TOOLS_HEAP_OPTS:--Xmx128m -XX:TieredStopAtLevel=1} exec "$(dirname "$0")/kafka-run-class.sh" org.apache.kafka.tools.MetadataQuorumCommand "$@"
