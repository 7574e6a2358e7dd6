"""Settings of the producer-side process kinds, read once at their entry points (``ROLLOUTBUS_*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from foundation.config import PORT, CommonSettings, check_http_url


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


class GatewaySettings(AgentSettings):
    """``rolloutbus gateway``: the OTLP/HTTP ingest endpoint."""

    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(default=4318, **PORT)
    gateway_max_body_bytes: int = Field(default=16 << 20, ge=1, description="Larger (decompressed) bodies get 413.")
    gateway_token: SecretStr | None = Field(default=None, description="Bearer token clients must send; unset: no auth.")
    gateway_retry_after_s: int = Field(default=5, ge=0)
    gateway_agl_claim_timeout_s: float = Field(
        default=600.0, gt=0, description="Agent Lightning's queue (/v1/agl): a dequeued rollout with no terminal "
        "update_attempt within this time is ended as timeout and offered again (longer than an attempt runs, plus "
        "the stream worker's finish grace).")
    gateway_agl_max_attempts: int = Field(default=2, ge=1, description="Attempts per dequeued rollout (1 = no retry).")
    llm_proxy_token: SecretStr | None = Field(
        default=None, description="The token of rolloutbus proxy (its ROLLOUTBUS_PROXY_TOKEN), sent with the LLM calls "
        "Agent Lightning 1.x's agents make through the gateway's /proxy/... route.")
    insecure: bool = Field(default=False, description="Listen on a non-loopback address without a token (logged loudly).")


class ProxySettings(AgentSettings):
    """``rolloutbus proxy``: the OpenAI-compatible LLM proxy that records token ids."""

    proxy_host: str = "127.0.0.1"
    proxy_port: int = Field(default=8788, **PORT)
    proxy_upstream: str | None = Field(default=None, description="Upstream OpenAI-compatible base URL, e.g. http://host:8000/v1.")
    proxy_upstream_api_key: SecretStr | None = None
    proxy_token: SecretStr | None = Field(default=None, description="Bearer token clients must send; unset: no auth.")
    proxy_timeout_s: float = Field(default=600.0, gt=0)
    proxy_upstream_kind: Literal["vllm", "rolloutbus-serve", "openai"] = Field(
        default="vllm", description="What the upstream accepts: vllm and rolloutbus-serve are asked for token ids and "
        "logprobs; openai is sent the request as the client wrote it (its spans carry text, flagged without token ids).")
    proxy_max_response_bytes: int = Field(default=16 << 20, ge=1, description="Upstream answers larger than this get 502.")
    insecure: bool = Field(default=False, description="Listen on a non-loopback address without a token (logged loudly).")

    @field_validator("proxy_upstream")
    @classmethod
    def _upstream_url(cls, v: str | None) -> str | None:
        if v is not None:
            check_http_url(v)
        return v


class RunnerSettings(AgentSettings):
    """``rolloutbus run-agent``: consumes rb.tasks and runs the agent."""

    runner_group: str = Field(default="rolloutbus-runners", description="Consumer group on rb.tasks.")
    runner_concurrency: int = Field(default=4, ge=1, description="Rollouts run at the same time.")
    runner_max_attempts: int = Field(default=2, ge=1, description="Attempts per rollout (1 = no retry).")
    runner_timeout_s: float = Field(default=600.0, gt=0, description="An attempt running longer is ended as timeout.")
    runner_heartbeat_s: float = Field(default=10.0, gt=0)


__all__ = ["AgentSettings", "GatewaySettings", "ProxySettings", "RunnerSettings"]
