"""The tracer a write-ups-style agent gets as ``self.tracer``: it names each LLM call's agent and numbers it,
whatever framework makes the call.

Frameworks (LangChain, LangGraph, the OpenAI Agents SDK, AutoGen, CrewAI through litellm) call their model
with the ``openai`` client, which sends with ``httpx2`` (openai 3) or ``httpx``. Once installed, the tracer
wraps both libraries' ``Client.send`` and ``AsyncClient.send`` (as OpenTelemetry's httpx instrumentation
does) and, inside a rollout:

- a request to the LLM proxy's URL of the current attempt gets the headers the proxy reads: the next
  sequence id of the attempt, the agent's name and the proxy's token (``producers.proxy``), so the proxy's
  span — the one with token ids — carries the right agent and ``agent_match`` can select it;
- with recording on (``Trainer.dev``: no proxy), a chat completion to any endpoint is recorded as an LLM
  span with its text, the same name and number.

Only calls made inside :func:`tracing` (every rollout the Trainer API runs) are touched. The agent's name is
the LangGraph node the call runs in (LangChain's running config), else the one set by
:func:`agent_scope` or by the LangChain handler, else the rollout's agent name.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from producers.context import RolloutContext, current_rollout
from producers.proxy import AGENT_HEADER, SEQUENCE_HEADER, proxy_token
from producers.spans import base_span, to_attr

_agent: ContextVar[str | None] = ContextVar("rolloutbus_agent_name", default=None)
_recording: ContextVar[bool] = ContextVar("rolloutbus_record_llm_calls", default=False)
# Only the rollouts the Trainer API runs are touched: other code in the process (another agent, a test)
# keeps its requests as it wrote them.
_active: ContextVar[bool] = ContextVar("rolloutbus_trace_http", default=False)
_install_lock = threading.Lock()
_installed = False
LLM_PATHS = ("/chat/completions", "/completions")


def current_agent_name(ctx: RolloutContext | None) -> str | None:
    """The name of the agent making a call now (see the module docstring)."""
    try:
        from langchain_core.runnables.config import var_child_runnable_config
    except ImportError:
        node = None
    else:
        config = var_child_runnable_config.get() or {}
        node = (config.get("metadata") or {}).get("langgraph_node")
    return node or _agent.get() or (ctx.agent_name if ctx is not None else None)


@contextlib.contextmanager
def _holding(var: ContextVar[Any], value: Any) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def agent_scope(name: str) -> contextlib.AbstractContextManager[None]:
    """LLM calls made in this block are ``name``'s (for frameworks whose agents the tracer cannot see)."""
    return _holding(_agent, name)


def tracing() -> contextlib.AbstractContextManager[None]:
    """Name and number the LLM calls made in this block (the hook installed if it was not)."""
    install()
    return _holding(_active, True)


def recording() -> contextlib.AbstractContextManager[None]:
    """Record chat completions to any endpoint as LLM spans in this block (the dry run has no proxy)."""
    install()
    return _holding(_recording, True)


def _route(ctx: RolloutContext, request: Any) -> str | None:
    if not _active.get():
        return None
    path = request.url.path
    if f"/rollout/{ctx.rollout_id}/attempt/{ctx.attempt_id}/" in path:
        return "proxy"
    if _recording.get() and request.method == "POST" and path.endswith(LLM_PATHS):
        return "record"
    return None


def _proxy_headers(ctx: RolloutContext, request: Any) -> None:
    if SEQUENCE_HEADER not in request.headers:  # an agent that numbers its calls itself keeps its numbers
        request.headers[SEQUENCE_HEADER] = str(ctx.next_sequence_id())
    name = current_agent_name(ctx)
    if name and AGENT_HEADER not in request.headers:
        request.headers[AGENT_HEADER] = name
    token = proxy_token()
    if token:
        request.headers["Authorization"] = f"Bearer {token}"  # the proxy's; the client's key never goes upstream


