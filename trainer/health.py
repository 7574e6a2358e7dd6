"""The trainer's Prometheus metrics and what its ``/readyz`` means.

Served by :func:`foundation.health.serve_health` with ``/healthz`` on the trainer's metrics port. Ready
when the trainer's consumer holds the batches topic's partition and either no batch waits or it read
a batch or finished a step within ``stall_s``. The trainer has no ClickHouse connection (the stream
sink stores its versions and step metrics from rb.resources and rb.metrics), so none is checked; a
failed publish to Kafka stops the trainer with an error.

The metric names are a contract (alert rules are written against them)::

    rolloutbus_trainer_steps_total                    counter  optimiser steps finished by this process
    rolloutbus_trainer_last_step_timestamp_seconds    gauge    unix time of the last finished step
    rolloutbus_trainer_policy_version                 gauge    the policy version last published
    rolloutbus_trainer_last_batch_timestamp_seconds   gauge    unix time the last batch was read
    rolloutbus_trainer_batches_consumed_total         counter  records read from the batches topic
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector

from foundation.health import Readiness


class TrainerHealth(Readiness):
    """Readiness and metrics of one trainer process, on a registry of its own."""

    def __init__(self, stall_s: float = 600.0, registry: Any = None) -> None:
        super().__init__(input_name="the batches topic", stall_s=stall_s)
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        if registry is None:
            ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        self.steps = Counter("rolloutbus_trainer_steps", "Optimiser steps finished by this process", registry=r)
        self.last_step = Gauge("rolloutbus_trainer_last_step_timestamp_seconds", "Unix time of the last finished step", registry=r)
        self.policy_version = Gauge("rolloutbus_trainer_policy_version", "The policy version last published on the resources topic",
                                    registry=r)
        self.last_batch = Gauge("rolloutbus_trainer_last_batch_timestamp_seconds", "Unix time the last batch was read", registry=r)
        self.batches = Counter("rolloutbus_trainer_batches_consumed", "Records read from the batches topic (trained on, "
                               "dropped as stale or duplicate, or dead-lettered)", registry=r)

    def batch_read(self, now: float | None = None) -> None:
        self.batches.inc()
        self.last_batch.set(time.time())
        self.progress(now)

    def step_done(self, version: int, now: float | None = None) -> None:
        self.steps.inc()
        self.last_step.set(time.time())
        self.policy_version.set(version)
        self.progress(now)

    def published(self, version: int | None) -> None:
        if version is not None:
            self.policy_version.set(version)


__all__ = ["TrainerHealth"]
