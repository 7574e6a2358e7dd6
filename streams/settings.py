"""Settings of the stream worker (``rolloutbus process``), from ``ROLLOUTBUS_*`` environment variables."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator

from foundation.health import health_settings
from foundation.registry import registered_in
from foundation.trackers import check_names  # light: the registry, not the trackers' libraries

METRICS_PORT = 9101  # the trainer's is 9100: both run on one host in the local stack


class StreamSettings(health_settings("streams", METRICS_PORT, 120.0, "records wait and nothing was processed")):  # type: ignore[misc]
    """One field per concern; each is ``ROLLOUTBUS_<FIELD>`` in the environment and a flag on the CLI."""

    group_size: int = Field(default=4, ge=1, description="Rollouts per GRPO group.")
    group_min_rollouts: int = Field(default=2, ge=1, description="Fewest rollouts a group emits with at its timeout.")
    group_timeout_s: float = Field(default=300.0, gt=0, description="Emit a group this long after its first rollout finished.")
    scale_by_std: bool = Field(default=True, description="Divide advantages by the group's std (GRPO); false: R - mean.")
    credit: str = Field(default="identical", description="Credit assignment: a registered credit mode (streams.credit.CREDIT: "
                        "identical, discounted, per-turn, or one a plugin registers).")
    advantage_estimator: str = Field(default="grpo", description="How a group's step returns become advantages: a registered "
                                     "estimator (streams.grouping.ESTIMATORS: grpo, rloo, or one a plugin registers).")
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="Discount for credit=discounted.")
    agent_match: str | None = Field(default=None, description="Regex of the agent names to train; unset: all.")
    llm_call_match: str | None = Field(default=None, description="Regex of span names that are LLM calls; unset: any span with an LLM record.")
    exclude_llm_call_in_reward: bool = Field(default=True, description="LLM calls inside a reward span (an LLM judge) are not steps.")
    reward_rules: Path | None = Field(default=None, description="TOML/JSON file of intermediate reward rules.")
    rollout_timeout_s: float = Field(default=600.0, gt=0, description="A rollout with no record for this long is timed out.")
    finish_grace_s: float = Field(
        default=10.0, gt=0, description="After FINISHED, how long to wait for spans up to its span_count (other producers)."
    )
    completed_retention_s: float = Field(default=3600.0, gt=0, description="How long a completed rollout is remembered (late-span detection).")
    sink_batch_size: int = Field(default=20000, ge=1, description="Rows buffered before a ClickHouse insert.")
    sink_interval_s: float = Field(default=1.0, gt=0, description="Longest time rows wait before a ClickHouse insert.")
    sink_pipelined: bool = Field(default=True, description="Read on while ClickHouse inserts a batch (one in flight); "
                                 "false: each insert is waited for (less CPU where the worker shares its cores with the store).")
    feedback_window_s: float = Field(default=3600.0, gt=0, description="Late feedback is applied when given at most this "
                                     "long after its rollout finished; later, it is dead-lettered (feedback.after_window).")
    feedback_baseline: str = Field(default="loo", description="Advantage of a task-less rollout trained on its feedback: a "
                                   "registered baseline (streams.baselines.FEEDBACK_BASELINES): loo (reward minus the agent's running "
                                   "leave-one-out mean), prompt (minus the running mean of the earlier feedback on the same prompt), "
                                   "none, or one a plugin registers.")
    state_store: str = Field(default="memory://", description="faust table store: memory:// or rocksdb:// (needs rocksdict).")
    shutdown_timeout_s: float = Field(
        default=60.0, gt=0, description="On SIGTERM: flush and commit within half of this, exit within all of it."
    )
    app_id: str | None = Field(default=None, description="Consumer group / app id. Default: <topic_prefix>streams.")
    # streams_: ROLLOUTBUS_REPORT_TO is the trainer's; one variable for both would report the worker wherever the
    # trainer reports (the local stack passes its environment to both).
    streams_report_to: str = Field(default="", description="Experiment trackers the worker reports its emitted groups to, "
                                   "comma-separated: tensorboard, mlflow, wandb (foundation.trackers.TRACKERS; empty: none).")
    tracker_dir: Path | None = Field(default=None, description="Where the trackers write; default <data_dir>/trackers.")
    report_interval_s: float = Field(default=30.0, gt=0, description="Seconds between two reports to the trackers.")


    check_credit = field_validator("credit")(registered_in("streams.credit:CREDIT"))
    check_estimator = field_validator("advantage_estimator")(registered_in("streams.grouping:ESTIMATORS"))
    check_baseline = field_validator("feedback_baseline")(registered_in("streams.baselines:FEEDBACK_BASELINES"))

    check_report_to = field_validator("streams_report_to")(check_names)

    @field_validator("reward_rules")
    @classmethod
    def _rules_file_exists(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_file():
            raise ValueError("must be an existing .toml or .json file")
        return v

    @field_validator("agent_match", "llm_call_match")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"must be a regular expression ({exc})") from exc
        return v

    @field_validator("state_store")
    @classmethod
    def _store_scheme(cls, v: str) -> str:
        if not v.startswith(("memory://", "rocksdb://")):
            raise ValueError("must be memory:// or rocksdb://")
        return v

    @property
    def application_id(self) -> str:
        return self.app_id or f"{self.topic_prefix}streams"

    def resolved_tracker_dir(self) -> Path:
        return self.tracker_dir or self.data_dir / "trackers"
