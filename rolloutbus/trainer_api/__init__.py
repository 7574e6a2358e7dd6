"""The write-ups' Python API: ``Trainer``, ``LitAgent``, ``LLM``, ``GRPO``, ``SFT``, ``APO``, ``VERL``, ``PromptTemplate`` and Agent
Lightning's ``emit_*`` (also exported by ``rolloutbus``, so ``import rolloutbus as agl`` serves the write-ups' code)."""

from rolloutbus.trainer_api.agent import LitAgent
from rolloutbus.trainer_api.emit import (
    emit_action,
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    emit_span,
    emit_state,
    emit_tool_call,
)
from rolloutbus.trainer_api.resources import LLM, NamedResources, PromptTemplate, Rollout
from rolloutbus.trainer_api.tracing import agent_scope
from rolloutbus.trainer_api.algorithms import APO, GRPO, SFT, VERL
from rolloutbus.trainer_api.trainer import Trainer

__all__ = ["APO", "GRPO", "LLM", "SFT", "VERL", "LitAgent", "NamedResources", "PromptTemplate", "Rollout", "Trainer", "agent_scope",
           "emit_action", "emit_exception", "emit_message", "emit_object", "emit_reward", "emit_span", "emit_state",
           "emit_tool_call"]
