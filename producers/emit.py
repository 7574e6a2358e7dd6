"""``emit_*`` helpers: one span each, attributed to the current rollout, next sequence id.

They build the plain Avro dict (no pydantic) and hand it to the transport; the agent pays a few
microseconds. Outside a rollout they raise :class:`~foundation.errors.RolloutContextError`, or do
nothing when ``ROLLOUTBUS_EMIT_OUTSIDE_ROLLOUT=ignore``. Bad telemetry values (a NaN reward) are
logged and counted, never raised into the agent.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from foundation.errors import ServiceError
from schemas.codec import pack_floats, pack_tokens

from producers.context import require_rollout
from producers.spans import base_span, exception_span, to_attr
from producers.transport import SpanTransport

log = logging.getLogger(__name__)


def _attr(value: Any) -> str:
    """:func:`to_attr` with the common values first: a string as is, an int as JSON writes it."""
    t = type(value)
    if t is str:
        return value  # type: ignore[no-any-return]
    if t is int:
        return str(value)
    return to_attr(value)


def emit_state(state: Any, name: str = "state") -> None:
    """Record an observation/state of the environment."""
    ctx = require_rollout()
    if ctx is not None:
        ctx.send_span(base_span(ctx, "state", name, {"state": _attr(state)}))


def emit_action(action: Any, name: str = "action") -> None:
    """Record an action the agent took."""
    ctx = require_rollout()
    if ctx is not None:
        ctx.send_span(base_span(ctx, "action", name, {"action": _attr(action)}))


def emit_message(message: str, role: str | None = None, name: str = "message") -> None:
    """Record a message (text the agent or the environment produced)."""
    ctx = require_rollout()
    if ctx is not None:
        attrs = {"message.body": _attr(message)}
        if role:
            attrs["message.role"] = role
        ctx.send_span(base_span(ctx, "message", name, attrs))


def emit_object(obj: Any, name: str = "object") -> None:
    """Record any JSON-serialisable object."""
    ctx = require_rollout()
    if ctx is not None:
        attrs = {"object.json": to_attr(obj), "object.type": type(obj).__name__}
        ctx.send_span(base_span(ctx, "object", name, attrs))


def emit_reward(value: float | Mapping[str, float], primary: str | None = None, name: str = "reward") -> None:
    """Record a reward: a number, or named dimensions with ``primary`` naming the one that counts.

    The last primary reward of an attempt is its final reward unless one is set explicitly.
    """
    ctx = require_rollout()
    if ctx is None:
        return
    if isinstance(value, Mapping):
        dims = {str(k): float(v) for k, v in value.items()}
        if primary is None:
            primary = next(iter(dims), "reward") if len(dims) == 1 else ("reward" if "reward" in dims else None)
        if primary is None or primary not in dims:
            log.error("emit_reward: primary %r is not one of the dimensions %s; reward not recorded", primary, sorted(dims))
            return
        main = dims[primary]
    else:
        main = float(value)
        primary = primary or "reward"
        dims = {primary: main}
    bad = [k for k, v in dims.items() if not math.isfinite(v)]
    if bad:
        log.error("emit_reward: non-finite reward in %s (rollout %s); not recorded", bad, ctx.rollout_id)
        return
    span = base_span(ctx, "reward", name)
    span["reward"] = {"value": main, "primary": primary, "dimensions": dims}
    ctx.last_reward = main
    ctx.send_span(span)


def emit_tool_call(
    name: str,
    arguments: Any = "",
    result: Any = None,
    ok: bool = True,
    error: str | None = None,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> None:
    """Record a tool call: its arguments, result, and whether it worked."""
    ctx = require_rollout()
    if ctx is None:
        return
    span = base_span(
        ctx, "tool", name, start_ns=start_ns, end_ns=end_ns,
        status="OK" if ok else "ERROR", status_message=None if ok else error,
    )
    span["tool"] = {
        "name": name,
        "arguments": _attr(arguments),
        "result": None if result is None else _attr(result),
        "ok": bool(ok),
        "error": error,
    }
    ctx.send_span(span)


def emit_llm_call(
    prompt_token_ids: Sequence[int] = (),
    response_token_ids: Sequence[int] = (),
    response_logprobs: Sequence[float] = (),
    *,
    model: str | None = None,
    resource_version: int | None = None,
    response_mask: Sequence[int] = (),
    request_id: str | None = None,
    finish_reason: str | None = None,
    name: str = "llm",
    attributes: Mapping[str, Any] | None = None,
    sequence_id: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> None:
    """Record one LLM call with the token ids the trainer needs (packed on the wire)."""
    ctx = require_rollout()
    if ctx is None:
        return
    span = base_span(
        ctx, "llm", name, {k: _attr(v) for k, v in (attributes or {}).items()},
        start_ns=start_ns, end_ns=end_ns, sequence_id=sequence_id,
    )
    if sequence_id is not None:
        ctx.observe_sequence_id(sequence_id)
    span["llm"] = llm_record(
        prompt_token_ids, response_token_ids, response_logprobs, model=model,
        resource_version=resource_version if resource_version is not None else ctx.resource_version,
        response_mask=response_mask, request_id=request_id, finish_reason=finish_reason,
    )
    ctx.send_span(span)


def llm_record(
    prompt_token_ids: Sequence[int],
    response_token_ids: Sequence[int],
    response_logprobs: Sequence[float] = (),
    *,
    model: str | None = None,
    resource_version: int | None = None,
    response_mask: Sequence[int] = (),
    request_id: str | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """The Avro ``LLMCall`` dict (token ids packed uint32, logprobs float32)."""
    return {
        "model": model,
        "prompt_token_ids": pack_tokens(_items(prompt_token_ids)),
        "response_token_ids": pack_tokens(_items(response_token_ids)),
        "response_logprobs": pack_floats(_items(response_logprobs)),
        "response_mask": bytes(response_mask),
        "resource_version": resource_version,
        "request_id": request_id,
        "finish_reason": finish_reason,
    }


def _items(values: Sequence[Any]) -> Any:
    """``values`` as the packer takes them: a list, tuple or ``array`` as it is (no copy of a
    1,000-token prompt), anything else (a generator, bytes, a numpy array) as a list of its items."""
    return values if type(values) in (list, tuple, array) else list(values)


def emit_exception(exc: BaseException, name: str = "exception") -> None:
    """Record an exception (type, message, stack trace)."""
    ctx = require_rollout()
    if ctx is not None:
        ctx.send_span(exception_span(ctx, exc, name))


def emit_span(kind: str, name: str, attributes: Mapping[str, Any] | None = None, **fields: Any) -> None:
    """Record a span of any kind; ``fields`` set Avro fields directly (``status_code``, ``llm``, ...)."""
    ctx = require_rollout()
    if ctx is not None:
        span = base_span(ctx, kind, name, {k: _attr(v) for k, v in (attributes or {}).items()})
        span.update(fields)
        ctx.send_span(span)


# --------------------------------------------------------------------------- late feedback

# The OTLP convention (``POST /v1/feedback/traces`` on the gateway): a span carrying these attributes is a
# Feedback record; the span itself is not stored.
FEEDBACK_ROLLOUT_ID = "rolloutbus.feedback.rollout_id"
FEEDBACK_VALUE = "rolloutbus.feedback.value"
FEEDBACK_ID = "rolloutbus.feedback.id"  # optional: a stable id makes a resend count once (default: the span id)

_feedback: SpanTransport | None = None
_feedback_lock = threading.Lock()


def feedback_record(rollout_id: str, value: float, *, feedback_id: str | None = None, time_ns: int | None = None,
                    source: str = "sdk", metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Avro ``Feedback`` dict; ValueError for an empty rollout id or a value that is not a finite number."""
    if not rollout_id:
        raise ValueError("feedback needs the rollout_id of the rollout it rewards")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"feedback value must be a finite number, got {value!r}")
    return {
        "feedback_id": feedback_id or uuid.uuid4().hex,
        "rollout_id": str(rollout_id),
        "value": v,
        "time_ns": time.time_ns() if time_ns is None else int(time_ns),
        "source": source,
        "metadata": {str(k): _attr(x) for k, x in (metadata or {}).items()},
    }


