"""The agent library, what runs next to the agent (the base install): the rollout context and ``emit_*``
helpers, the LitAgent-style API, the OpenTelemetry span processor, the span transport and its spool, the
LLM proxy's client side (:mod:`producers.proxy`) and the task runner.

The ingest service that runs on servers (the OTLP gateway, Agent Lightning's APIs, the LLM proxy) is
:mod:`producers.ingest`; nothing here imports it.
"""

from producers.context import RolloutContext, arollout, current_rollout, rollout
from producers.emit import (
    emit_action,
    emit_exception,
    emit_feedback,
    emit_llm_call,
    emit_message,
    emit_object,
    emit_reward,
    emit_span,
    emit_state,
    emit_tool_call,
)
from producers.transport import FullPolicy, SpanTransport, get_transport, set_transport

__all__ = [
    "RolloutContext",
    "rollout",
    "arollout",
    "current_rollout",
    "emit_action",
    "emit_exception",
    "emit_feedback",
    "emit_llm_call",
    "emit_message",
    "emit_object",
    "emit_reward",
    "emit_span",
    "emit_state",
    "emit_tool_call",
    "FullPolicy",
    "SpanTransport",
    "get_transport",
    "set_transport",
]
