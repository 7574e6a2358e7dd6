"""Agent Lightning 0.3's LightningStore HTTP API (``/v1/agl/...``) on the bus: the calls of an attempt. Pure.

What its ``LightningStoreClient`` sends, mapped onto our records (no I/O here; the routes are in
:mod:`producers.ingest.agl.v0_3_store_http`):

* ``POST /spans`` (``add_span``: an Agent Lightning ``Span`` as JSON) → our Avro ``Span`` (:func:`span_from_agl`),
  through the same mapping as OTLP spans, so its reward, LLM and message spans are understood alike;
* ``POST /spans/next`` → the attempt's next sequence id from the control records' counter (1 up, each once, through
  any replica); the span ``add_span`` then sends travels unnumbered, that id kept in an attribute
  (:func:`unnumber`): the span stage numbers every span of an attempt in the order they arrive;
* ``POST /rollouts/{rollout_id}/attempts/{attempt_id}`` (``update_attempt``) with a terminal status →
  the FINISHED event (:func:`finished_from_update`). It carries no reward (Agent Lightning reports
  rewards as spans: the attempt's last reward span is its reward) and cannot know the spans (they may
  come through other replicas), so the span stage waits its finish grace for them;
* ``GET /resources/latest`` and ``/resources/{id}`` → the newest versions on ``rb.resources`` as a
  ``ResourcesUpdate`` (:func:`resources_update`);
* ``POST /workers/{worker_id}`` (heartbeats) → the worker as its in-memory store answers, kept in the control
  records (:mod:`producers.ingest.agl.control`) with the rollouts enqueued, so both read back at once through any
  replica (:mod:`producers.ingest.agl.v0_3_store_http`);
* the reads (``get_rollout_by_id``, ``query_rollouts``, ``query_attempts``, ``get_latest_attempt``,
  ``query_spans``) → ClickHouse's ``rollouts`` (one row per ended attempt) and ``spans``, shaped here
  (:func:`rollouts_from_rows`, :func:`attempt_from_row`, :func:`span_to_agl`, :func:`page`). There a rollout
  shows once an attempt of it ended; its ``input`` is not kept there (null), its final reward and task are
  in its ``metadata``. The rollouts and attempts this API handed out are answered from the control records
  from the start (``update_rollout``'s fields: :func:`check_rollout_update`).
"""

from __future__ import annotations

import json
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


# Where a span sent through ``add_span`` keeps the sequence id Agent Lightning gave it (see :func:`unnumber`).
STORE_SEQUENCE = "agentlightning.store_sequence_id"


def unnumber(span: dict[str, Any]) -> int:
    """Hand the span stage the numbering of a span sent through ``add_span`` (in place): its sequence id (from
    ``get_next_span_sequence_id``, or the caller's own) goes to the attribute :data:`STORE_SEQUENCE` and the span
    travels as :data:`schemas.models.UNNUMBERED`. → the id it came with (0: none).

    Why: one attempt's spans also come unnumbered from elsewhere (OTLP, the proxy), and the stage numbers those one past
    the highest id it has seen, by arrival; an id handed out by the counter but not yet arrived would be given twice.
    The stage is the one place that sees every span of an attempt in one order, so it numbers them all."""
    seq = int(span["sequence_id"])
    if seq != UNNUMBERED:
        span["attributes"] = {**span["attributes"], STORE_SEQUENCE: str(seq)}
        span["sequence_id"] = UNNUMBERED
    return seq


def sequence_key(body: Any) -> str:
    """A ``NextSequenceIdRequest`` → its counter's key (``rollout/attempt``); :class:`MappingError` otherwise."""
    body = _dict(body, "the request")
    rid, aid = body.get("rollout_id"), body.get("attempt_id")
    if not isinstance(rid, str) or not rid or not isinstance(aid, str) or not aid:
        raise MappingError("the request is {\"rollout_id\": <string>, \"attempt_id\": <string>}")
    return f"{rid}/{aid}"


