"""Settings of the agent-side process kinds, read once at their entry points (``ROLLOUTBUS_*``): an agent's
span transport and ``rolloutbus run-agent``. The ingest service's are :mod:`producers.ingest.settings`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from foundation.config import CommonSettings


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


__all__ = ["AgentSettings", "RunnerSettings"]
