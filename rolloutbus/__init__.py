"""rolloutbus: reinforcement learning for any LLM agent, built on a message bus.

The import packages are ``producers`` (agent side), ``schemas`` (the Avro contract), ``streams``
(stream processors), ``trainer`` (GRPO) and this one, ``rolloutbus``, which holds what they share:
the error tree, settings, the Kafka and ClickHouse plumbing, and the ``rolloutbus`` command.
"""

__version__ = "0.1.0"

_API = ("Trainer", "LitAgent", "LLM", "GRPO", "SFT", "APO", "VERL", "PromptTemplate", "NamedResources", "Rollout", "agent_scope",
        "emit_state", "emit_action", "emit_reward", "emit_message", "emit_object", "emit_exception", "emit_tool_call",
        "emit_span", "rollout", "llm_rollout", "prompt_rollout", "FunctionalLitAgent", "ALGORITHMS", "emit_annotation",
        "operation", "Operation", "setup_logging", "setup_module_logging", "configure_logger", "RolloutMode", "RolloutStatus",
        "AttemptStatus")


def __getattr__(name: str) -> object:
    """The write-ups' API (``import rolloutbus as agl``; ``from rolloutbus import Trainer, LitAgent, LLM``), imported
    on first use so ``import rolloutbus`` stays light for the command."""
    if name in _API:
        from rolloutbus import trainer_api

        return getattr(trainer_api, name)
    raise AttributeError(f"module 'rolloutbus' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What ``dir(rolloutbus)`` (and an editor's completion) lists: the API above with the module's own names."""
    return sorted({*globals(), *_API})
