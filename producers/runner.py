"""The task runner: consume ``rb.tasks`` as a consumer group and run an agent on each task.

A train task runs ``group_size`` rollouts (one GRPO group), up to ``concurrency`` attempts at once.
A failed attempt is retried (same rollout id, new attempt id, ``attempt`` 2, 3, ...) up to
``max_attempts``; a stuck one ends as ``timeout``; attempts send heartbeats. The runner follows the
compacted ``rb.resources`` topic, so a newer version is used from the next rollout on; a task may carry
its own version of a resource (``use_resource.<name>`` in its metadata: how a prompt optimizer scores a
candidate that is not published), and each rollout records the versions it used (``resource.<name>`` in
its metadata, so in ``rollouts.metadata``). A task's offset
is committed only once all its rollouts have finished (and every earlier task of its partition), so a
crash loses no task. Undecodable task records go to ``rb.dlq`` with the reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from foundation.config import Topics
from foundation.errors import DecodeError, ValidationError
from schemas.codec import decode, encode
from schemas.models import DeadLetter, ResourceVersion, Task

from producers.litagent import AttemptResult, AttemptRunner
from producers.transport import SpanTransport

log = logging.getLogger(__name__)


class ResourceFollower:
    """The latest :class:`ResourceVersion` per name, kept current from ``rb.resources`` by a thread."""

    def __init__(self, kafka_conf: dict[str, Any], topic: str) -> None:
        self.kafka_conf = kafka_conf
        self.topic = topic
        self._latest: dict[str, ResourceVersion] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.ready = threading.Event()  # set once the topic was read to its end
        self._thread = threading.Thread(target=self._run, name="rolloutbus-resources", daemon=True)

    def start(self) -> ResourceFollower:
        self._thread.start()
        return self

    def current(self) -> dict[str, ResourceVersion]:
        with self._lock:
            return dict(self._latest)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        c = Consumer({**self.kafka_conf, "group.id": f"rolloutbus-resources-{uuid.uuid4().hex[:8]}",
                      "enable.auto.commit": False, "log_level": 0})
        try:
            md = c.list_topics(self.topic, timeout=10)
            parts = list(md.topics[self.topic].partitions) if self.topic in md.topics else [0]
            c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
            # Ready once every partition was read up to the end it had at the start (an empty poll alone
            # comes before the first fetch, too).
            ends = self._ends(c, parts)
            reached: dict[int, int] = {}
            while not self._stop.is_set():
                msg = c.poll(0.2)
                if msg is None:
                    if ends is None or all(reached.get(p, low) >= high for p, (low, high) in ends.items()):
                        self.ready.set()
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        self.ready.set()
                    continue
                reached[msg.partition()] = msg.offset() + 1
                try:
                    rv = decode(msg.value(), "rolloutbus.ResourceVersion")
                except (DecodeError, ValidationError) as exc:
                    log.warning("rb.resources record at offset %d skipped: %s", msg.offset(), exc)
                    continue
                assert isinstance(rv, ResourceVersion)
                with self._lock:
                    old = self._latest.get(rv.name)
                    if old is None or rv.version >= old.version:
                        self._latest[rv.name] = rv
                        if old is not None and rv.version > old.version:
                            log.info("resource %s: version %d → %d", rv.name, old.version, rv.version)
        finally:
            c.close()

    def _ends(self, c: Any, parts: list[int]) -> dict[int, tuple[int, int]] | None:
        """(low, high) watermarks of each partition; None when the broker does not say (then the first
        empty poll counts as the end, as before)."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            return {p: c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10) for p in parts}
        except KafkaException as exc:
            log.warning("the end of %s is not known (%s): ready after the first empty poll", self.topic, exc)
            return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


OVERRIDE_PREFIX = "use_resource."  # task metadata: a resource version for this task only (JSON)
USED_PREFIX = "resource."  # rollout metadata: the version of each resource the rollout used


def use_resource(rv: ResourceVersion, label: str | None = None) -> dict[str, str]:
    """Task metadata that makes runners use ``rv`` for this task instead of the latest ``rv.name``.

    ``label`` is what the rollouts record as the version used (default: ``rv.version``), e.g. a
    candidate's id when ``rv`` is a prompt under evaluation.
    """
    config = dict(rv.config)
    if label is not None:
        config["label"] = label
    return {OVERRIDE_PREFIX + rv.name: rv.model_copy(update={"config": config}).model_dump_json()}


