#!/bin/bash
# java -cp /opt/kafka/libs/* CLASS ARGS (KAFKA_HEAP_OPTS, KAFKA_OPTS, KAFKA_LOG4J_OPTS as in Apache Kafka's scripts).
exec java ${KAFKA_HEAP_OPTS:--Xmx256m} -XX:+UseG1GC -Djava.awt.headless=true \
  ${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/opt/kafka/config/tools-log4j2.properties} \
  ${KAFKA_OPTS:-} -cp "/opt/kafka/libs/*" "$@"
