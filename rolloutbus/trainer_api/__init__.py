"""The write-ups' Python API: ``Trainer``, ``LitAgent``, ``LLM``, ``GRPO``, ``SFT`` (also exported by ``rolloutbus``)."""

from rolloutbus.trainer_api.agent import LitAgent
from rolloutbus.trainer_api.resources import LLM, NamedResources, Rollout
from rolloutbus.trainer_api.tracing import agent_scope
from rolloutbus.trainer_api.algorithms import GRPO, SFT
from rolloutbus.trainer_api.trainer import Trainer

__all__ = ["GRPO", "LLM", "SFT", "LitAgent", "NamedResources", "Rollout", "Trainer", "agent_scope"]
