"""Settings of the agent-side process kinds, read once at their entry points (``ROLLOUTBUS_*``): an agent's
span transport and ``rolloutbus run-agent``. The ingest service's are :mod:`producers.ingest.settings`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from foundation.config import CommonSettings, check_values, choices_of, default_of


class AgentSettings(CommonSettings):
    """An agent process: how its span transport behaves."""

    spool_max_bytes: int = Field(default=1 << 30, ge=1, description="Bound of the on-disk spool (bytes).")
    spool_full_policy: Literal["drop_newest", "block"] = Field(
        default="drop_newest", description="What a full spool does to new spans: drop them (counted, logged) or block."
    )
    spool_fsync_interval_s: float = Field(default=1.0, ge=0)
    emit_outside_rollout: Literal["raise", "ignore"] = Field(
        default="raise", description="emit_* outside a rollout: raise RolloutContextError, or do nothing."
    )
    agent_name: str | None = None


class RunnerSettings(AgentSettings):
    """``rolloutbus run-agent``: consumes rb.tasks and runs the agent."""

    runner_group: str = Field(default="rolloutbus-runners", description="Consumer group on rb.tasks.")
    runner_concurrency: int = Field(default=4, ge=1, description="Rollouts run at the same time.")
    runner_max_attempts: int = Field(default=2, ge=1, description="Attempts per rollout (1 = no retry).")
    runner_timeout_s: float = Field(default=600.0, gt=0, description="An attempt running longer is ended as timeout.")
    runner_heartbeat_s: float = Field(default=10.0, gt=0)


class FeederSettings(CommonSettings):
    """A task feeder's choices (the demo's, ``Trainer.fit``'s, ``rolloutbus tasks publish``'s): which tasks get groups,
    and what generation stays ahead of. Declared once here: the three take their defaults, flags and checks from it."""

    task_selection: Literal["all", "pass-rate"] = Field(
        default="all", description="all (in turn), or pass-rate: a task whose last selection_k rollouts all earned the "
                                   "same reward is passed over but for selection_explore of the times (producers.curriculum).")
    selection_k: int = Field(default=8, ge=1, description="pass-rate: a task's rollouts looked at.")
    selection_explore: float = Field(default=0.1, ge=0, le=1,
                                     description="pass-rate: the chance a passed-over task is taken all the same.")
    pace: Literal["generation", "trainer"] = Field(
        default="generation", description="What generation stays a few groups ahead of: itself (the runners never wait) "
                                          "or the trainer (the teaching groups that wait for it count too).")


def feeder_default(field: str) -> Any:
    """A :class:`FeederSettings` field's default, for the API's and the demo's own fields. Pure."""
    return default_of(FeederSettings, field)


def feeder_choices(field: str) -> tuple[str, ...]:
    """The values a ``Literal`` field of :class:`FeederSettings` takes (the flags' ``choices``). Pure."""
    return choices_of(FeederSettings, field)


def check_feeder(values: dict[str, Any], name: str = "{}") -> None:
    """ConfigError for the first of ``values`` (field → value) that breaks its :class:`FeederSettings` rule, naming it
    as ``name.format(field)`` (``GRPO({}=...)``); the environment is not read. Pure."""
    check_values(FeederSettings, values, name)


__all__ = ["AgentSettings", "FeederSettings", "RunnerSettings", "check_feeder", "feeder_choices", "feeder_default"]