ROLLOUT_STATUSES = ("queuing", "preparing", "running", "succeeded", "failed", "cancelled", "requeuing")
ROLLOUT_FIELDS = ("input", "mode", "resources_id", "status", "config", "metadata")
# The fields of its models, which a query may sort by (its server answers 400 naming them for another).
MODEL_FIELDS = {
    "Rollout": ("rollout_id", "input", "start_time", "end_time", "mode", "resources_id", "status", "config", "metadata"),
    "Attempt": ("rollout_id", "attempt_id", "sequence_id", "start_time", "end_time", "status", "worker_id",
                "last_heartbeat_time", "metadata"),
    "Span": ("rollout_id", "attempt_id", "sequence_id", "trace_id", "span_id", "parent_id", "name", "status", "attributes",
             "events", "links", "start_time", "end_time", "context", "parent", "resource"),
    "Worker": ("worker_id", "status", "heartbeat_stats", "last_heartbeat_time", "last_dequeue_time", "last_busy_time",
               "last_idle_time", "current_rollout_id", "current_attempt_id"),
    "ResourcesUpdate": ("resources_id", "create_time", "update_time", "version", "resources"),
}


class Refused(MappingError):
    """A request its server refuses with 400 rather than its request models' 422: a null where an update needs a value,
    a page it cannot give (an unknown ``sort_by``, ``sort_order``, ``filter_logic``; ``limit`` 0 or below -1; a negative
    ``offset``). The message is its server's."""


def _not_null(body: Mapping[str, Any], fields: tuple[str, ...]) -> None:
    """Its server's ``_get_mandatory_field_or_unset``: a field an update may leave out but not send as null."""
    for key in fields:
        if key in body and body[key] is None:
            raise Refused(f"{key} is invalid; it cannot be a null value.")


def check_page(query: Mapping[str, Any], model: str) -> None:
    """A read's paging checked as its server's ``_validate_paginated_request``: :class:`Refused` with its words."""
    sort_by, order = query.get("sort_by"), query.get("sort_order") or "asc"
    if sort_by is not None and sort_by not in MODEL_FIELDS[model]:
        raise Refused(f"Invalid sort_by: {sort_by}, allowed fields are: {', '.join(MODEL_FIELDS[model])}")
    if order not in ("asc", "desc"):
        raise Refused(f"Invalid sort_order: {order}, allowed values are: asc, desc")
    limit, offset = query.get("limit", -1), query.get("offset", 0)
    if isinstance(limit, int) and (limit == 0 or limit < -1):
        raise Refused("Limit must be greater than 0 or -1 for no limit")
    if isinstance(offset, int) and offset < 0:
        raise Refused("Offset must be greater than or equal to 0")
    if query.get("filter_logic", "and") not in ("and", "or"):
        raise Refused(f"Invalid filter_logic: {query.get('filter_logic')}, allowed values are: and, or")


def check_rollout_update(body: Any) -> dict[str, Any]:
    """An ``UpdateRolloutRequest`` → the fields it sets (those present); :class:`MappingError` naming a bad one."""
    body = _dict(body, "the request")
    _not_null(body, ("status", "config"))
    fields = {k: body[k] for k in ROLLOUT_FIELDS if k in body}
    if "status" in fields and fields["status"] not in ROLLOUT_STATUSES:
        raise MappingError(f"status {fields['status']!r} is not one of {list(ROLLOUT_STATUSES)}")
    if fields.get("mode") is not None and fields["mode"] not in ("train", "val", "test"):
        raise MappingError(f"mode {fields['mode']!r} is not one of train, val, test")
    for key in ("config", "metadata"):
        if fields.get(key) is not None:
            _dict(fields[key], key)
    if fields.get("resources_id") is not None and not isinstance(fields["resources_id"], str):
        raise MappingError("resources_id must be a string")
    return fields


