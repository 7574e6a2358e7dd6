"""A run's live view of its topics (steps, versions, groups), the feeder that keeps a few steps' worth of tasks
ahead of the trainer, and the waits on the policy server (pure where it can be)."""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from foundation.config import CommonSettings
from foundation.errors import RolloutbusError
from producers.settings import feeder_choices
from rolloutbus.runs.procs import Supervisor


def engine_args(engine: str) -> list[str]:
    """The engine flag for ``rolloutbus serve``; none for torch (today's command line). The demo's and fit's. Pure."""
    return ["--engine", engine] if engine != "torch" else []


def served_lora_rank(rank: int) -> int:
    """The policy server's ``--lora-rank`` when the trainer's adapters have rank ``rank``: 0 (merged weights, full
    reloads) above what the server loads at run time. Pure."""
    from trainer.settings import ServeSettings

    most = next(m.le for m in ServeSettings.model_fields["serve_lora_rank"].metadata if hasattr(m, "le"))
    return rank if rank <= most else 0


def engine_start_s(engine: str) -> float:
    """How long a policy server may take to answer: vLLM starts its engine first (~45 s alone on 2 cores). Pure."""
    return 600.0 if engine == "vllm" else 180.0


def wait_http(url: str, timeout: float, sup: Supervisor) -> None:
    """Until ``url`` answers; a supervised process that died first raises its own error."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sup.check()
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RolloutbusError(f"{url} did not answer within {timeout:.0f}s")


@dataclass
class Live:
    """What a run follows on its topics: train steps, versions, groups."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    versions: dict[int, dict[str, Any]] = field(default_factory=dict)
    groups_seen: set[str] = field(default_factory=set)
    groups_teaching: int = 0  # groups seen whose returns differ (not zero_variance: the ones a step can learn from)
    rewards_by_version: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=128))
    lock: threading.Lock = field(default_factory=threading.Lock)


