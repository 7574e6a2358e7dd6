"""A span as the plain Avro dict the transport sends: its ids and the fields every span has.

The rollout context (:mod:`producers.context`) and the ``emit_*`` helpers (:mod:`producers.emit`) both
build spans here; this module knows a rollout only through :class:`SpanOwner`.
"""

from __future__ import annotations

import json
import os
import random
import time
import traceback
import uuid
from contextvars import ContextVar
from typing import Any, Protocol

# The span id new spans hang under (set by the OTel processor while an OTel span is active).
current_parent: ContextVar[str | None] = ContextVar("rolloutbus_parent", default=None)

_rand = random.Random(int.from_bytes(os.urandom(8), "little"))
# Span ids drawn 512 at a time (one getrandbits and one hex() for all of them): an emit takes one from
# the list. ``list.pop`` is atomic, so threads never get the same one.
_POOL = 512
_span_ids: list[str] = []


def _reseed() -> None:
    """A forked child must not draw the ids its parent draws (same generator state, same pool)."""
    _rand.seed(int.from_bytes(os.urandom(8), "little"))
    _span_ids.clear()


os.register_at_fork(after_in_child=_reseed)


def new_span_id() -> str:
    try:
        return _span_ids.pop()
    except IndexError:
        h = _rand.getrandbits(64 * _POOL).to_bytes(8 * _POOL, "little").hex()
        _span_ids.extend([h[i:i + 16] for i in range(16, len(h), 16)])
        return h[:16]


def new_trace_id() -> str:
    return f"{_rand.getrandbits(128):032x}"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class SpanOwner(Protocol):
    """What a span takes from the rollout attempt it belongs to."""

    trace_id: str
    rollout_id: str
    attempt_id: str
    resource: dict[str, str]
    agent_name: str | None

    def next_sequence_id(self) -> int: ...


def to_attr(value: Any) -> str:
    """Attribute values are strings on the wire; others are JSON-encoded."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def base_span(
    ctx: SpanOwner,
    kind: str,
    name: str,
    attributes: dict[str, str] | None = None,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
    status: str = "UNSET",
    status_message: str | None = None,
    sequence_id: int | None = None,
) -> dict[str, Any]:
    """The Avro dict of a span in ``ctx`` with every field set (first-class parts None)."""
    now = time.time_ns()
    return {
        "span_id": new_span_id(),
        "trace_id": ctx.trace_id,
        "parent_id": current_parent.get(),
        "rollout_id": ctx.rollout_id,
        "attempt_id": ctx.attempt_id,
        "sequence_id": ctx.next_sequence_id() if sequence_id is None else sequence_id,
        "name": name,
        "kind": kind,
        "start_time_ns": start_ns or now,
        "end_time_ns": end_ns or now,
        "status_code": status,
        "status_message": status_message,
        "attributes": attributes or {},
        "events": [],
        "resource": ctx.resource,
        "llm": None,
        "reward": None,
        "tool": None,
        "agent_name": ctx.agent_name,
    }


def exception_span(ctx: SpanOwner, exc: BaseException, name: str = "exception") -> dict[str, Any]:
    """A span recording ``exc`` with the OpenTelemetry ``exception.*`` attributes."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    attrs = {
        "exception.type": type(exc).__qualname__,
        "exception.message": str(exc),
        "exception.stacktrace": tb[-16384:],
    }
    span = base_span(ctx, "exception", name, attrs, status="ERROR", status_message=f"{type(exc).__name__}: {exc}")
    span["events"] = [{"name": "exception", "time_ns": span["end_time_ns"], "attributes": attrs}]
    return span


__all__ = ["SpanOwner", "base_span", "current_parent", "exception_span", "new_id", "new_span_id", "new_trace_id", "to_attr"]