def check_attempt_update(body: Any) -> Mapping[str, Any]:
    """The ``UpdateAttemptRequest`` body, checked; :class:`MappingError` with the reason otherwise."""
    body = _dict(body, "the request")
    _not_null(body, ("status", "worker_id", "last_heartbeat_time", "metadata"))
    status = body.get("status")
    if status is not None and (not isinstance(status, str) or status not in ATTEMPT_STATUSES):
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
    body = _dict(body, "the request")
    _not_null(body, ("heartbeat_stats",))
    stats = body.get("heartbeat_stats")
    return {"worker_id": worker_id, "status": "unknown", "heartbeat_stats": stats if isinstance(stats, Mapping) else None,
            "last_heartbeat_time": now, "last_dequeue_time": None, "last_busy_time": None, "last_idle_time": None,
            "current_rollout_id": None, "current_attempt_id": None}


def agl_resource(rv: ResourceVersion) -> dict[str, Any] | None:
    cfg = rv.config
    if rv.kind == "prompt_template":
        engine = cfg.get("engine", "f-string")
        return {"resource_type": "prompt_template", "template": cfg.get("template", ""),
                "engine": engine if engine in ("jinja", "f-string", "poml") else "f-string"}
    if rv.kind == "model":
        # An LLM the agent calls per rollout: with the proxy's base URL as its endpoint, Agent
        # Lightning's ProxyLLM makes {endpoint}/rollout/{rollout_id}/attempt/{attempt_id}/v1 — the
        # proxy's own route. A plain ``llm`` is one add_resources published as such.
        try:
            sampling = json.loads(cfg["sampling_parameters"]) if cfg.get("sampling_parameters") else {}
        except ValueError:
            sampling = {}
        out = {"resource_type": "llm" if cfg.get("resource_type") == "llm" else "proxy_llm",
               "endpoint": cfg.get("endpoint") or rv.uri, "model": cfg.get("model") or rv.base_model or rv.name,
               "sampling_parameters": sampling if isinstance(sampling, dict) else {}}
        if cfg.get("api_key"):
            out["api_key"] = cfg["api_key"]
        return out
    return None  # Agent Lightning has no resource type for it


ENGINES = ("jinja", "f-string", "poml")


def versions_from_agl(body: Any, current: Mapping[str, ResourceVersion], *, now_ns: int) -> list[ResourceVersion]:
    """``add_resources`` / ``update_resources``: Agent Lightning's ``NamedResources`` → the next version of each
    named resource for rb.resources (one above the newest in ``current``, 1 for a new name). An LLM is a
    ``model`` version (its endpoint, model, sampling parameters and API key in ``config``), a prompt template
    a ``prompt_template`` one; the checkpoint (``uri``, ``base_model``, ``step``) of a model's previous
    version is kept, so a serving process that follows rb.resources keeps its weights.

    Raises :class:`MappingError` naming the first resource that is not one of its types."""
    resources = _dict(body, "the request (NamedResources: {name: resource})")
    if not resources:
        raise MappingError("no resources given: the request is {name: resource}")
    out: list[ResourceVersion] = []
    for name, res in resources.items():
        res = _dict(res, f"resource {name!r}")
        rtype = res.get("resource_type")
        prev = current.get(name)
        version = prev.version + 1 if prev is not None else 1
        if rtype in ("llm", "proxy_llm"):
            endpoint, model, key = res.get("endpoint"), res.get("model"), res.get("api_key")
            if not isinstance(endpoint, str) or not isinstance(model, str):
                raise MappingError(f"resource {name!r}: an {rtype} has a string endpoint and model")
            if key is not None and not isinstance(key, str):
                raise MappingError(f"resource {name!r}: api_key must be a string")
            sampling = _dict(res.get("sampling_parameters"), f"resource {name!r}: sampling_parameters")
            config = {"resource_type": rtype, "endpoint": endpoint, "model": model}
            if sampling:
                config["sampling_parameters"] = json.dumps(sampling)
            if key:
                config["api_key"] = key
            kept = prev if prev is not None and prev.kind == "model" else None
            out.append(ResourceVersion(name=name, version=version, kind="model", uri=kept.uri if kept else "",
                                       base_model=kept.base_model if kept and kept.base_model else model,
                                       step=kept.step if kept else 0, created_ns=now_ns, config=config))
        elif rtype == "prompt_template":
            template, engine = res.get("template"), res.get("engine")
            if not isinstance(template, str) or engine not in ENGINES:
                raise MappingError(f"resource {name!r}: a prompt_template has a string template and an engine, "
                                   f"one of {list(ENGINES)}")
            out.append(ResourceVersion(name=name, version=version, kind="prompt_template", created_ns=now_ns,
                                       config={"template": template, "engine": engine}))
        else:
            raise MappingError(f"resource {name!r}: resource_type {rtype!r} is not one of llm, proxy_llm, prompt_template")
    return out