def task_resources(current: dict[str, ResourceVersion], metadata: dict[str, str]) -> tuple[dict[str, ResourceVersion], dict[str, str]]:
    """The resources one rollout of a task uses, and the metadata it records. Pure.

    ``current`` is the latest version per name; ``metadata`` the task's. Overrides in the task replace
    the latest; the rollout's metadata keeps the task's (overrides removed: they can be large) and adds
    ``resource.<name>`` = the version (or label) of each resource used.
    """
    resources = dict(current)
    out: dict[str, str] = {}
    for key, value in metadata.items():
        if key.startswith(OVERRIDE_PREFIX):
            try:
                rv = ResourceVersion.model_validate_json(value)
            except ValueError as exc:
                raise ValidationError(f"task metadata {key!r} is not a ResourceVersion: {str(exc).splitlines()[0]}") from exc
            resources[key[len(OVERRIDE_PREFIX):]] = rv
        else:
            out[key] = value
    for name, rv in resources.items():
        out[USED_PREFIX + name] = rv.config.get("label") or str(rv.version)
    return resources, out


@dataclass
class RunnerStats:
    tasks: int = 0
    attempts: int = 0
    succeeded: int = 0
    failed: int = 0
    dead_letters: int = 0


class TaskRunner:
    """Runs ``agent`` on tasks from ``topics.tasks``."""

    def __init__(
        self,
        agent: AttemptRunner,
        kafka_conf: dict[str, Any],
        topics: Topics,
        transport: SpanTransport,
        *,
        group: str = "rolloutbus-runners",
        concurrency: int = 4,
        max_attempts: int = 2,
        timeout_s: float | None = 600.0,
        heartbeat_s: float | None = 10.0,
        resources: ResourceFollower | None = None,
    ) -> None:
        self.agent = agent
        self.kafka_conf = kafka_conf
        self.topics = topics
        self.transport = transport
        self.group = group
        self.concurrency = concurrency
        self.max_attempts = max(1, max_attempts)
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self.resources = resources or ResourceFollower(kafka_conf, topics.resources).start()
        self.stats = RunnerStats()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def _rollout(self, task: Task, payload: Any, sem: asyncio.Semaphore) -> list[AttemptResult]:
        rollout_id = f"ro-{uuid.uuid4().hex[:16]}"
        results = []
        for attempt in range(1, self.max_attempts + 1):
            async with sem:
                # The newest versions, per rollout attempt, unless the task brings its own.
                resources, metadata = task_resources(self.resources.current(), task.metadata)
                version = task.resource_version
                if version is None and "policy" in resources:
                    version = resources["policy"].version
                res = await self.agent.arun(
                    payload, resources, task_id=task.task_id, mode=task.mode, rollout_id=rollout_id,
                    attempt=attempt, resource_version=version, metadata=metadata, transport=self.transport,
                    timeout=self.timeout_s, heartbeat_s=self.heartbeat_s,
                )
            self.stats.attempts += 1
            results.append(res)
            if res.status == "succeeded":
                self.stats.succeeded += 1
                break
            self.stats.failed += 1
            log.info("rollout %s attempt %d %s: %s", rollout_id, attempt, res.status, res.error)
        return results

    async def _task(self, task: Task, sem: asyncio.Semaphore) -> None:
        try:
            payload = json.loads(task.input)
        except ValueError:
            payload = task.input  # plain text input
        n = max(1, task.group_size) if task.mode == "train" else 1
        await asyncio.gather(*(self._rollout(task, payload, sem) for _ in range(n)))
        self.stats.tasks += 1

    def _dead_letter(self, producer: Any, msg: Any, reason: str, detail: str) -> None:
        dl = DeadLetter(source_topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), key=msg.key(),
                        value=msg.value(), reason=reason, detail=detail[:2000], stage="runner", time_ns=time.time_ns())
        producer.produce(self.topics.dlq, encode(dl))
        producer.flush(10)
        self.stats.dead_letters += 1

    async def run(self, max_tasks: int | None = None, idle_exit_s: float | None = None) -> RunnerStats:
        """Consume and run until :meth:`stop`, ``max_tasks`` tasks, or ``idle_exit_s`` without work."""
        from confluent_kafka import Consumer, Producer, TopicPartition

        from foundation.kafka_admin import AUTHENTICATION_CODES, AUTHORIZATION_CODES, kafka_failure

        loop = asyncio.get_running_loop()
        io = ThreadPoolExecutor(1, thread_name_prefix="rolloutbus-tasks")  # the consumer stays on one thread
        consumer = Consumer({**self.kafka_conf, "group.id": self.group, "enable.auto.commit": False,
                             "auto.offset.reset": "earliest", "max.poll.interval.ms": 86_400_000, "log_level": 0})
        dlq = Producer({**self.kafka_conf, "log_level": 0})
        await loop.run_in_executor(io, consumer.subscribe, [self.topics.tasks])
        sem = asyncio.Semaphore(self.concurrency)
        pending: dict[int, set[int]] = {}
        highest: dict[int, int] = {}
        running: set[asyncio.Task[None]] = set()
        started = 0
        last_work = time.monotonic()

        def committable(part: int) -> int:
            return min(pending[part]) if pending.get(part) else highest[part] + 1

        async def commit(part: int) -> None:
            tp = TopicPartition(self.topics.tasks, part, committable(part))
            await loop.run_in_executor(io, lambda: consumer.commit(offsets=[tp], asynchronous=False))

        async def handle(msg: Any, task: Task) -> None:
            try:
                await self._task(task, sem)
            finally:
                pending[msg.partition()].discard(msg.offset())
                await commit(msg.partition())

        try:
            while not self._stop.is_set():
                if max_tasks is not None and started >= max_tasks:
                    if not running:
                        break
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    continue
                # Backpressure: do not pull more tasks than we can start.
                if len(running) >= self.concurrency:
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    continue
                msg = await loop.run_in_executor(io, consumer.poll, 0.2)
                if msg is None:
                    if idle_exit_s is not None and not running and time.monotonic() - last_work > idle_exit_s:
                        break
                    continue
                if msg.error():
                    err = msg.error()
                    if err.fatal() or err.code() in AUTHORIZATION_CODES | AUTHENTICATION_CODES:  # no retry mends these
                        raise kafka_failure(self.kafka_conf, err, f"read topic {self.topics.tasks} in group {self.group}")
                    continue
                last_work = time.monotonic()
                part, off = msg.partition(), msg.offset()
                highest[part] = max(highest.get(part, -1), off)
                try:
                    task = decode(msg.value(), "rolloutbus.Task")
                    assert isinstance(task, Task)
                    task_resources({}, task.metadata)  # a bad override is the record's fault: to the DLQ
                except (DecodeError, ValidationError) as exc:
                    log.warning("task record %s[%d]@%d to the DLQ: %s", msg.topic(), part, off, exc)
                    await loop.run_in_executor(io, self._dead_letter, dlq, msg, "decode.task", str(exc))
                    await commit(part)
                    continue
                pending.setdefault(part, set()).add(off)
                started += 1
                t = asyncio.create_task(handle(msg, task))
                running.add(t)
                t.add_done_callback(running.discard)
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        finally:
            await loop.run_in_executor(io, consumer.close)
            io.shutdown(wait=False)
        return self.stats


