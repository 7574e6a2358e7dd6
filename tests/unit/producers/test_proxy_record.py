"""The proxy's answers when recording goes wrong, and what it passes back of an upstream's redirect.

In this process: a fake upstream and the proxy, both aiohttp apps on loopback, and a span transport that
either takes records or has stopped (a fatal Kafka error: ACL refusal, refused login).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from foundation.errors import KafkaNotAuthorized
from producers.ingest.llm_proxy import LLMProxy
from producers.transport import SpanTransport

CHAT = {"model": "m", "messages": [{"role": "user", "content": "2 + 2?"}]}
ROUTE = "/rollout/ro-1/attempt/at-1/v1/chat/completions"
KEY = "sk-upstream-key-7f3e"
URL_PASSWORD = "url-pw-91c2"


class _Transport(SpanTransport):
    """No Kafka, no spool: keeps what it is given, or has stopped as a fatal producer error stops it."""

    def __init__(self, stopped: bool = False) -> None:  # noqa: D107 - the real one opens a spool and Kafka
        self.records: list[dict[str, Any]] = []
        self.error = KafkaNotAuthorized("Kafka refused to let this client write topic rb.spans (TOPIC_AUTHORIZATION_FAILED)") \
            if stopped else None

    def emit(self, key: str, name: str, record: dict[str, Any]) -> bool:  # type: ignore[override]
        if self.error is not None:
            raise self.error
        self.records.append(record)
        return True

    def accepting(self, nbytes: int = 0) -> bool:
        return self.error is None

    def stats(self) -> dict[str, Any]:
        return {"spool_pending": 0, "kafka_up": self.error is None}


async def _upstream(request: web.Request) -> web.Response:
    body = await request.json()
    if body["model"] == "moved":
        return web.Response(status=302, headers={
            "Location": f"https://user:{URL_PASSWORD}@elsewhere.example/v1/chat?api_key={KEY}&region=eu",
            "Content-Location": f"https://elsewhere.example/v1?k={KEY}", "X-Hint": f"use key {KEY}"})
    return web.json_response({"id": "c1", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}]})


async def _with_proxy(transport: SpanTransport, calls: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]],
                      **proxy_args: Any) -> list[tuple[int, str, dict[str, str]]]:
    """Start the upstream and the proxy, make ``calls`` (method, path, JSON body, headers) in order."""
    up_app = web.Application()
    up_app.router.add_post("/v1/chat/completions", _upstream)
    async with TestServer(up_app) as up:
        proxy = LLMProxy(f"http://user:{URL_PASSWORD}@127.0.0.1:{up.port}/v1", transport, kind="openai", api_key=KEY,
                         **proxy_args)
        async with TestServer(proxy.app()) as srv, ClientSession() as client:
            answers = []
            for method, path, body, headers in calls:
                async with client.request(method, f"http://127.0.0.1:{srv.port}{path}", json=body, headers=headers,
                                          allow_redirects=False) as r:
                    answers.append((r.status, await r.text(), dict(r.headers)))
            return answers


def _run(transport: SpanTransport, *calls: tuple[str, str, dict[str, Any] | None, dict[str, str]], **kw: Any) -> list[Any]:
    return asyncio.run(_with_proxy(transport, list(calls), **kw))


def test_a_stopped_transport_costs_the_agent_nothing_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "producers.ingest.llm_proxy")
    chat, healthz, readyz, livez, metrics = _run(
        _Transport(stopped=True), ("POST", ROUTE, CHAT, {}), ("GET", "/healthz", None, {}), ("GET", "/readyz", None, {}),
        ("GET", "/livez", None, {}), ("GET", "/metrics", None, {}))
    assert chat[0] == 200 and '"content": "4"' in chat[1], chat  # the agent gets its completion
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1 and "ro-1" in lines[0] and "at-1" in lines[0] and "not recorded" in lines[0], lines
    assert "\n" not in lines[0] and "TOPIC_AUTHORIZATION_FAILED" in lines[0]
    assert healthz[0] == readyz[0] == 503 and '"status": "degraded"' in healthz[1] and '"unrecorded": 1' in healthz[1], healthz
    assert livez[0] == 200
    assert 'rolloutbus_proxy_spans_unrecorded_total{reason="transport_failed"} 1.0' in metrics[1], metrics[1]
    assert "rolloutbus_proxy_ready 0.0" in metrics[1]


def test_a_working_transport_records_the_call_and_the_proxy_is_ready() -> None:
    transport = _Transport()
    chat, healthz, readyz, metrics = _run(transport, ("POST", ROUTE, CHAT, {}), ("GET", "/healthz", None, {}),
                                          ("GET", "/readyz", None, {}), ("GET", "/metrics", None, {}))
    assert chat[0] == 200 and len(transport.records) == 1 and transport.records[0]["rollout_id"] == "ro-1"
    assert healthz[0] == readyz[0] == 200 and '"status": "ok"' in healthz[1]
    assert "rolloutbus_proxy_spans_recorded_total 1.0" in metrics[1] and "rolloutbus_proxy_ready 1.0" in metrics[1]


def test_metrics_need_the_token_when_given_one() -> None:
    bare, good = _run(_Transport(), ("GET", "/metrics", None, {}), ("GET", "/metrics", None, {"Authorization": "Bearer mt-1"}),
                      metrics_token="mt-1")
    assert bare[0] == 401 and "mt-1" not in bare[1] and good[0] == 200


def test_an_upstream_redirect_is_passed_back_without_the_credentials_in_it() -> None:
    transport = _Transport()
    (status, text, headers), = _run(transport, ("POST", ROUTE, {**CHAT, "model": "moved"}, {}))
    assert status == 302, text
    assert headers["Location"] == "https://user:***@elsewhere.example/v1/chat?api_key=***&region=eu", headers
    shown = "\n".join(f"{k}: {v}" for k, v in headers.items())
    assert KEY not in shown and URL_PASSWORD not in shown, shown
    assert headers["Content-Location"] == "https://elsewhere.example/v1?k=***" and headers["X-Hint"] == "use key ***"
    assert transport.records[0]["status_code"] == "ERROR"  # recorded as the upstream's error
