"""The write-ups' Python API: ``Trainer``, ``LitAgent``, ``LLM``, ``GRPO``, ``SFT``, ``APO``, ``VERL``, ``PromptTemplate`` and Agent
Lightning's ``emit_*`` (also exported by ``rolloutbus``, so ``import rolloutbus as agl`` serves the write-ups' code)."""

from rolloutbus.trainer_api.agent import LitAgent
from rolloutbus.trainer_api.emit import (
    Operation,
    emit_action,
    emit_annotation,
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    emit_span,
    emit_state,
    emit_tool_call,
    operation,
)
from rolloutbus.trainer_api.logs import configure_logger, setup_logging, setup_module_logging
from rolloutbus.trainer_api.types import AttemptStatus, RolloutMode, RolloutStatus
from rolloutbus.trainer_api.resources import LLM, NamedResources, PromptTemplate, Rollout
from rolloutbus.trainer_api.tracing import agent_scope
from rolloutbus.trainer_api.algorithms import ALGORITHMS, APO, GRPO, SFT, VERL
from rolloutbus.trainer_api.decorators import FunctionalLitAgent, llm_rollout, prompt_rollout, rollout
from rolloutbus.trainer_api.trainer import Trainer

__all__ = ["ALGORITHMS", "APO", "AttemptStatus", "FunctionalLitAgent", "GRPO", "Operation", "RolloutMode", "RolloutStatus", "LLM", "SFT", "VERL", "LitAgent", "NamedResources", "PromptTemplate", "Rollout", "Trainer", "agent_scope",
           "emit_action", "emit_exception", "emit_message", "emit_object", "emit_reward", "emit_span", "emit_state",
           "emit_tool_call", "emit_annotation", "operation", "configure_logger", "setup_logging",
           "setup_module_logging", "llm_rollout", "prompt_rollout", "rollout"]
