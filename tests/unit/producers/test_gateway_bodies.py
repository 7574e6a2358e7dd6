"""Bodies the gateway cannot use are the client's error: 400 with a one-line reason on every route, never a 500.

A body nested beyond Python's recursion limit (``[`` × 100,000) raises RecursionError, which is not a
ValueError: each route must still answer 400. The transport is an in-memory stand-in; no broker."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from producers.gateway import BadRequest, Gateway, decode_request


class MemoryTransport:
    kafka_up = True

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []

    def accepting(self, nbytes: int = 0) -> bool:
        return True

    def emit_encoded(self, key: bytes, value: bytes) -> bool:
        self.records.append((key, value))
        return True

    def stats(self) -> dict[str, Any]:
        return {"spool_pending": 0}


def _attr_nested(depth: int, kind: str) -> dict[str, Any]:
    value: dict[str, Any] = {"stringValue": "x"}
    for _ in range(depth):
        value = ({"arrayValue": {"values": [value]}} if kind == "array"
                 else {"kvlistValue": {"values": [{"key": "k", "value": value}]}})
    return value


def _otlp_with_attr(value: dict[str, Any]) -> bytes:
    span = {"name": "s", "attributes": [{"key": "agentlightning.rollout_id", "value": {"stringValue": "r"}},
                                        {"key": "agentlightning.attempt_id", "value": {"stringValue": "a"}},
                                        {"key": "deep", "value": value}]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


DEEP = b"[" * 100_000
CASES = [
    ("/v1/traces", DEEP),
    ("/v1/traces", b'{"resourceSpans":' * 50_000),
    ("/v1/traces", _otlp_with_attr(_attr_nested(200, "kvlist"))),  # JSON a decoder takes, too deep to rewrite the ids of
    ("/v1/traces", _otlp_with_attr(_attr_nested(300, "array"))),
    ("/api/rollouts/r1/attempt/a1/events", DEEP),
    ("/api/rollouts/r1/attempt/a1/events", b'{"event_type": "x", "data": {"a": ' + b"[" * 995 + b"]" * 995 + b"}}"),
    ("/v1/agl/spans", DEEP),
    ("/v1/agl/rollouts/r1/attempts/a1", DEEP),
    ("/v1/agl/workers/w1", DEEP),
]


@pytest.mark.parametrize("path,body", CASES, ids=[f"{p}-{len(b)}" for p, b in CASES])
def test_a_body_nested_too_deeply_is_a_400_with_one_line(path: str, body: bytes) -> None:
    transport = MemoryTransport()
    gw = Gateway(transport, token="tok")  # type: ignore[arg-type]

    async def go() -> tuple[int, str]:
        async with TestClient(TestServer(gw.app())) as client:
            r = await client.post(path, data=body, headers={"Authorization": "Bearer tok", "Content-Type": "application/json"})
            return r.status, await r.text()

    status, text = asyncio.run(go())
    assert status == 400, text[:300]
    assert "nested too deeply" in text and "\n" not in text.strip() and "Traceback" not in text
    assert transport.records == []


def test_decode_request_says_too_deep_and_keeps_parse_errors_on_one_line() -> None:
    with pytest.raises(BadRequest, match="nested too deeply"):
        decode_request(DEEP, "application/json")
    with pytest.raises(BadRequest, match="not an OTLP ExportTraceServiceRequest") as info:
        decode_request(_otlp_with_attr(_attr_nested(60, "array")), "application/json")  # past protobuf's own depth limit
    assert "\n" not in str(info.value) and len(str(info.value)) < 600


def test_a_reasonably_nested_attribute_still_goes_through() -> None:
    req = decode_request(_otlp_with_attr(_attr_nested(20, "kvlist")), "application/json")
    assert req.resource_spans[0].scope_spans[0].spans[0].name == "s"
