"""The rollout context: ``with rollout(...) as r:`` / ``async with arollout(...) as r:``.

Opening a rollout picks (or takes) the rollout and attempt ids, emits a ``RolloutEvent`` STARTED on
``rb.spans`` keyed by the rollout id (so it is ordered with the spans), and makes the rollout current
for this thread/task through a :mod:`contextvars` variable, so nested and async code is attributed
to it. Every span gets the next ``sequence_id`` of the attempt — a counter, never a clock. Leaving the
block emits FINISHED with the status, the final reward and the span count.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any

from foundation.errors import RolloutContextError

from producers.spans import current_parent, exception_span, new_id, new_span_id, new_trace_id, to_attr
from producers.transport import ROLLOUT_EVENT, SpanTransport, get_transport

log = logging.getLogger(__name__)

_current: ContextVar[RolloutContext | None] = ContextVar("rolloutbus_rollout", default=None)


class RolloutContext:
    """One attempt of one rollout: ids, the sequence counter, and where its spans go."""

    __slots__ = (
        "rollout_id", "attempt_id", "task_id", "mode", "attempt", "resource_version", "agent_name",
        "trace_id", "metadata", "resource", "transport", "status", "final_reward", "error",
        "last_reward", "_seq", "_last_seq", "_key",
    )

    def __init__(
        self,
        task_id: str = "",
        *,
        mode: str = "train",
        resource_version: int | None = None,
        agent_name: str | None = None,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        attempt: int = 1,
        metadata: Mapping[str, str] | None = None,
        resource: Mapping[str, str] | None = None,
        transport: SpanTransport | None = None,
        first_sequence_id: int = 1,
    ) -> None:
        self.rollout_id = rollout_id or new_id("ro")
        self.attempt_id = attempt_id or new_id("at")
        self.task_id = task_id
        self.mode = mode
        self.attempt = attempt
        self.resource_version = resource_version
        self.agent_name = agent_name
        self.trace_id = new_trace_id()
        self.metadata = {str(k): str(v) for k, v in (metadata or {}).items()}
        self.resource = dict(resource or {})
        self.transport = transport or get_transport()
        self.status: str | None = None
        self.final_reward: float | None = None
        self.error: str | None = None
        self.last_reward: float | None = None
        # itertools.count's __next__ is atomic under the GIL: threads of one rollout never share an id.
        self._seq = itertools.count(first_sequence_id)
        self._last_seq = first_sequence_id - 1
        self._key = self.rollout_id

    # ------------------------------------------------------------------ sequence ids

    def next_sequence_id(self) -> int:
        """The next sequence id of this attempt (strictly increasing; also for ids handed to the proxy)."""
        n = next(self._seq)
        if n > self._last_seq:
            self._last_seq = n
        return n

    def observe_sequence_id(self, n: int) -> None:
        """Someone else (an OTel span carrying its own id) used ``n``: keep our counter above it."""
        if n > self._last_seq:
            self._last_seq = n
            self._seq = itertools.count(n + 1)

    @property
    def span_count(self) -> int:
        return self._last_seq

    # ------------------------------------------------------------------ emit

    def send_span(self, span: dict[str, Any]) -> None:
        self.transport.emit(self._key, "rolloutbus.Span", span)

    def _event(self, event: str, **extra: Any) -> None:
        record = {
            "rollout_id": self.rollout_id,
            "attempt_id": self.attempt_id,
            "event": event,
            "time_ns": time.time_ns(),
            "task_id": self.task_id,
            "mode": self.mode,
            "attempt": self.attempt,
            "resource_version": self.resource_version,
            "status": None,
            "final_reward": None,
            "span_count": self.span_count,
            "error": None,
            "metadata": self.metadata,
        }
        record.update(extra)
        self.transport.emit(self._key, ROLLOUT_EVENT, record)

    def started(self) -> None:
        self._event("STARTED")

    def heartbeat(self) -> None:
        self._event("HEARTBEAT")

    def set_reward(self, value: float | None) -> None:
        """Set the attempt's final reward (reported on FINISHED)."""
        self.final_reward = None if value is None else float(value)

    def finish(self, status: str | None = None, error: str | None = None) -> None:
        """Emit FINISHED. Final reward: the one set, else the last primary reward emitted."""
        status = status or self.status or "succeeded"
        reward = self.final_reward if self.final_reward is not None else self.last_reward
        if reward is not None and not math.isfinite(reward):
            log.error("rollout %s: final reward %r is not finite; reported as none", self.rollout_id, reward)
            reward = None
        self._event("FINISHED", status=status, final_reward=reward, error=error or self.error)


def current_rollout() -> RolloutContext | None:
    """The rollout open in this thread/task, or None."""
    return _current.get()


def _outside_policy() -> str:
    return os.environ.get("ROLLOUTBUS_EMIT_OUTSIDE_ROLLOUT", "raise").lower()


def require_rollout() -> RolloutContext | None:
    """The current rollout; outside one: RolloutContextError, or None with ``..._OUTSIDE_ROLLOUT=ignore``."""
    ctx = _current.get()
    if ctx is None and _outside_policy() != "ignore":
        raise RolloutContextError(
            "emit_* called outside a rollout: wrap the agent code in `with rollout(task_id=...)`, "
            "or set ROLLOUTBUS_EMIT_OUTSIDE_ROLLOUT=ignore to make these calls no-ops"
        )
    return ctx


def _exception_span(ctx: RolloutContext, exc: BaseException) -> None:
    ctx.send_span(exception_span(ctx, exc))


def _status_for(exc: BaseException) -> str:
    import asyncio

    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
        return "cancelled"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "failed"


@contextmanager
def rollout(task_id: str = "", **kwargs: Any) -> Iterator[RolloutContext]:
    """Open a rollout attempt. Keyword arguments: see :class:`RolloutContext`.

    An exception leaving the block is recorded (an exception span, FINISHED failed) and re-raised.
    """
    ctx = RolloutContext(task_id, **kwargs)
    token = _current.set(ctx)
    ctx.started()
    try:
        yield ctx
    except BaseException as exc:
        _exception_span(ctx, exc)
        ctx.finish(_status_for(exc), error=f"{type(exc).__name__}: {exc}")
        raise
    else:
        ctx.finish()
    finally:
        _current.reset(token)


@asynccontextmanager
async def arollout(task_id: str = "", **kwargs: Any) -> AsyncIterator[RolloutContext]:
    """Async form of :func:`rollout`; the context follows the task (contextvars)."""
    ctx = RolloutContext(task_id, **kwargs)
    token = _current.set(ctx)
    ctx.started()
    try:
        yield ctx
    except BaseException as exc:
        _exception_span(ctx, exc)
        ctx.finish(_status_for(exc), error=f"{type(exc).__name__}: {exc}")
        raise
    else:
        ctx.finish()
    finally:
        _current.reset(token)


__all__ = [
    "RolloutContext",
    "rollout",
    "arollout",
    "current_rollout",
    "require_rollout",
    "current_parent",
    "new_span_id",
    "new_trace_id",
    "to_attr",
]
