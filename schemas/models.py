"""Pydantic models that mirror the ``.avsc`` files (the ``.avsc`` files are the source of truth).

Token ids are ``list[int]`` here and packed little-endian uint32 on the wire; logprobs are
``list[float]`` here and packed float32 on the wire. Validators reject values that cannot be right
(negative sequence ids, non-finite rewards, oversized attribute maps) with a message that names the
field, so the stream can send such records to the dead-letter topic with that reason.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_ATTRIBUTES = 1024
MAX_ATTRIBUTE_VALUE_BYTES = 1 << 20
MAX_TOKEN_ID = 0xFFFFFFFF


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)
    schema_name: ClassVar[str]


def _check_attributes(v: dict[str, str]) -> dict[str, str]:
    if len(v) > MAX_ATTRIBUTES:
        raise ValueError(f"{len(v)} attributes, more than the limit of {MAX_ATTRIBUTES}")
    for key, value in v.items():
        if len(value) > MAX_ATTRIBUTE_VALUE_BYTES:
            raise ValueError(f"attribute {key!r} is {len(value)} chars, over {MAX_ATTRIBUTE_VALUE_BYTES}")
    return v


def _check_finite(v: float | None, what: str) -> float | None:
    if v is not None and not math.isfinite(v):
        raise ValueError(f"{what} must be a finite number, got {v}")
    return v


class SpanEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    time_ns: int
    attributes: dict[str, str] = Field(default_factory=dict)


class LLMCall(BaseModel):
    """The first-class part of an LLM span: what the trainer needs."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt_token_ids: list[int] = Field(default_factory=list)
    response_token_ids: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list)
    resource_version: int | None = None
    request_id: str | None = None
    finish_reason: str | None = None

    @field_validator("prompt_token_ids", "response_token_ids")
    @classmethod
    def _token_range(cls, v: list[int]) -> list[int]:
        if v and (min(v) < 0 or max(v) > MAX_TOKEN_ID):
            raise ValueError("token ids must be in 0..2**32-1")
        return v

    @field_validator("response_logprobs")
    @classmethod
    def _logprobs(cls, v: list[float]) -> list[float]:
        for x in v:
            if math.isnan(x) or x > 1e-4:
                raise ValueError(f"log-probabilities must be <= 0 and not NaN, got {x}")
        return v


