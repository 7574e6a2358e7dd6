"""What runs one attempt of an agent: :class:`AttemptRunner` opens its rollout context, calls
``rollout(task, resources, rollout) -> float | None`` (sync or async), and ends the attempt from what it returned.

The agent class users write is ``rolloutbus.LitAgent`` (one class, resources under their names with the policy as
``main_llm``); ``rolloutbus run-agent`` and the Trainer run it through an :class:`AttemptRunner`
(``LitAgent.as_runner_agent()``). :func:`litagent` makes one of a plain function for the agent library alone (the
bus's resource records as they are).

The returned float is the attempt's final reward. An exception ends the attempt as failed, recorded
as an exception span; it is not raised to the caller (the runner decides on a retry).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from contextvars import copy_context
from dataclasses import dataclass
from typing import Any

from schemas.models import ResourceVersion

from producers.context import RolloutContext, _current
from producers.spans import exception_span

log = logging.getLogger(__name__)


@dataclass
class AttemptResult:
    """How one attempt ended."""

    rollout_id: str
    attempt_id: str
    attempt: int
    status: str  # succeeded | failed | timeout | cancelled
    reward: float | None = None
    error: str | None = None


class AttemptRunner:
    """Runs attempts of an agent (its context, spans, final reward, timeout, heartbeats). ``name`` becomes every span's
    ``agent_name``; a subclass implements :meth:`rollout`."""

    name: str | None = None

    def rollout(self, task: Any, resources: Mapping[str, ResourceVersion], rollout: RolloutContext) -> float | None:
        raise NotImplementedError("implement rollout(task, resources, rollout) -> float | None")

    # ------------------------------------------------------------------ running

    def _begin(self, task_id: str, **kwargs: Any) -> RolloutContext:
        kwargs.setdefault("agent_name", self.name or type(self).__name__)
        ctx = RolloutContext(task_id, **kwargs)
        ctx.started()
        return ctx

    @staticmethod
    def _end(ctx: RolloutContext, result: Any, exc: BaseException | None, status: str | None = None) -> AttemptResult:
        if exc is not None:
            ctx.send_span(exception_span(ctx, exc))
            error = f"{type(exc).__name__}: {exc}"
            status = status or ("cancelled" if isinstance(exc, asyncio.CancelledError) else "failed")
            ctx.finish(status, error=error)
            return AttemptResult(ctx.rollout_id, ctx.attempt_id, ctx.attempt, status, None, error)
        if result is not None:
            try:
                ctx.set_reward(float(result))
            except (TypeError, ValueError):
                log.error("agent returned %r, not a number; no final reward recorded", result)
        ctx.finish("succeeded")
        reward = ctx.final_reward if ctx.final_reward is not None else ctx.last_reward
        return AttemptResult(ctx.rollout_id, ctx.attempt_id, ctx.attempt, "succeeded", reward)

    def run(self, task: Any, resources: Mapping[str, ResourceVersion] | None = None, *, task_id: str = "", **kwargs: Any) -> AttemptResult:
        """Run one attempt in this thread (an async ``rollout`` runs on a fresh event loop)."""
        ctx = self._begin(task_id, **kwargs)

        def body() -> Any:
            _current.set(ctx)
            out = self.rollout(task, resources or {}, ctx)
            if inspect.isawaitable(out):
                out = asyncio.run(_awaitable(out))
            return out

        try:
            result = copy_context().run(body)
        except Exception as exc:  # noqa: BLE001 - the agent's failure is data
            return self._end(ctx, None, exc)
        return self._end(ctx, result, None)

    async def arun(
        self, task: Any, resources: Mapping[str, ResourceVersion] | None = None, *, task_id: str = "",
        timeout: float | None = None, heartbeat_s: float | None = None, **kwargs: Any,
    ) -> AttemptResult:
        """Run one attempt on the running loop (a sync ``rollout`` runs in a worker thread).

        ``timeout`` ends a stuck attempt as ``timeout``; ``heartbeat_s`` emits HEARTBEAT events meanwhile.
        """
        ctx = self._begin(task_id, **kwargs)
        token = _current.set(ctx)
        beat = asyncio.create_task(_heartbeats(ctx, heartbeat_s)) if heartbeat_s else None
        try:
            if inspect.iscoroutinefunction(self.rollout):
                coro = self.rollout(task, resources or {}, ctx)
            else:
                cctx = copy_context()
                coro = asyncio.to_thread(cctx.run, self.rollout, task, resources or {}, ctx)
            result = await asyncio.wait_for(coro, timeout)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            return self._end(ctx, None, TimeoutError(f"attempt exceeded {timeout}s"), "timeout") if timeout else self._end(ctx, None, exc)
        except Exception as exc:  # noqa: BLE001
            return self._end(ctx, None, exc)
        finally:
            _current.reset(token)
            if beat is not None:
                beat.cancel()
        return self._end(ctx, result, None)


async def _heartbeats(ctx: RolloutContext, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        ctx.heartbeat()


async def _awaitable(aw: Any) -> Any:
    return await aw


class _FunctionAgent(AttemptRunner):
    def __init__(self, fn: Callable[..., Any], name: str | None) -> None:
        self._fn = fn
        self.name = name or fn.__name__
        if inspect.iscoroutinefunction(fn):
            async def arollout(task: Any, resources: Mapping[str, ResourceVersion], rollout: RolloutContext) -> Any:
                return await fn(task, resources, rollout)

            self.rollout = arollout  # type: ignore[method-assign]

    def rollout(self, task: Any, resources: Mapping[str, ResourceVersion], rollout: RolloutContext) -> float | None:
        return self._fn(task, resources, rollout)  # type: ignore[no-any-return]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)


def function_runner(fn: Callable[..., Any], name: str | None = None) -> AttemptRunner:
    """What runs attempts of a plain function ``fn(task, resources, rollout) -> float | None`` that takes the bus's
    own records (``rolloutbus run-agent module:fn``). Not a decorator for users: their agents are
    ``rolloutbus.LitAgent`` or ``@agl.rollout`` functions (the one agent API)."""
    return _FunctionAgent(fn, name)


__all__ = ["AttemptRunner", "AttemptResult", "function_runner"]
