"""Consumer-group lag as Prometheus metrics, measured at the broker: what the lag alerts read.

A consumer's own lag gauge (``rolloutbus_streams_lag``) goes silent exactly when it matters — when the
consumer is down. Lag must be measured from outside, from the committed offsets and the partitions'
ends. In production that is Strimzi's Kafka Exporter (``kafkaExporter:`` in the Kafka resource) or
``kafka_exporter``; this small exporter serves the same metric names for the local stack and the tests,
so one set of rules serves both::

    kafka_brokers                                  brokers in the cluster
    kafka_topic_partition_current_offset           the end (high watermark) of each partition
    kafka_consumergroup_current_offset             a group's committed offset per partition
    kafka_consumergroup_lag                        end - committed, per group and partition
    kafka_consumergroup_lag_sum                    the same summed over a topic's partitions

Only topics with the configured prefix (``ROLLOUTBUS_TOPIC_PREFIX``) are reported; Kafka settings
(bootstrap, SASL, TLS) are the ``ROLLOUTBUS_*`` ones every process reads. The cluster is asked at most
every ``--interval`` seconds, in the background; a scrape reads the last answer.

    python deploy/prometheus/kafka_lag_exporter.py [--host 127.0.0.1] [--port 9308] [--interval 15]
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

log = logging.getLogger("rolloutbus.kafka_lag_exporter")

METRICS = {
    "kafka_brokers": ("Number of brokers in the Kafka cluster", []),
    "kafka_topic_partition_current_offset": ("Current offset (end) of a partition", ["topic", "partition"]),
    "kafka_consumergroup_current_offset": ("Committed offset of a consumer group in a partition", ["consumergroup", "topic", "partition"]),
    "kafka_consumergroup_lag": ("Records a consumer group is behind in a partition", ["consumergroup", "topic", "partition"]),
    "kafka_consumergroup_lag_sum": ("Records a consumer group is behind, summed over a topic's partitions", ["consumergroup", "topic"]),
}


class LagCollector(Collector):
    """The last snapshot of the cluster as metric families; :meth:`refresh` takes a new one."""

    def __init__(self, kafka_conf: dict[str, Any], prefix: str, timeout: float = 10.0) -> None:
        self.kafka_conf, self.prefix, self.timeout = kafka_conf, prefix, timeout
        self._snapshot: dict[str, list[tuple[list[str], float]]] = {name: [] for name in METRICS}
        self._lock = threading.Lock()

    def refresh(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        from foundation.kafka_admin import cluster_status

        brokers, topics, groups = cluster_status(self.kafka_conf, self.prefix, self.timeout)
        snap: dict[str, list[tuple[list[str], float]]] = {name: [] for name in METRICS}
        snap["kafka_brokers"].append(([], float(len(brokers))))
        ends: dict[tuple[str, int], int] = {}
        consumer = Consumer({**self.kafka_conf, "group.id": "rolloutbus-lag-exporter", "enable.auto.commit": False, "log_level": 0})
        try:
            for t in topics:
                for p in range(t.partitions):
                    _, hi = consumer.get_watermark_offsets(TopicPartition(t.name, p), timeout=self.timeout)
                    ends[(t.name, p)] = hi
                    snap["kafka_topic_partition_current_offset"].append(([t.name, str(p)], float(hi)))
        finally:
            consumer.close()
        for g in groups:
            for (topic, partition), lag in sorted(g.partitions.items()):
                labels = [g.group, topic, str(partition)]
                snap["kafka_consumergroup_lag"].append((labels, float(lag)))
                if (topic, partition) in ends:
                    snap["kafka_consumergroup_current_offset"].append((labels, float(ends[(topic, partition)] - lag)))
            for topic, lag in sorted(g.lag.items()):
                snap["kafka_consumergroup_lag_sum"].append(([g.group, topic], float(lag)))
        with self._lock:
            self._snapshot = snap

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for name, (doc, labels) in METRICS.items():
            yield GaugeMetricFamily(name, doc, labels=labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            snap = self._snapshot
        for name, (doc, labels) in METRICS.items():
            family = GaugeMetricFamily(name, doc, labels=labels)
            for values, value in snap[name]:
                family.add_metric(values, value)
            yield family


def registry_for(collector: LagCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def main(argv: list[str] | None = None) -> int:
    from prometheus_client import start_http_server

    from foundation.config import CommonSettings, load_settings
    from foundation.errors import RolloutbusError

    parser = argparse.ArgumentParser(prog="kafka_lag_exporter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address /metrics binds (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9308, help="port of /metrics (default 9308, kafka_exporter's)")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between two looks at the cluster (default 15)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(CommonSettings)
        collector = LagCollector(settings.kafka_conf(), settings.topic_prefix)
        server, _ = start_http_server(args.port, args.host, registry=registry_for(collector))
    except (RolloutbusError, OSError) as exc:
        print(f"kafka_lag_exporter: {exc}", file=sys.stderr)
        return 2
    log.info("serving consumer-group lag of topics %s* on http://%s:%d/metrics", settings.topic_prefix, args.host, server.server_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set():
        started = time.monotonic()
        try:
            collector.refresh()
        except Exception as exc:  # noqa: BLE001 - the cluster may be away for a while; keep the last snapshot
            log.warning("cannot read the cluster's offsets: %s", str(exc).splitlines()[0] if str(exc) else repr(exc))
        stop.wait(max(0.0, args.interval - (time.monotonic() - started)))
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