class Reward(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float
    primary: str = "reward"
    dimensions: dict[str, float] = Field(default_factory=dict)

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        _check_finite(v, "reward value")
        return v

    @field_validator("dimensions")
    @classmethod
    def _dims(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            _check_finite(x, f"reward dimension {k!r}")
        return v


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: str = ""
    result: str | None = None
    ok: bool = True
    error: str | None = None


# Span.sequence_id of a span the process that ran the attempt did not number (an OTLP span without
# one, an Agent Lightning 1.x event, a proxied call without the agent's header): the span stage
# numbers it when it arrives, after every span of the attempt before it on the partition.
UNNUMBERED = 0
# RolloutEvent.metadata key of a FINISHED whose sender cannot know the attempt's spans (an attempt ended
# through Agent Lightning's store API, on any gateway replica): the span stage waits its finish grace
# for spans still on their way instead of completing the attempt at once.
SPANS_UNKNOWN = "rolloutbus.spans_unknown"


class Span(_Record):
    schema_name: ClassVar[str] = "rolloutbus.Span"
    span_id: str
    trace_id: str
    parent_id: str | None = None
    rollout_id: str
    attempt_id: str
    sequence_id: int
    name: str
    kind: str = "span"
    start_time_ns: int
    end_time_ns: int
    status_code: str = "UNSET"
    status_message: str | None = None
    attributes: dict[str, str] = Field(default_factory=dict)
    events: list[SpanEvent] = Field(default_factory=list)
    resource: dict[str, str] = Field(default_factory=dict)
    llm: LLMCall | None = None
    reward: Reward | None = None
    tool: ToolCall | None = None
    agent_name: str | None = None

    @field_validator("sequence_id")
    @classmethod
    def _seq(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"sequence_id must be >= 0, got {v}")
        return v

    @field_validator("rollout_id", "attempt_id", "span_id")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v:
            raise ValueError("must not be empty")
        return v

    @field_validator("attributes", "resource")
    @classmethod
    def _attrs(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_attributes(v)


class RolloutEventType(str, Enum):
    STARTED = "STARTED"
    HEARTBEAT = "HEARTBEAT"
    FINISHED = "FINISHED"


class RolloutEvent(_Record):
    schema_name: ClassVar[str] = "rolloutbus.RolloutEvent"
    rollout_id: str
    attempt_id: str
    event: RolloutEventType
    time_ns: int
    task_id: str
    mode: str = "train"
    attempt: int = 1
    resource_version: int | None = None
    status: str | None = None
    final_reward: float | None = None
    span_count: int = 0
    error: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    @field_validator("final_reward")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        return _check_finite(v, "final_reward")

    @field_validator("span_count")
    @classmethod
    def _count(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"span_count must be >= 0, got {v}")
        return v


class Task(_Record):
    schema_name: ClassVar[str] = "rolloutbus.Task"
    task_id: str
    input: str
    mode: str = "train"
    group_size: int = 1
    created_ns: int = 0
    resource_version: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class Transition(_Record):
    schema_name: ClassVar[str] = "rolloutbus.Transition"
    rollout_id: str
    attempt_id: str
    task_id: str
    span_id: str
    turn: int
    agent_name: str | None = None
    resource_version: int | None = None
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list)
    reward: float = 0.0
    return_: float = 0.0
    advantage: float = 0.0

    @field_validator("reward", "return_", "advantage")
    @classmethod
    def _finite(cls, v: float) -> float:
        _check_finite(v, "reward/return/advantage")
        return v


class GroupBatch(_Record):
    schema_name: ClassVar[str] = "rolloutbus.GroupBatch"
    group_id: str
    task_id: str
    resource_version: int | None = None
    created_ns: int
    group_size: int
    complete: bool = True
    zero_variance: bool = False
    credit: str = "identical"
    rollout_ids: list[str]
    rewards: list[float]
    advantages: list[float]
    transitions: list[Transition]

    @field_validator("rewards", "advantages")
    @classmethod
    def _finite(cls, v: list[float]) -> list[float]:
        for x in v:
            _check_finite(x, "group reward/advantage")
        return v


class ResourceVersion(_Record):
    schema_name: ClassVar[str] = "rolloutbus.ResourceVersion"
    name: str
    version: int
    kind: str = "model"
    uri: str = ""
    base_model: str = ""
    step: int = 0
    created_ns: int
    metrics: dict[str, float] = Field(default_factory=dict)
    config: dict[str, str] = Field(default_factory=dict)


class TrainStep(_Record):
    schema_name: ClassVar[str] = "rolloutbus.TrainStep"
    run_id: str
    step: int
    time_ns: int
    resource_version: int | None = None
    group_ids: list[str] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)


class DeadLetter(_Record):
    schema_name: ClassVar[str] = "rolloutbus.DeadLetter"
    source_topic: str
    partition: int = -1
    offset: int = -1
    key: bytes | None = None
    value: bytes | None = None
    reason: str
    detail: str = ""
    stage: str = ""
    time_ns: int


class Feedback(_Record):
    """A late reward for a rollout (``feedback.avsc``)."""

    schema_name: ClassVar[str] = "rolloutbus.Feedback"
    feedback_id: str
    rollout_id: str
    value: float
    time_ns: int
    source: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        _check_finite(v, "value")
        return v


RECORD_TYPES: tuple[type[_Record], ...] = (
    Span,
    RolloutEvent,
    Task,
    Transition,
    GroupBatch,
    ResourceVersion,
    TrainStep,
    DeadLetter,
    Feedback,
)
Record = _Record
AnyRecord = Any
