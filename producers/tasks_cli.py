"""``rolloutbus tasks publish FILE.jsonl``: publish tasks to rb.tasks.

Each line is a JSON object: ``{"task_id": ..., "input": <any JSON>, "mode": "train", "group_size": 4}``
(``input`` that is not a string is JSON-encoded; a missing ``task_id`` gets one). A bad line is an
error naming its line number; nothing is published from a file with bad lines.

``--task-selection pass-rate`` publishes only the train tasks that teach (:mod:`producers.curriculum`): a task
whose last ``--selection-k`` finished rollouts in ClickHouse all earned the same reward is left out, but for
``--selection-explore`` of them, and a task with fewer of its own is published with the chance that a group of its
family (``metadata.task_family``, over the family's last 4 x k rollouts) teaches; a task is known by
``metadata.task_key`` when it has one, else by its ``task_id`` (a
line without one gets a ``task_key``: its input's digest, so that publishing the file again finds its history).
"""

from __future__ import annotations

import argparse
import json
import random
import time
import uuid
from pathlib import Path
from typing import Any

from foundation.errors import ConfigError, KafkaUnavailable
from foundation.flags import Bounded, describe_flags
from producers.curriculum import TASK_FAMILY, TASK_KEY, task_key
from producers.settings import feeder_choices

# flag dest → producers.settings.FeederSettings field (its default, bounds and variable)
_FLAGS = {"task_selection": "task_selection", "selection_k": "selection_k", "selection_explore": "selection_explore"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tasks_command", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("publish", help="publish tasks from a JSONL file")
    p.add_argument("file", type=Path)
    p.add_argument("--group-size", type=Bounded(int, ge=1), default=None, help="default group_size for lines without one")
    p.add_argument("--task-selection", choices=feeder_choices("task_selection"), default=None,
                   help="all, or pass-rate: leave out train tasks whose last --selection-k rollouts in ClickHouse "
                        "all earned the same reward (always solved, or never), but for --selection-explore of them; a task with fewer "
                        "of its own goes with the chance that a group of its metadata.task_family teaches")
    p.add_argument("--selection-k", type=int, default=None, help="--task-selection pass-rate: rollouts looked at")
    p.add_argument("--selection-explore", type=float, default=None,
                   help="--task-selection pass-rate: the chance a left-out task is published all the same")
    describe_flags(p, "producers.settings:FeederSettings", list(_FLAGS))


def parse_tasks(lines: list[str], group_size: int | None = None) -> list[Any]:
    """JSONL lines → Task models; ConfigError naming the first bad line."""
    from pydantic import ValidationError as PydanticError

    from schemas.models import Task

    tasks = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict) or "input" not in obj:
                raise ValueError('expected an object with an "input"')
            if not isinstance(obj["input"], str):
                obj["input"] = json.dumps(obj["input"])
            if "task_id" not in obj:  # a made-up id; the task is known to task selection by its input's digest
                obj["task_id"] = f"task-{uuid.uuid4().hex[:12]}"
                obj["metadata"] = {TASK_KEY: task_key(obj["input"]), **(obj.get("metadata") or {})}
            obj["task_id"] = str(obj["task_id"])
            if group_size is not None:
                obj.setdefault("group_size", group_size)
            obj.setdefault("created_ns", time.time_ns())
            if "metadata" in obj:
                obj["metadata"] = {str(k): str(v) for k, v in obj["metadata"].items()}
            tasks.append(Task(**obj))
        except (ValueError, TypeError, PydanticError) as exc:
            raise ConfigError(f"line {n}: not a task: {exc}") from exc
    return tasks


def single_rollout_line(tasks: list[Any]) -> str | None:
    """The warning for train tasks that run once (group_size 1, the default for a line without one): no GRPO group
    of the stream worker's size fills from them, so nothing trains and the worker only says so minutes later."""
    n = sum(1 for t in tasks if t.mode == "train" and t.group_size < 2)
    if not n:
        return None
    return (f"warning: {n} of {len(tasks)} train tasks have group_size 1 (the default for a line without one): each runs "
            "once, and the stream worker trains on groups of rollouts of one task (`rolloutbus process --group-size`, "
            'default 4): add "group_size" to those lines or publish with --group-size 4')


def select_tasks(tasks: list[Any], curriculum: Any) -> tuple[list[Any], int]:
    """The tasks to publish and how many train tasks the curriculum left out (test tasks always go). Pure given the
    curriculum's read."""
    curriculum.refresh()
    kept = [t for t in tasks
            if t.mode != "train" or curriculum.take(t.metadata.get(TASK_KEY) or t.task_id, t.metadata.get(TASK_FAMILY),
                                                      max(t.group_size, 2))]
    return kept, len(tasks) - len(kept)


def run(args: argparse.Namespace) -> int:
    import sys

    from confluent_kafka import Producer

    from foundation.entry import settings_from_args
    from producers.settings import FeederSettings
    from schemas.codec import encode

    s = feed = settings_from_args(FeederSettings, args, _FLAGS)  # the common settings and the feeder's, one read
    try:
        lines = args.file.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read {args.file}: {exc}") from exc
    tasks = parse_tasks(lines, args.group_size)
    left_out = 0
    if feed.task_selection == "pass-rate":
        from foundation.clickhouse import connect
        from producers.curriculum import Curriculum, recent_tasks_and_families

        # Read once, and here a failed read is the command's error: nothing is published on a guess.
        client = connect(s.dsn, database=s.clickhouse_database, password=s.clickhouse_password, create_database=False)
        try:
            recent, families = recent_tasks_and_families(client, feed.selection_k, 4 * feed.selection_k)
        finally:
            client.close()
        # Seeded afresh each time: the same left-out tasks must not be the ones explored on every publish.
        curriculum = Curriculum(lambda: recent, k=feed.selection_k, explore=feed.selection_explore, rng=random.Random(),
                                read_families=lambda: families)
        tasks, left_out = select_tasks(tasks, curriculum)
    warning = single_rollout_line(tasks)
    if warning:
        print(warning, file=sys.stderr)
    from confluent_kafka import KafkaError

    from foundation.kafka_admin import kafka_failure

    conf = {**s.kafka_conf(), "enable.idempotence": True, "log_level": 0}
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    def error_cb(err: KafkaError) -> None:
        # A fatal producer error (an ACL refusal under idempotence) comes here, not to each delivery report.
        if err.fatal() or err.code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED):
            failures.append(err)

    producer = Producer({**conf, "error_cb": error_cb})
    action = f"write topic {s.topics.tasks}"
    for t in tasks:
        producer.produce(s.topics.tasks, encode(t), t.task_id.encode(), on_delivery=on_delivery)
        producer.poll(0)
        if failures:
            raise kafka_failure(conf, failures[0], action)
    left = producer.flush(30)
    if failures:
        raise kafka_failure(conf, failures[0], action)
    if left:
        raise KafkaUnavailable(f"{left} tasks not delivered to {s.bootstrap} within 30s")
    print(f"published {len(tasks)} tasks to {s.topics.tasks}"
          + (f"; left out {left_out} whose last {feed.selection_k} rollouts all earned the same reward, or whose family's "
             "groups seldom teach" if left_out else ""))
    return 0