def follow(settings: CommonSettings, live: Live, stop: threading.Event) -> None:
    """Fill ``live`` from the run's metrics, resources and batches topics until ``stop`` is set."""
    from confluent_kafka import Consumer

    from schemas import GroupBatch, ResourceVersion, TrainStep, decode

    t = settings.topics
    c = Consumer({**settings.kafka_conf(), "group.id": f"demo-live-{os.getpid()}-{time.time_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0})
    c.subscribe([t.metrics, t.resources, t.batches])
    try:
        while not stop.is_set():
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            try:
                rec = decode(msg.value())
            except RolloutbusError:
                continue
            with live.lock:
                if isinstance(rec, TrainStep):
                    live.steps.append({"step": rec.step, "version": rec.resource_version, **rec.metrics})
                elif isinstance(rec, ResourceVersion):
                    live.versions[rec.version] = {"uri": rec.uri, "step": rec.step, "metrics": rec.metrics, "config": dict(rec.config)}
                elif isinstance(rec, GroupBatch) and rec.group_id not in live.groups_seen:
                    live.groups_seen.add(rec.group_id)
                    live.groups_teaching += int(not rec.zero_variance)
                    live.rewards_by_version[rec.resource_version if rec.resource_version is not None else -1].extend(rec.rewards)
                    live.recent.extend(rec.rewards)
    finally:
        c.close()


PACES = feeder_choices("pace")  # the feeders' --pace: generation | trainer (producers.settings.FeederSettings)


def waiting_for_trainer(teaching: int, steps: list[dict[str, Any]]) -> int:
    """Groups that teach, generated and not yet taken by the trainer: ``teaching`` seen, less what its steps took
    (trained on, less the zero-variance groups a trainer without --skip-zero-variance trains on too; dropped as stale;
    skipped in a backlog; each step's metrics). Pure."""
    taken = sum(float(st.get("groups", 0.0)) - float(st.get("zero_variance_groups", 0.0))
                + float(st.get("batches_dropped_stale", 0.0)) + float(st.get("batches_skipped_backlog", 0.0)) for st in steps)
    return max(0, teaching - int(taken))


def tasks_ahead(group_size: int, runners: int, groups_per_step: int) -> int:
    """How many tasks the feeder keeps published beyond the groups seen: two steps' worth, or enough to keep
    every runner busy twice over. Pure."""
    return max(2 * groups_per_step, -(-runners // group_size) * 2)


class TaskFeeder:
    """Publishes training tasks (anything with ``to_json()`` and ``text``), keeping only a few steps' worth ahead
    of the trainer. The problems go round in order; with a :class:`~producers.curriculum.Curriculum`, a
    problem whose recent rollouts all earned the same reward is passed over (but for its exploration), so that
    groups are generated for problems that teach; a problem not yet known by its own rollouts is judged by its
    family's (a problem's ``family`` attribute, when it has one). Each task carries its problem's key
    (``metadata["task_key"]``) and family (``metadata["task_family"]``).

    ``pace``: ``generation`` keeps :func:`tasks_ahead` tasks beyond the groups generated, so runners never wait;
    ``trainer`` counts the groups that teach and wait for the trainer (:func:`waiting_for_trainer`) against the same
    allowance, so that generation stays a few groups ahead of the trainer rather than of itself: the runners wait
    while the trainer catches up, the batches stay fresh, and on shared cores the CPU goes to the trainer."""

    def __init__(self, settings: CommonSettings, problems: list[Any], live: Live, *, group_size: int, runners: int,
                 groups_per_step: int, curriculum: Any = None, pace: str = "generation") -> None:
        if pace not in PACES:
            raise ValueError(f"pace must be one of {', '.join(PACES)}, got {pace!r}")
        from confluent_kafka import Producer

        from producers.curriculum import task_key

        self.producer = Producer({**settings.kafka_conf(), "enable.idempotence": True, "log_level": 0})
        self.topic = settings.topics.tasks
        self.problems = problems
        self.keys = [task_key(p.to_json()) for p in problems]
        self.families: list[str | None] = [getattr(p, "family", None) for p in problems]
        self.group_size = group_size
        self.live = live
        self.published = 0
        self.cursor = 0  # the next problem in the round
        self.curriculum = curriculum
        self.ahead = tasks_ahead(group_size, runners, groups_per_step)
        self.pace = pace

    def next_problem(self) -> int:
        """The index of the problem to publish next: the round's next, or with a curriculum the next that it takes
        (the round's next when it takes none)."""
        n = len(self.problems)
        i = self.cursor % n
        if self.curriculum is not None:
            self.curriculum.refresh()
            found = self.curriculum.next_of((j % n, self.keys[j % n], self.families[j % n]) for j in range(self.cursor, self.cursor + n))
            i = i if found is None else found
        self.cursor = i + 1
        return i

    def top_up(self) -> None:
        from producers.curriculum import TASK_FAMILY, TASK_KEY
        from schemas import Task, encode

        with self.live.lock:
            done = len(self.live.groups_seen)
            waiting = waiting_for_trainer(self.live.groups_teaching, self.live.steps) if self.pace == "trainer" else 0
        while self.published - done + waiting < self.ahead:
            i = self.next_problem()
            p, family = self.problems[i], self.families[i]
            task = Task(task_id=f"train-{self.published:05d}", input=p.to_json(), mode="train",
                        group_size=self.group_size, created_ns=time.time_ns(),
                        metadata={"question": p.text, TASK_KEY: self.keys[i], **({TASK_FAMILY: family} if family else {})})
            self.producer.produce(self.topic, key=task.task_id.encode(), value=encode(task))
            self.published += 1
        self.producer.poll(0)

    def selection_line(self) -> str | None:
        """What the task selection did, for the run's report (None without one)."""
        c = self.curriculum
        if c is None:
            return None
        return (f"tasks      {self.published} published; a problem was passed over {c.skipped_solved} times as solved and "
                f"{c.skipped_unsolved} times as failed (its last {c.k} rollouts' rewards all equal), {c.skipped_family} times "
                "on its family's chance of teaching (task selection pass-rate)")

    def close(self) -> None:
        self.producer.flush(10)


__all__ = ["Live", "PACES", "TaskFeeder", "engine_args", "engine_start_s", "follow", "tasks_ahead", "wait_http", "waiting_for_trainer"]
