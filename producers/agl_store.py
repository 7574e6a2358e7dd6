"""Agent Lightning 0.3's LightningStore HTTP API (``/v1/agl/...``) on the bus: the calls of an attempt. Pure.

What its ``LightningStoreClient`` sends, mapped onto our records (no I/O here; the routes are in
:mod:`producers.agl_store_http`):

* ``POST /spans`` (``add_span``: an Agent Lightning ``Span`` as JSON) → our Avro ``Span`` (:func:`span_from_agl`),
  through the same mapping as OTLP spans, so its reward, LLM and message spans are understood alike;
* ``POST /spans/next`` → sequence id 0: numbering is the span stage's (:data:`schemas.models.UNNUMBERED`),
  which stays right with any number of gateway replicas; Agent Lightning itself builds spans with 0
  when it has no number;
* ``POST /rollouts/{rollout_id}/attempts/{attempt_id}`` (``update_attempt``) with a terminal status →
  the FINISHED event (:func:`finished_from_update`). It carries no reward (Agent Lightning reports
  rewards as spans: the attempt's last reward span is its reward) and cannot know the spans (they may
  come through other replicas), so the span stage waits its finish grace for them;
* ``GET /resources/latest`` and ``/resources/{id}`` → the newest versions on ``rb.resources`` as a
  ``ResourcesUpdate`` (:func:`resources_update`);
* ``POST /workers/{worker_id}`` (heartbeats) → the worker as its in-memory store answers; the bus keeps no
  worker table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from producers.mapping import Attribution, MappingError, otel_to_span
from schemas.models import SPANS_UNKNOWN, UNNUMBERED, ResourceVersion, RolloutEvent

PREFIX = "/v1/agl"
# Agent Lightning's AttemptStatus values that end an attempt (``unresponsive`` is a watchdog's guess that
# a later heartbeat can undo; ``preparing``/``running`` are progress).
TERMINAL = {"succeeded": "succeeded", "failed": "failed", "timeout": "timeout"}
ATTEMPT_STATUSES = {"preparing", "running", "unresponsive", *TERMINAL}
WORKER_ATTR = "agentlightning.worker_id"


def _seconds_to_ns(value: Any, what: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise MappingError(f"{what} must be a time in seconds, got {value!r}")
    return int(value * 1e9)


def _dict(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MappingError(f"{what} must be a JSON object")
    return value


def span_from_agl(body: Any, *, now_ns: int) -> dict[str, Any]:
    """An Agent Lightning ``Span`` (``span.model_dump(mode="json")``) → our Avro ``Span`` dict.

    Raises :class:`MappingError` with the reason when the body is not one."""
    if not isinstance(body, Mapping):
        raise MappingError("a span is a JSON object (Agent Lightning's Span)")
    rollout_id, attempt_id = body.get("rollout_id"), body.get("attempt_id")
    if not isinstance(rollout_id, str) or not rollout_id or not isinstance(attempt_id, str) or not attempt_id:
        raise MappingError("the span names no rollout_id / attempt_id")
    seq = body.get("sequence_id", UNNUMBERED)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise MappingError(f"sequence_id must be an integer >= 0, got {seq!r}")
    span_id, trace_id, name = body.get("span_id"), body.get("trace_id"), body.get("name")
    for key, v in (("span_id", span_id), ("trace_id", trace_id), ("name", name)):
        if not isinstance(v, str) or not v:
            raise MappingError(f"{key} is missing or not a string")
    status = _dict(body.get("status"), "status")
    resource = _dict(_dict(body.get("resource"), "resource").get("attributes"), "resource.attributes")
    start = _seconds_to_ns(body.get("start_time"), "start_time", now_ns)
    end = _seconds_to_ns(body.get("end_time"), "end_time", start)
    events = []
    for ev in body.get("events") or []:
        ev = _dict(ev, "an event")
        events.append((str(ev.get("name", "")), _seconds_to_ns(ev.get("timestamp"), "event timestamp", start),
                       _dict(ev.get("attributes"), "event attributes")))
    parent = body.get("parent_id")
    # The body's ids are where Agent Lightning's store files the span: they win over any in its attributes.
    attrs = {k: v for k, v in _dict(body.get("attributes"), "attributes").items()
             if k not in ("agentlightning.rollout_id", "agentlightning.attempt_id", "agentlightning.span_sequence_id")}
    res = {k: v for k, v in resource.items()
           if k not in ("agentlightning.rollout_id", "agentlightning.attempt_id", "agentlightning.span_sequence_id")}
    return otel_to_span(
        name=name, span_id=span_id, trace_id=trace_id, parent_id=parent if isinstance(parent, str) and parent else None,
        start_ns=start, end_ns=end, status_code=str(status.get("status_code") or "UNSET").upper(),
        status_message=status.get("description") if isinstance(status.get("description"), str) else None,
        attributes=attrs, events=events, resource=res,
        attribution=Attribution(rollout_id=rollout_id, attempt_id=attempt_id, sequence_id=seq),
    )


def check_attempt_update(body: Any) -> Mapping[str, Any]:
    """The ``UpdateAttemptRequest`` body, checked; :class:`MappingError` with the reason otherwise."""
    body = _dict(body, "the request")
    status = body.get("status")
    if status is not None and status not in ATTEMPT_STATUSES:
        raise MappingError(f"status {status!r} is not one of {sorted(ATTEMPT_STATUSES)}")
    if body.get("metadata") is not None:
        _dict(body["metadata"], "metadata")
    return body


def finished_from_update(rollout_id: str, attempt_id: str, body: Mapping[str, Any], *, now_ns: int) -> RolloutEvent | None:
    """``update_attempt`` → the FINISHED event when its status ends the attempt, else None (progress,
    a heartbeat). The task, mode and attempt number are the STARTED's (the span stage fills them in)."""
    status = body.get("status")
    if status not in TERMINAL:
        return None
    metadata = {SPANS_UNKNOWN: "1"}
    if isinstance(body.get("worker_id"), str):
        metadata[WORKER_ATTR] = body["worker_id"]
    return RolloutEvent(rollout_id=rollout_id, attempt_id=attempt_id, event="FINISHED", time_ns=now_ns, task_id="",
                        status=TERMINAL[status], final_reward=None, span_count=0, metadata=metadata)


