"""What runs next to the agent: the rollout context and ``emit_*`` helpers, the LitAgent-style API,
the OpenTelemetry exporter, the OTLP gateway, the LLM proxy and the task runner.

Heavy parts (aiohttp, OpenTelemetry SDK) are imported only by the modules that need them.
"""

from producers.context import RolloutContext, arollout, current_rollout, rollout
from producers.emit import (
    emit_action,
    emit_exception,
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
