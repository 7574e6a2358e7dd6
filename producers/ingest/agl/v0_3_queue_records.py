"""Agent Lightning 0.3's queue calls on rb.tasks (``enqueue_rollout(s)``, ``dequeue_rollout(s)``,
``start_rollout``): the task record an enqueued rollout becomes, and the ``Rollout`` / ``AttemptedRollout``
its store answers. Pure (the routes are :mod:`producers.ingest.agl.v0_3_store_http`, the queue
:mod:`producers.ingest.agl.queue`).

The metadata keys on a task that 1.x's rollouts write too (the rollout's id, its config), and the attempt ids,
are the queue's claims' (:mod:`producers.ingest.agl.claims`), which read them back.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from producers.ingest.agl.claims import CONFIG, ROLLOUT_ID
from schemas.models import Task

# Task metadata keys of a rollout enqueued through the store API, besides the claims' (its id, its config):
# what its dequeue gives back.
RESOURCES_ID = "agl.resources_id"
METADATA = "agl.metadata"
DEFAULT_CONFIG = {"timeout_seconds": None, "unresponsive_seconds": None, "max_attempts": 1, "retry_condition": []}
MODES = ("train", "val", "test")


class EnqueueError(ValueError):
    """An enqueue request that is not Agent Lightning's ``EnqueueManyRolloutsRequest``."""


def new_rollout_id() -> str:
    """A rollout id as Agent Lightning's store makes them (``ro-`` + 12 characters)."""
    return "ro-" + uuid.uuid4().hex[:12]


def enqueue_requests(body: Any) -> list[Mapping[str, Any]]:
    """The ``rollouts`` of an ``EnqueueManyRolloutsRequest`` (also a bare ``RolloutRequest``), checked."""
    if not isinstance(body, Mapping):
        raise EnqueueError("the request is a JSON object with a list 'rollouts'")
    items = body["rollouts"] if "rollouts" in body else [body]
    if not isinstance(items, list):
        raise EnqueueError("'rollouts' must be a list")
    for n, item in enumerate(items):
        if not isinstance(item, Mapping) or "input" not in item:
            raise EnqueueError(f"rollouts[{n}] is not an object with an 'input'")
        if item.get("mode") is not None and item["mode"] not in MODES:
            raise EnqueueError(f"rollouts[{n}].mode {item['mode']!r} is not one of {list(MODES)}")
        if item.get("resources_id") is not None and not isinstance(item["resources_id"], str):
            raise EnqueueError(f"rollouts[{n}].resources_id must be a string")
        for key in ("config", "metadata"):
            if item.get(key) is not None and not isinstance(item[key], Mapping):
                raise EnqueueError(f"rollouts[{n}].{key} must be an object")
    return items


def task_from_request(req: Mapping[str, Any], *, rollout_id: str, resources_id: str | None, now_ns: int,
                      defaults: Mapping[str, Any] | None = None) -> Task:
    """One enqueued rollout → the task record on rb.tasks (keyed by its ``task_id``, the rollout id). Its config
    is the request's, what it leaves out taken from ``defaults`` (the gateway's: :meth:`ClaimBook.defaults`),
    then from Agent Lightning's own defaults; a null ``max_attempts`` or ``timeout_seconds`` is the default's."""
    given = {k: v for k, v in (req.get("config") or {}).items()
             if v is not None or k not in ("max_attempts", "timeout_seconds")}
    config = {**DEFAULT_CONFIG, **(defaults or {}), **given}
    metadata = {ROLLOUT_ID: rollout_id, CONFIG: json.dumps(config), METADATA: json.dumps(req.get("metadata") or {})}
    if resources_id is not None:
        metadata[RESOURCES_ID] = resources_id
    return Task(task_id=rollout_id, input=json.dumps(req["input"]), mode=req.get("mode") or "train", group_size=1,
                created_ns=now_ns, metadata=metadata)


def rollout_reply(task: Task, rollout_id: str, *, status: str = "queuing") -> dict[str, Any]:
    """Agent Lightning's ``Rollout`` for a task (as its in-memory store answers an enqueue)."""
    meta = task.metadata
    try:
        payload: Any = json.loads(task.input)
    except ValueError:
        payload = task.input  # plain text input
    try:
        config = {**DEFAULT_CONFIG, **json.loads(meta.get(CONFIG, "{}"))}
        metadata = json.loads(meta[METADATA]) if METADATA in meta else {k: v for k, v in meta.items()}
    except (ValueError, TypeError):
        config, metadata = dict(DEFAULT_CONFIG), {}
    return {"rollout_id": rollout_id, "input": payload, "start_time": task.created_ns / 1e9 or time.time(),
            "end_time": None, "mode": task.mode if task.mode in MODES else None, "resources_id": meta.get(RESOURCES_ID),
            "status": status, "config": config, "metadata": metadata}


def attempted_rollout(task: Task, rollout_id: str, *, attempt_id: str, attempt: int, worker_id: str | None,
                      now: float) -> dict[str, Any]:
    """Agent Lightning's ``AttemptedRollout``: what its store's dequeue answers for a claim (the claim's attempt
    number as the attempt's ``sequence_id``), and ``start_rollout`` for the attempt it starts."""
    reply = rollout_reply(task, rollout_id, status="preparing")
    reply["attempt"] = {"rollout_id": rollout_id, "attempt_id": attempt_id, "sequence_id": attempt, "start_time": now,
                        "end_time": None, "status": "preparing", "worker_id": worker_id, "last_heartbeat_time": None,
                        "metadata": None}
    return reply


__all__ = ["EnqueueError", "enqueue_requests", "task_from_request", "rollout_reply", "attempted_rollout", "new_rollout_id",
           "DEFAULT_CONFIG", "MODES", "RESOURCES_ID", "METADATA"]
