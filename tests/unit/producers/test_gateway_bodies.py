"""Bodies the gateway cannot use are the client's error: 400 with a one-line reason on every route, never a 500.

A body nested beyond Python's recursion limit (``[`` × 100,000) raises RecursionError, which is not a
ValueError: each route must still answer 400. A gzip body cut short is refused, not read as far as it
goes (its missing spans would be lost with a 200). The transport is an in-memory stand-in; no broker."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from producers.ingest.gateway import SERVER_OPTIONS, Gateway
from producers.ingest.otlp_decoding import BadRequest, decode_request, request_to_spans
from tests.unit.producers.memory_transport import MemoryTransport


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


def post(gw: Gateway, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        server = TestServer(gw.app())
        await server.start_server(**SERVER_OPTIONS)  # served as the gateway command serves it
        async with TestClient(server) as client:
            r = await client.post(path, data=body, headers={"Authorization": "Bearer tok", **headers})
            return r.status, await r.text()

    return asyncio.run(go())


def _spans(n: int, rollout: str = "ro-1") -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    spans = req.resource_spans.add().scope_spans.add().spans
    for i in range(n):
        s = spans.add()
        s.name, s.trace_id, s.span_id = f"span-{i:03d}-" + "x" * 40, bytes(16), i.to_bytes(8, "big")
        for key, value in (("agentlightning.rollout_id", rollout), ("agentlightning.attempt_id", "at-1")):
            s.attributes.add(key=key).value.string_value = value
    return req


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

    status, text = post(gw, path, body, {"Content-Type": "application/json"})
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


@pytest.mark.parametrize("cut", [1, 8, 0.5])
def test_a_gzip_body_cut_short_is_refused_and_nothing_of_it_goes_on(cut: float) -> None:
    transport = MemoryTransport()
    gw = Gateway(transport, token="tok")  # type: ignore[arg-type]
    z = gzip.compress(_spans(50).SerializeToString())
    short = z[: int(len(z) * cut)] if isinstance(cut, float) else z[:-cut]
    status, text = post(gw, "/v1/traces", short, {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
    assert status == 400 and "cut short" in text, text
    assert transport.records == []


@pytest.mark.parametrize("encoding,compress", [("gzip", gzip.compress), ("deflate", zlib.compress),
                                               ("gzip", lambda b: gzip.compress(b[:100]) + gzip.compress(b[100:]))])
def test_gzip_and_deflate_bodies_go_through_whole(encoding: str, compress: Any) -> None:
    transport = MemoryTransport()
    gw = Gateway(transport, token="tok")  # type: ignore[arg-type]
    body = compress(_spans(20).SerializeToString())
    status, _ = post(gw, "/v1/traces", body, {"Content-Type": "application/x-protobuf", "Content-Encoding": encoding})
    assert status == 200 and len(transport.records) == 20


@pytest.mark.parametrize("encoding,body,status,reason", [
    ("gzip", b"not gzip at all", 400, "not gzip"),
    ("gzip", gzip.compress(b"x", mtime=0) + b"trailing", 400, "not valid gzip"),  # mtime 0: the same id on every xdist worker
    ("deflate", b"\x78\x9c garbage", 400, "not valid deflate"),
    ("br", b"anything", 415, "unsupported Content-Encoding"),
    ("gzip", gzip.compress(b"\x00" * 300_000, mtime=0), 413, "over the limit"),
])
def test_bodies_that_are_not_what_their_encoding_says(encoding: str, body: bytes, status: int, reason: str) -> None:
    gw = Gateway(MemoryTransport(), token="tok", max_body_bytes=200_000)  # type: ignore[arg-type]
    for path in ("/v1/traces", "/api/rollouts/r1/attempt/a1/events", "/v1/agl/spans"):
        got, text = post(gw, path, body, {"Content-Type": "application/json", "Content-Encoding": encoding})
        assert (got, reason in text, "\n" in text.strip()) == (status, True, False), (path, text)


def test_an_attribute_value_the_mapping_cannot_take_rejects_that_span_only() -> None:
    req = _spans(3)
    bad = req.resource_spans[0].scope_spans[0].spans[1]
    bad.attributes.add(key="prompt_token_ids").value.string_value = "[1e999]"  # int(inf): OverflowError
    worse = req.resource_spans[0].scope_spans[0].spans[2]
    worse.attributes.add(key="prompt_token_ids").value.string_value = "[" * 5000  # RecursionError
    spans, errors = request_to_spans(req)
    assert [s["name"] for s in spans] == [req.resource_spans[0].scope_spans[0].spans[0].name]
    assert len(errors) == 2 and all("cannot be read" in e for e in errors), errors


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_an_event_holding_nan_or_infinity_is_refused_not_echoed_as_broken_json(constant: bytes) -> None:
    transport = MemoryTransport()
    gw = Gateway(transport, token="tok")  # type: ignore[arg-type]
    body = b'{"event_type": "agent_output", "data": {"score": ' + constant + b"}}"
    status, text = post(gw, "/api/rollouts/r1/attempt/a1/events", body, {"Content-Type": "application/json"})
    assert status == 400 and f"{constant.decode()} is not a JSON value" in text, text
    assert transport.records == []


def test_a_compressed_body_without_the_token_is_refused_before_it_is_decompressed() -> None:
    gw = Gateway(MemoryTransport(), token="tok", max_body_bytes=200_000)  # type: ignore[arg-type]

    async def go() -> tuple[int, str]:
        server = TestServer(gw.app())
        await server.start_server(**SERVER_OPTIONS)
        async with TestClient(server) as client:
            r = await client.post("/v1/traces", data=gzip.compress(b"\x00" * 300_000),  # over the limit once inflated: 413
                                  headers={"Content-Encoding": "gzip", "Content-Type": "application/x-protobuf"})
            return r.status, await r.text()

    assert asyncio.run(go()) == (401, "missing or wrong bearer token")


class SlowSpool(MemoryTransport):
    """Takes the records; says they are in the spool only when the test says so (``spool``)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[Any] = []

    def spooled(self) -> Any:
        from concurrent.futures import Future

        done: Future[None] = Future()
        self.waits.append(done)
        return done


def test_a_200_waits_until_the_spans_are_in_the_spool_and_a_spool_that_never_takes_them_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answered 200 while the spans were only in memory, a SIGKILL of the gateway lost them (the crash fault test: 78
    acknowledged spans missing once). Now the answer waits for the transport's word that they are on disk."""
    import threading

    from producers.ingest import gateway

    transport = SlowSpool()
    gw = Gateway(transport, token="tok")  # type: ignore[arg-type]
    body = _spans(3).SerializeToString()
    answered: list[tuple[int, str]] = []
    poster = threading.Thread(target=lambda: answered.append(post(gw, "/v1/traces", body, {"Content-Type": "application/x-protobuf"})))
    poster.start()
    deadline = time.monotonic() + 5
    while not transport.waits and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(transport.records) == 3 and answered == [], "no answer before the spool has them"
    transport.waits[0].set_result(None)
    poster.join(5)
    assert answered and answered[0][0] == 200, answered

    monkeypatch.setattr(gateway, "SPOOLED_WAIT_S", 0.2)
    status, text = post(gw, "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
    assert status == 503 and "spool" in text, text