def _record(ctx: RolloutContext, request: Any, response: Any, seq: int, start_ns: int) -> None:
    """One LLM span for a chat completion seen by the dry run: prompt and completion text, no token ids."""
    from producers.emit import llm_record

    try:
        body = json.loads(request.content or b"{}")
    except ValueError:
        body = {}
    data: dict[str, Any] = {}
    if response.headers.get("content-type", "").startswith("application/json"):
        try:
            data = json.loads(response.content)
        except ValueError:
            data = {}
    choice = (data.get("choices") or [{}])[0]
    completion = (choice.get("message") or {}).get("content") or choice.get("text") or ""
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": to_attr(body.get("model", "")),
             "gen_ai.prompt": to_attr(body.get("messages", body.get("prompt", ""))), "gen_ai.completion": to_attr(completion),
             "http.status_code": str(response.status_code)}
    ok = response.status_code < 300
    span = base_span(ctx, "llm", "chat.completions", attrs, start_ns=start_ns, end_ns=time.time_ns(), sequence_id=seq,
                     status="OK" if ok else "ERROR", status_message=None if ok else f"HTTP {response.status_code}")
    span["agent_name"] = current_agent_name(ctx)
    span["llm"] = llm_record([], [], model=data.get("model"), request_id=data.get("id"), finish_reason=choice.get("finish_reason"))
    ctx.send_span(span)


HTTP_LIBRARIES = ("httpx", "httpx2")  # openai 3 sends with httpx2, most other clients with httpx


def install() -> None:
    """Wrap ``send`` of httpx's (and httpx2's) clients once per process (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        import importlib

        for name in HTTP_LIBRARIES:
            try:
                lib = importlib.import_module(name)
            except ImportError:
                continue
            lib.Client.send = _sync_send(lib.Client.send)
            lib.AsyncClient.send = _async_send(lib.AsyncClient.send)
        _installed = True


def _sync_send(original: Any) -> Any:
    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        ctx = current_rollout()
        route = _route(ctx, request) if ctx is not None else None
        if route == "proxy":
            _proxy_headers(ctx, request)  # type: ignore[arg-type]
        if route != "record":
            return original(self, request, **kwargs)
        seq, start = ctx.next_sequence_id(), time.time_ns()  # type: ignore[union-attr]
        response = original(self, request, **kwargs)
        response.read()
        _record(ctx, request, response, seq, start)  # type: ignore[arg-type]
        return response

    return send


def _async_send(original: Any) -> Any:
    async def send(self: Any, request: Any, **kwargs: Any) -> Any:
        ctx = current_rollout()
        route = _route(ctx, request) if ctx is not None else None
        if route == "proxy":
            _proxy_headers(ctx, request)  # type: ignore[arg-type]
        if route != "record":
            return await original(self, request, **kwargs)
        seq, start = ctx.next_sequence_id(), time.time_ns()  # type: ignore[union-attr]
        response = await original(self, request, **kwargs)
        await response.aread()
        _record(ctx, request, response, seq, start)  # type: ignore[arg-type]
        return response

    return send


class Tracer:
    """``self.tracer`` of a :class:`~rolloutbus.trainer_api.agent.LitAgent`: installs the httpx hook; hands out
    a LangChain callback handler."""

    def __init__(self) -> None:
        install()

    def get_langchain_handler(self) -> Any:
        """A LangChain callback handler: the node a chat model runs in names its calls; tools become tool spans."""
        return _langchain_handler()


def _langchain_handler() -> Any:
    from langchain_core.callbacks import BaseCallbackHandler

    from producers.emit import emit_tool_call

    class RolloutbusHandler(BaseCallbackHandler):  # type: ignore[misc]
        """Names LLM calls after their LangGraph node; records LangChain tools as tool spans."""

        def __init__(self) -> None:
            self._tools: dict[Any, tuple[str, str, int]] = {}

        def on_chat_model_start(self, serialized: Any, messages: Any, *, metadata: dict[str, Any] | None = None,
                                **kwargs: Any) -> None:
            node = (metadata or {}).get("langgraph_node")
            if node:
                _agent.set(str(node))  # this node's context only: LangGraph runs each task in a copy

        def on_tool_start(self, serialized: Any, input_str: str, *, run_id: Any = None, **kwargs: Any) -> None:
            self._tools[run_id] = ((serialized or {}).get("name") or kwargs.get("name") or "tool", input_str, time.time_ns())

        def on_tool_end(self, output: Any, *, run_id: Any = None, **kwargs: Any) -> None:
            name, args, start = self._tools.pop(run_id, ("tool", "", None))
            if current_rollout() is not None:
                emit_tool_call(name, arguments=args, result=str(output), ok=True, start_ns=start)

        def on_tool_error(self, error: BaseException, *, run_id: Any = None, **kwargs: Any) -> None:
            name, args, start = self._tools.pop(run_id, ("tool", "", None))
            if current_rollout() is not None:
                emit_tool_call(name, arguments=args, ok=False, error=f"{type(error).__name__}: {error}", start_ns=start)

    return RolloutbusHandler()


__all__ = ["Tracer", "agent_scope", "current_agent_name", "install", "recording", "tracing"]
