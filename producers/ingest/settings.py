"""Settings of the ingest service's process kinds, read once at their entry points (``ROLLOUTBUS_*``): the
gateway and the LLM proxy. Each writes spans through a span transport, so each is an agent's settings and more."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from foundation.config import PORT, check_http_url
from producers.settings import AgentSettings


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


__all__ = ["GatewaySettings", "ProxySettings"]
