"""What an agent needs to call its LLM through ``rolloutbus proxy``: the proxy's URL for the current rollout
attempt and the headers that number the call and carry the proxy's token.

The proxy itself is a server process, part of the ingest service (:mod:`producers.ingest.llm_proxy`); this
module needs the base install only.
"""

from __future__ import annotations

import os

from foundation.errors import RolloutContextError

from producers.context import current_rollout

# Headers the proxy reads from an agent's request (the sequence id, the agent's name) and from its upstream's
# answer (the serving resource version).
SEQUENCE_HEADER = "x-rolloutbus-sequence-id"
AGENT_HEADER = "x-rolloutbus-agent-name"
VERSION_HEADER = "x-rolloutbus-resource-version"


def proxy_url(base: str) -> str:
    """The OpenAI base URL (``.../v1``) of the proxy at ``base`` for the current rollout attempt."""
    ctx = current_rollout()
    if ctx is None:
        raise RolloutContextError("proxy_url() needs an open rollout: call it inside `with rollout(...)`")
    return f"{base.rstrip('/')}/rollout/{ctx.rollout_id}/attempt/{ctx.attempt_id}/v1"


def proxy_token() -> str | None:
    """The proxy's bearer token for agents (``ROLLOUTBUS_LLM_PROXY_TOKEN``; the proxy's ``ROLLOUTBUS_PROXY_TOKEN``)."""
    return os.environ.get("ROLLOUTBUS_LLM_PROXY_TOKEN") or None


def proxy_headers() -> dict[str, str]:
    """Headers that give the next LLM call the current attempt's next sequence id (and the proxy's token)."""
    ctx = current_rollout()
    token = proxy_token()
    if ctx is None:
        return {"Authorization": f"Bearer {token}"} if token else {}
    headers = {SEQUENCE_HEADER: str(ctx.next_sequence_id())}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if ctx.agent_name:
        # The proxy records the LLM span; the agent's name makes it selectable (agent_match).
        headers[AGENT_HEADER] = ctx.agent_name
    return headers


__all__ = ["proxy_url", "proxy_headers", "proxy_token", "SEQUENCE_HEADER", "AGENT_HEADER", "VERSION_HEADER"]