def set_feedback_transport(transport: SpanTransport | None) -> SpanTransport | None:
    """Install the transport :func:`emit_feedback` uses (returns the previous one)."""
    global _feedback
    with _feedback_lock:
        prev, _feedback = _feedback, transport
    return prev


def feedback_transport() -> SpanTransport:
    """The process's feedback transport (topic ``<prefix>feedback``, spool ``feedback``); built on first use
    from ``ROLLOUTBUS_*`` settings, closed at exit."""
    global _feedback
    with _feedback_lock:
        if _feedback is None:
            import atexit

            from producers.settings import AgentSettings

            s = AgentSettings()
            _feedback = SpanTransport(s.kafka_conf(), s.topics.feedback, s.data_dir / "spool", spool_name="feedback",
                                      spool_max_bytes=s.spool_max_bytes, on_full=s.spool_full_policy,
                                      fsync_interval_s=s.spool_fsync_interval_s)
            atexit.register(_feedback.close)
        return _feedback


def emit_feedback(rollout_id: str, value: float, *, feedback_id: str | None = None, time_ns: int | None = None,
                  metadata: Mapping[str, Any] | None = None, transport: SpanTransport | None = None) -> str | None:
    """Send a reward for a rollout that ended earlier (a user's thumbs-up, a ticket closed): its final reward
    becomes ``value`` if the stream worker's window (``--feedback-window``) has not passed, and a task-less
    rollout trains on it once. Works outside any rollout. → the feedback id (pass the same ``feedback_id``
    when sending one feedback again: it counts once), or None when it was not sent (logged, never raised)."""
    try:
        record = feedback_record(rollout_id, value, feedback_id=feedback_id, time_ns=time_ns, metadata=metadata)
    except ValueError as exc:
        log.error("emit_feedback: %s; not sent", exc)
        return None
    try:
        t = transport or feedback_transport()
        taken = t.emit(record["rollout_id"], "rolloutbus.Feedback", record)
    except ServiceError as exc:  # the transport stopped for good (an ACL refusal, ...): said, not raised
        log.error("emit_feedback: %s; feedback %s for rollout %s not sent", exc, record["feedback_id"], rollout_id)
        return None
    if not taken:
        log.error("emit_feedback: the local queue is full; feedback %s for rollout %s not sent", record["feedback_id"], rollout_id)
        return None
    return str(record["feedback_id"])


__all__ = [
    "FEEDBACK_ID",
    "FEEDBACK_ROLLOUT_ID",
    "FEEDBACK_VALUE",
    "emit_feedback",
    "feedback_record",
    "feedback_transport",
    "set_feedback_transport",
    "emit_state",
    "emit_action",
    "emit_message",
    "emit_object",
    "emit_reward",
    "emit_tool_call",
    "emit_llm_call",
    "emit_exception",
    "emit_span",
    "base_span",
    "llm_record",
    "exception_span",
]
