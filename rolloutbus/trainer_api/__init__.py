"""The write-ups' Python API: ``Trainer``, ``LitAgent``, ``LLM``, ``GRPO``, ``SFT``, ``APO``, ``PromptTemplate`` (also exported by ``rolloutbus``)."""

from rolloutbus.trainer_api.agent import LitAgent
from rolloutbus.trainer_api.resources import LLM, NamedResources, PromptTemplate, Rollout
from rolloutbus.trainer_api.tracing import agent_scope
from rolloutbus.trainer_api.algorithms import APO, GRPO, SFT
from rolloutbus.trainer_api.trainer import Trainer

__all__ = ["APO", "GRPO", "LLM", "SFT", "LitAgent", "NamedResources", "PromptTemplate", "Rollout", "Trainer", "agent_scope"]
