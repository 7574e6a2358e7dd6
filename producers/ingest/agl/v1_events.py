"""Agent Lightning 1.x events → our Avro ``Span`` dicts. Pure: no I/O, no clock, no random ids.

Agent Lightning 1.x agents report to ``AGL_EVENT_URL`` =
``{base}/api/rollouts/{rollout_id}/attempt/{attempt_id}/events`` with ``{"event_type", "data"}``
(its ``EventCreate``). Two types have a known shape, read as its own triplet query reads them:

* ``model_request`` (what its gateway records per LLM call): ``data.response`` is the OpenAI response
  with vLLM's ``prompt_token_ids`` (top level, or on the first choice) and ``choices[0].token_ids``,
  logprobs in ``choices[0].logprobs.content[].logprob`` or ``.token_logprobs``; the legacy list of
  SSE chunks too. → an ``llm`` span (model, ``model_version`` as resource version, response id).
* ``reward``: ``data.value`` (a number). → a ``reward`` span.

Any other type (``agent_output``, user-defined) → an ``object`` span keeping the data as JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from producers.mapping import MappingError, attr_str
from schemas.codec import pack_floats, pack_tokens

EVENT_PATH = "/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"
EVENT_TYPE_ATTR = "agentlightning.event_type"


def attempt_trace_id(rollout_id: str, attempt_id: str) -> str:
    """One trace per attempt, the same for every event of it (events carry no trace of their own)."""
    return hashlib.blake2b(f"{rollout_id}\0{attempt_id}".encode(), digest_size=16).hexdigest()


def _finite(value: Any) -> float | None:
    """A JSON number as a finite float, else None (booleans, strings, NaN, ±inf, and integers too large
    for a float: JSON allows ``1`` followed by 400 zeros)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _ids(value: Any, what: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or any(type(v) is not int or not 0 <= v <= 0xFFFFFFFF for v in value):
        raise MappingError(f"model_request {what} is not a list of token ids (ints in 0..2**32-1)")
    return value


def _logprobs(choice: Mapping[str, Any]) -> list[float]:
    """Chosen-token logprobs of a choice, or [] when missing or unusable (as Agent Lightning drops them)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping):
        return []
    if isinstance(lp.get("content"), list):
        raw = [x.get("logprob") if isinstance(x, Mapping) else None for x in lp["content"]]
    elif isinstance(lp.get("token_logprobs"), list):
        raw = list(lp["token_logprobs"])
    else:
        return []
    try:
        out = [float(v) for v in raw]
    except (TypeError, ValueError):
        return []
    return out if all(math.isfinite(v) for v in out) else []


def _model_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``llm`` record of a model_request event, and the attributes worth keeping."""
    resp = data.get("response")
    prompt: Any = None
    response: list[int] = []
    logprobs: list[float] = []
    response_id = model = finish = None
    if isinstance(resp, Mapping):
        prompt = resp.get("prompt_token_ids")
        choices = resp.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            first = choices[0]
            prompt = prompt or first.get("prompt_token_ids")
            response = _ids(first.get("token_ids"), "choices[0].token_ids")
            logprobs = _logprobs(first)
            finish = first.get("finish_reason")
        response_id, model = resp.get("id"), resp.get("model")
    elif isinstance(resp, list):  # legacy: the raw SSE chunks
        for chunk in resp:
            if not isinstance(chunk, Mapping):
                continue
            prompt = prompt or chunk.get("prompt_token_ids")
            response_id, model = response_id or chunk.get("id"), model or chunk.get("model")
            chunk_choices = chunk.get("choices")
            for ch in chunk_choices if isinstance(chunk_choices, list) else []:
                if isinstance(ch, Mapping) and ch.get("index", 0) == 0:
                    response += _ids(ch.get("token_ids") or [], "choices[0].token_ids")
                    finish = ch.get("finish_reason") or finish
    elif resp is not None:
        raise MappingError("model_request data.response must be the OpenAI response object (or its SSE chunks)")
    try:
        prompt_ids = _ids(prompt, "prompt_token_ids")
    except MappingError:
        # Its server keeps such a request (it only skips deduplicating it): the span has no prompt ids to train on.
        prompt_ids = []
    if len(logprobs) != len(response):
        logprobs = []
    server = data.get("server") if isinstance(data.get("server"), Mapping) else {}
    model = data.get("model") or server.get("model") or model
    version = data.get("model_version", server.get("version"))
    try:
        version = None if version is None else int(version)
    except (TypeError, ValueError, OverflowError):  # int(1e400) is an OverflowError
        version = None
    llm = {
        "model": None if model is None else str(model),
        "prompt_token_ids": pack_tokens(prompt_ids),
        "response_token_ids": pack_tokens(response),
        "response_logprobs": pack_floats([min(0.0, v) for v in logprobs]),
        "response_mask": b"",
        "resource_version": version,
        "request_id": None if response_id is None else str(response_id),
        "finish_reason": None if (finish or data.get("finish_reason")) is None else str(finish or data.get("finish_reason")),
    }
    attrs = {"gen_ai.operation.name": "chat"}
    if llm["request_id"]:
        attrs["gen_ai.response.id"] = llm["request_id"]
    if isinstance(data.get("request"), Mapping) and data["request"].get("model"):
        attrs["gen_ai.request.model"] = str(data["request"]["model"])
    for key in ("http_status", "status", "latency_ms", "retry_count"):
        if data.get(key) is not None:
            attrs[f"agentlightning.{key}"] = attr_str(data[key])
    return llm, attrs


def event_to_span(
    rollout_id: str,
    attempt_id: str,
    event: Any,
    *,
    sequence_id: int,
    span_id: str,
    time_ns: int,
) -> dict[str, Any]:
    """One Agent Lightning 1.x ``EventCreate`` body (parsed JSON) → our Avro Span dict.

    ``time_ns`` is when it arrived (Agent Lightning's store stamps events the same way). Raises
    :class:`MappingError` with the reason when the body is not an event or a known type is malformed.
    """
    if not isinstance(event, Mapping):
        raise MappingError('an event is a JSON object {"event_type": str, "data": {...}}')
    event_type = event.get("event_type")
    if not isinstance(event_type, str) or not event_type:
        raise MappingError("event_type is missing or not a string")
    data = event.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise MappingError(f"data of a {event_type!r} event must be a JSON object")
    if not rollout_id or not attempt_id:
        raise MappingError("the event URL names no rollout or attempt id")

    attrs: dict[str, str] = {EVENT_TYPE_ATTR: event_type}
    llm = reward = None
    status, status_message = "OK", None
    start = time_ns
    if event_type == "model_request":
        kind = "llm"
        llm, extra = _model_request(data)
        attrs.update(extra)
        latency = _finite(data.get("latency_ms"))
        if latency is not None and 0 <= latency * 1e6 <= time_ns:
            start = time_ns - int(latency * 1e6)
        http_status = data.get("http_status")
        if data.get("status") == "error" or (isinstance(http_status, int) and http_status >= 400):
            status = "ERROR"
            err = data.get("response", {}).get("error") if isinstance(data.get("response"), Mapping) else None
            status_message = attr_str(err) if err is not None else f"upstream HTTP {http_status}"
    elif event_type == "reward":
        kind = "reward"
        value = _finite(data.get("value"))
        if value is None:
            raise MappingError(f"reward event data.value must be a finite number, got {str(data.get('value'))[:40]}")
        reward = {"value": value, "primary": "reward", "dimensions": {"reward": value}}
        for key in ("message", "source", "reason"):
            if data.get(key) is not None:
                attrs[f"agentlightning.reward.{key}"] = attr_str(data[key])
    else:
        kind = "object"
        attrs["agentlightning.object.json"] = json.dumps(data, ensure_ascii=False, default=str)
    return {
        "span_id": span_id,
        "trace_id": attempt_trace_id(rollout_id, attempt_id),
        "parent_id": None,
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "sequence_id": sequence_id,
        "name": f"agentlightning.event.{event_type}",
        "kind": kind,
        "start_time_ns": start,
        "end_time_ns": time_ns,
        "status_code": status,
        "status_message": status_message,
        "attributes": attrs,
        "events": [],
        "resource": {"service.name": "agentlightning-agent"},
        "llm": llm,
        "reward": reward,
        "tool": None,
        "agent_name": None,
    }


__all__ = ["event_to_span", "attempt_trace_id", "EVENT_PATH", "EVENT_TYPE_ATTR"]
