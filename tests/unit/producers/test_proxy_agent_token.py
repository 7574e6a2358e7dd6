"""Agents reach a proxy that asks for a token: ROLLOUTBUS_LLM_PROXY_TOKEN rides on every call's headers."""

from __future__ import annotations

import pytest

from producers import rollout
from producers.proxy import SEQUENCE_HEADER, proxy_headers, proxy_token
from producers.transport import SpanTransport


class _Null(SpanTransport):
    def __init__(self) -> None:  # no Kafka, no spool: records are dropped
        pass

    def emit(self, key: str, name: str, record: dict) -> bool:  # type: ignore[override]
        return True


def test_no_token_no_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLOUTBUS_LLM_PROXY_TOKEN", raising=False)
    assert proxy_token() is None
    with rollout("t", transport=_Null()):
        headers = proxy_headers()
    assert "Authorization" not in headers and headers[SEQUENCE_HEADER] == "1"


def test_token_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTBUS_LLM_PROXY_TOKEN", "tok-123")
    with rollout("t", transport=_Null()):
        first, second = proxy_headers(), proxy_headers()
    assert first["Authorization"] == second["Authorization"] == "Bearer tok-123"
    assert (first[SEQUENCE_HEADER], second[SEQUENCE_HEADER]) == ("1", "2")
    assert proxy_headers() == {"Authorization": "Bearer tok-123"}  # outside a rollout: the token only