def resources_id(current: Mapping[str, ResourceVersion]) -> str:
    """The id of a set of versions: ``name=version`` pairs, sorted (``policy=3,prompt=1``)."""
    return ",".join(f"{name}={rv.version}" for name, rv in sorted(current.items()))


def resources_page(update: dict[str, Any] | None, query: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``query_resources``: the newest set (the one the gateway holds), when it matches ``resources_id`` /
    ``resources_id_contains``."""
    if update is None:
        return []
    rid, contains = query.get("resources_id"), query.get("resources_id_contains")
    if rid is not None and update["resources_id"] != rid:
        return []
    if contains is not None and str(contains) not in update["resources_id"]:
        return []
    return [update]


def resources_update(current: Mapping[str, ResourceVersion]) -> dict[str, Any] | None:
    """The newest version of every resource → Agent Lightning's ``ResourcesUpdate`` (None: none yet)."""
    mapped = {name: r for name, rv in current.items() if (r := agl_resource(rv)) is not None}
    if not mapped:
        return None
    kept = {name: current[name] for name in mapped}
    created = max(rv.created_ns for rv in kept.values()) / 1e9
    return {"resources_id": resources_id(kept), "create_time": created, "update_time": created,
            "version": max(rv.version for rv in kept.values()), "resources": mapped}


# ClickHouse's rollouts row: the columns read, in this order.
ROLLOUT_COLUMNS = ("rollout_id", "attempt_id", "task_id", "mode", "attempt", "status", "final_reward", "started_ns",
                   "finished_ns", "metadata")
SPAN_COLUMNS = ("rollout_id", "attempt_id", "sequence_id", "trace_id", "span_id", "parent_id", "name", "status_code",
                "status_message", "attributes", "events", "resource", "start_time_ns", "end_time_ns")
# An ended attempt's status in ClickHouse → Agent Lightning's AttemptStatus, and its rollout's RolloutStatus.
_ATTEMPT_STATUS = {"succeeded": "succeeded", "finished": "succeeded", "failed": "failed", "timeout": "timeout",
                   "timed_out": "timeout", "cancelled": "failed"}
_ROLLOUT_STATUS = {"succeeded": "succeeded", "failed": "failed", "timeout": "failed", "cancelled": "cancelled"}
_DEFAULT_CONFIG = {"timeout_seconds": None, "unresponsive_seconds": None, "max_attempts": 1, "retry_condition": []}


def attempt_from_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``rollouts`` row (one ended attempt) → Agent Lightning's ``Attempt``."""
    finished = row["finished_ns"] / 1e9 if row["finished_ns"] else None
    meta = row.get("metadata") or {}
    return {"rollout_id": row["rollout_id"], "attempt_id": row["attempt_id"], "sequence_id": int(row["attempt"]),
            "start_time": row["started_ns"] / 1e9 if row["started_ns"] else (finished or 0.0), "end_time": finished,
            "status": _ATTEMPT_STATUS.get(row["status"], "failed"), "worker_id": meta.get(WORKER_ATTR),
            "last_heartbeat_time": finished, "metadata": dict(meta)}


def rollouts_from_rows(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rollouts`` rows → Agent Lightning's ``AttemptedRollout`` per rollout (its latest attempt), in the
    order of their first row."""
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_id.setdefault(row["rollout_id"], []).append(row)
    out = []
    for rid, attempts in by_id.items():
        latest = max(attempts, key=lambda r: (r["attempt"], r["finished_ns"]))
        attempt = attempt_from_row(latest)
        started = min((r["started_ns"] for r in attempts if r["started_ns"]), default=latest["finished_ns"])
        out.append({"rollout_id": rid, "input": None, "start_time": started / 1e9, "end_time": attempt["end_time"],
                    "mode": latest["mode"] if latest["mode"] in ("train", "val", "test") else None, "resources_id": None,
                    "status": _ROLLOUT_STATUS.get(attempt["status"], "failed"), "config": dict(_DEFAULT_CONFIG),
                    "metadata": {"task_id": latest["task_id"], "final_reward": latest["final_reward"]},
                    "attempt": attempt})
    return out


FINISHED = ("succeeded", "failed", "cancelled")  # its is_finished()
WAIT_CAP_S = 25.0  # a wait with no timeout: below its client's 30 s request timeout, so it gets an answer


def check_wait(body: Any) -> tuple[list[str], float]:
    """A ``WaitForRolloutsRequest`` → (rollout ids, seconds to wait: its timeout, at most :data:`WAIT_CAP_S`)."""
    body = _dict(body, "the request")
    ids, timeout = body.get("rollout_ids"), body.get("timeout")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise MappingError("rollout_ids must be a list of strings")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout)):
        raise MappingError(f"timeout must be a number of seconds or null, got {timeout!r}")
    return ids, WAIT_CAP_S if timeout is None else max(0.0, min(float(timeout), WAIT_CAP_S))


def finished_rollouts(items: list[dict[str, Any]], rollout_ids: list[str]) -> list[dict[str, Any]]:
    """``wait_for_rollouts``' answer: of ``rollout_ids``, in that order, the rollouts that finished, as its
    ``Rollout`` (no attempt); unknown and unfinished ones are left out, as its store leaves them."""
    by_id = {i["rollout_id"]: i for i in items if i["status"] in FINISHED}
    return [{k: v for k, v in by_id[r].items() if k != "attempt"} for r in rollout_ids if r in by_id]


def _matches(item: Mapping[str, Any], exact: Mapping[str, Any], contains: Mapping[str, Any], logic: str) -> bool:
    tests = [item.get(k) == v for k, v in exact.items() if v is not None]
    tests += [isinstance(item.get(k), str) and v in item[k] for k, v in contains.items() if v is not None]
    if not tests:
        return True
    return all(tests) if logic != "or" else any(tests)


def filter_rollouts(items: list[dict[str, Any]], *, status_in: list[str] | None = None, rollout_id_in: list[str] | None = None,
                    rollout_id_contains: str | None = None, filter_logic: str = "and") -> list[dict[str, Any]]:
    """``query_rollouts``' filters, combined by ``filter_logic`` as its in-memory store does."""
    out = []
    for item in items:
        tests = []
        if status_in is not None:
            tests.append(item["status"] in status_in)
        if rollout_id_in is not None:
            tests.append(item["rollout_id"] in rollout_id_in)
        if rollout_id_contains is not None:
            tests.append(rollout_id_contains in item["rollout_id"])
        if not tests or (any(tests) if filter_logic == "or" else all(tests)):
            out.append(item)
    return out


def filter_spans(items: list[dict[str, Any]], query: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``query_spans``' field filters (``trace_id``, ``span_id``, ``parent_id``, ``name`` and their ``_contains``)."""
    fields = ("trace_id", "span_id", "parent_id", "name")
    exact = {f: query.get(f) for f in fields}
    contains = {f: query.get(f"{f}_contains") for f in fields}
    return [i for i in items if _matches(i, exact, contains, str(query.get("filter_logic") or "and"))]


def page(items: list[dict[str, Any]], *, sort_by: str | None, sort_order: str = "asc", limit: int = -1,
         offset: int = 0) -> dict[str, Any]:
    """Sorted and sliced as Agent Lightning's ``PaginatedResult`` (``limit`` -1: all); ``total`` before slicing.
    A ``sort_by`` that is not a field of the items raises :class:`MappingError`."""
    if offset < 0 or limit == 0 or limit < -1:
        raise Refused("offset must be >= 0 and limit > 0 or -1")
    if sort_by:
        if items and sort_by not in items[0]:
            raise MappingError(f"cannot sort by {sort_by!r}: not a field")
        try:
            items = sorted(items, key=lambda i: (i[sort_by] is None, i[sort_by]), reverse=sort_order == "desc")
        except TypeError:
            raise MappingError(f"cannot sort by {sort_by!r}: not a field of single values") from None
    sliced = items[offset:] if limit == -1 else items[offset:offset + limit]
    return {"items": sliced, "limit": limit, "offset": offset, "total": len(items)}


_QUERY_TYPES: dict[str, tuple[type, ...]] = {
    "rollout_id": (str,), "resources_id": (str,), "resources_id_contains": (str,), "attempt_id": (str,), "rollout_id_contains": (str,), "sort_by": (str,),
    "limit": (int,), "offset": (int,), **{f"{f}{s}": (str,) for f in ("trace_id", "span_id", "parent_id", "name")
                                          for s in ("", "_contains")},
}


def check_query(query: Any) -> dict[str, Any]:
    """A read's query (a search body, or a GET's query string), its fields checked as its server's request
    models check them; :class:`MappingError` naming the first bad one."""
    q = dict(_dict(query, "the query"))
    for key, types in _QUERY_TYPES.items():
        v = q.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, types)):
            raise MappingError(f"{key} must be a {'string' if types == (str,) else 'whole number'}")
    for key in ("status_in", "rollout_id_in"):
        v = q.get(key)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            raise MappingError(f"{key} must be a list of strings")
    if q.get("sort_order") not in (None, "asc", "desc"):
        raise Refused(f"Invalid sort_order: {q['sort_order']}, allowed values are: asc, desc")
    if q.get("filter_logic") not in (None, "and", "or"):
        raise Refused(f"Invalid filter_logic: {q['filter_logic']}, allowed values are: and, or")
    return {k: v for k, v in q.items() if v is not None}


def span_to_agl(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``spans`` row → Agent Lightning's ``Span`` (attribute values as ClickHouse keeps them: strings)."""
    ctx = {"trace_id": row["trace_id"], "span_id": row["span_id"], "is_remote": False, "trace_state": {}}
    parent = row["parent_id"]
    code = str(row["status_code"] or "UNSET").upper()
    return {"rollout_id": row["rollout_id"], "attempt_id": row["attempt_id"], "sequence_id": int(row["sequence_id"]),
            "trace_id": row["trace_id"], "span_id": row["span_id"], "parent_id": parent, "name": row["name"],
            "status": {"status_code": code if code in ("OK", "ERROR") else "UNSET", "description": row["status_message"]},
            "attributes": dict(row["attributes"] or {}),
            "events": [{"name": n, "timestamp": t / 1e9, "attributes": dict(a or {})} for n, t, a in row["events"] or []],
            "links": [], "start_time": row["start_time_ns"] / 1e9, "end_time": row["end_time_ns"] / 1e9, "context": ctx,
            "parent": {**ctx, "span_id": parent} if parent else None,
            "resource": {"attributes": dict(row["resource"] or {}), "schema_url": ""}}


__all__ = ["PREFIX", "TERMINAL", "agl_resource", "ROLLOUT_COLUMNS", "SPAN_COLUMNS", "attempt_from_row", "rollouts_from_rows",
           "filter_rollouts", "filter_spans", "page", "check_page", "Refused", "MODEL_FIELDS", "span_to_agl", "check_query", "span_from_agl", "check_attempt_update", "finished_from_update", "attempt_reply",
           "worker_reply", "resources_update", "resources_id", "versions_from_agl", "check_wait",
           "finished_rollouts", "WAIT_CAP_S", "STORE_SEQUENCE", "unnumber", "sequence_key", "check_rollout_update",
           "resources_page", "ROLLOUT_STATUSES"]
