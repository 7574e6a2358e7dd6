"""Settings of the stream worker (``rolloutbus process``), from ``ROLLOUTBUS_*`` environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from rolloutbus.config import CommonSettings


class StreamSettings(CommonSettings):
    """One field per concern; each is ``ROLLOUTBUS_<FIELD>`` in the environment and a flag on the CLI."""

    group_size: int = Field(default=4, ge=1, description="Rollouts per GRPO group.")
    group_min_rollouts: int = Field(default=2, ge=1, description="Fewest rollouts a group emits with at its timeout.")
    group_timeout_s: float = Field(default=300.0, gt=0, description="Emit a group this long after its first rollout finished.")
    scale_by_std: bool = Field(default=True, description="Divide advantages by the group's std (GRPO); false: R - mean.")
    credit: str = Field(default="identical", description="Credit assignment: identical | discounted | per-turn.")
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="Discount for credit=discounted.")
    agent_match: str | None = Field(default=None, description="Regex of the agent names to train; unset: all.")
    reward_rules: Path | None = Field(default=None, description="TOML/JSON file of intermediate reward rules.")
    rollout_timeout_s: float = Field(default=600.0, gt=0, description="A rollout with no record for this long is timed out.")
    finish_grace_s: float = Field(
        default=10.0, gt=0, description="After FINISHED, how long to wait for spans up to its span_count (other producers)."
    )
    completed_retention_s: float = Field(default=3600.0, gt=0, description="How long a completed rollout is remembered (late-span detection).")
    sink_batch_size: int = Field(default=20000, ge=1, description="Rows buffered before a ClickHouse insert.")
    sink_interval_s: float = Field(default=1.0, gt=0, description="Longest time rows wait before a ClickHouse insert.")
    metrics_port: int = Field(default=0, ge=0, description="Prometheus /metrics port; 0: off.")
    state_store: str = Field(default="memory://", description="faust table store: memory:// or rocksdb:// (needs rocksdict).")
    shutdown_timeout_s: float = Field(
        default=60.0, gt=0, description="On SIGTERM: flush and commit within half of this, exit within all of it."
    )
    app_id: str | None = Field(default=None, description="Consumer group / app id. Default: <topic_prefix>streams.")

    @property
    def application_id(self) -> str:
        return self.app_id or f"{self.topic_prefix}streams"