def attempt_reply(rollout_id: str, attempt_id: str, body: Mapping[str, Any], *, now: float) -> dict[str, Any]:
    """The ``Attempt`` an update answers with. The bus keeps no attempt table: what the request says,
    with its time; ``sequence_id`` (the attempt's number) and ``start_time`` are not known here."""
    status = body.get("status") or "running"
    return {
        "rollout_id": rollout_id, "attempt_id": attempt_id, "sequence_id": 1, "start_time": now,
        "end_time": now if status in TERMINAL else None, "status": status, "worker_id": body.get("worker_id"),
        "last_heartbeat_time": body.get("last_heartbeat_time") or now, "metadata": body.get("metadata"),
    }


def worker_reply(worker_id: str, body: Any, *, now: float) -> dict[str, Any]:
    """The ``Worker`` a heartbeat (``update_worker``) answers with, as its in-memory store does."""
    stats = _dict(body, "the request").get("heartbeat_stats")
    return {"worker_id": worker_id, "status": "unknown", "heartbeat_stats": stats if isinstance(stats, Mapping) else None,
            "last_heartbeat_time": now, "last_dequeue_time": None, "last_busy_time": None, "last_idle_time": None,
            "current_rollout_id": None, "current_attempt_id": None}


def _resource(rv: ResourceVersion) -> dict[str, Any] | None:
    cfg = rv.config
    if rv.kind == "prompt_template":
        engine = cfg.get("engine", "f-string")
        return {"resource_type": "prompt_template", "template": cfg.get("template", ""),
                "engine": engine if engine in ("jinja", "f-string", "poml") else "f-string"}
    if rv.kind == "model":
        # An LLM the agent calls per rollout: with the proxy's base URL as its endpoint, Agent
        # Lightning's ProxyLLM makes {endpoint}/rollout/{rollout_id}/attempt/{attempt_id}/v1 — the
        # proxy's own route.
        return {"resource_type": "proxy_llm", "endpoint": cfg.get("endpoint") or rv.uri,
                "model": cfg.get("model") or rv.base_model or rv.name, "sampling_parameters": {}}
    return None  # Agent Lightning has no resource type for it


def resources_id(current: Mapping[str, ResourceVersion]) -> str:
    """The id of a set of versions: ``name=version`` pairs, sorted (``policy=3,prompt=1``)."""
    return ",".join(f"{name}={rv.version}" for name, rv in sorted(current.items()))


def resources_update(current: Mapping[str, ResourceVersion]) -> dict[str, Any] | None:
    """The newest version of every resource → Agent Lightning's ``ResourcesUpdate`` (None: none yet)."""
    mapped = {name: r for name, rv in current.items() if (r := _resource(rv)) is not None}
    if not mapped:
        return None
    kept = {name: current[name] for name in mapped}
    created = max(rv.created_ns for rv in kept.values()) / 1e9
    return {"resources_id": resources_id(kept), "create_time": created, "update_time": created,
            "version": max(rv.version for rv in kept.values()), "resources": mapped}


__all__ = ["PREFIX", "TERMINAL", "span_from_agl", "check_attempt_update", "finished_from_update", "attempt_reply",
           "worker_reply", "resources_update", "resources_id"]