def load_agent(spec: str) -> AttemptRunner:
    """``module:Name`` → what runs its attempts: a ``rolloutbus.LitAgent`` subclass (instantiated) or instance, an
    ``@agl.rollout`` function or a plain one (:func:`producers.litagent.litagent`), or an :class:`AttemptRunner` as it is."""
    import importlib

    from foundation.errors import ConfigError

    module, _, name = spec.partition(":")
    if not module or not name:
        raise ConfigError(f"agent {spec!r} must look like package.module:AgentClass")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load agent {spec!r}: {exc}") from exc
    if isinstance(obj, type) and issubclass(obj, AttemptRunner):
        return obj()
    if isinstance(obj, AttemptRunner):
        return obj
    # ``rolloutbus.LitAgent`` (a class, an instance, an @agl.rollout function): it says how it runs here
    if isinstance(obj, type) and callable(getattr(obj, "as_runner_agent", None)):
        obj = obj()
    if callable(getattr(obj, "as_runner_agent", None)):
        return obj.as_runner_agent()  # type: ignore[no-any-return]
    if callable(obj):
        from producers.litagent import function_runner

        return function_runner(obj)
    raise ConfigError(f"{spec!r} is not a LitAgent (class or instance) or a function")


__all__ = ["OVERRIDE_PREFIX", "USED_PREFIX", "TaskRunner", "ResourceFollower", "RunnerStats", "load_agent", "task_resources",
           "use_resource"]
