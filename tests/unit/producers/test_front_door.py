"""The gateway's front door (producers/ingest/front_door.py) as each family of routes answers through it: the
body limit by Content-Length and while a body sent without one is read, JSON nested too deeply, a spool that
cannot keep a record, the token; and the events route of Agent Lightning 1.x counted with the OTLP route. The
transport is an in-memory stand-in; no broker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from producers.ingest.gateway import SERVER_OPTIONS, Gateway
from tests.unit.producers.memory_transport import MemoryTransport

AUTH = {"Authorization": "Bearer tok", "Content-Type": "application/json"}
EVENT = "/api/rollouts/ro-1/attempt/0/events"


class FullTransport(MemoryTransport):
    """Kafka down and the spool full: nothing is accepted."""

    def accepting(self, nbytes: int = 0) -> bool:
        return False


async def pieces(body: bytes, size: int = 300) -> AsyncIterator[bytes]:
    """``body`` in pieces: aiohttp's client sends it chunked, without a Content-Length."""
    for i in range(0, len(body), size):
        yield body[i:i + size]


def call(gw: Gateway, requests: list[tuple[str, str, bytes, dict[str, str]]], *,
         chunked: bool = False) -> list[tuple[int, str, dict[str, str]]]:
    """Each request's (status, text, headers); ``chunked``: bodies sent without a Content-Length."""
    async def go() -> list[tuple[int, str, dict[str, str]]]:
        server = TestServer(gw.app())
        await server.start_server(**SERVER_OPTIONS)
        out = []
        async with TestClient(server) as client:
            for method, path, body, headers in requests:
                r = await client.request(method, path, data=pieces(body) if chunked else body, headers=headers)
                out.append((r.status, await r.text(), dict(r.headers)))
        return out

    return asyncio.run(go())


def answered(gw: Gateway) -> dict[str, float]:
    """rolloutbus_gateway_requests_total by its code label: the answers the gateway counted."""
    out = {}
    for line in generate_latest(gw.registry).decode().splitlines():
        if line.startswith("rolloutbus_gateway_requests_total{"):
            name, value = line.rsplit(" ", 1)
            out[name.split('"')[1]] = float(value)
    return out


# (path, status, shape): each family keeps the status it gave a body over the limit before the front door was one.
LIMITS = [
    ("/v1/traces", 413, "text", "body of 1001 bytes is over the limit of 1000"),
    (EVENT, 413, "text", "body of 1001 bytes is over the limit of 1000"),
    ("/api/rollouts", 400, "detail", "body of 1001 bytes is over the limit of 1000"),
    ("/v1/agl/spans", 400, "detail", "not an Agent Lightning span: body of 1001 bytes is over the limit of 1000"),
    ("/v1/agl/queues/rollouts/enqueue", 422, "detail", "not an enqueue request: body of 1001 bytes is over the limit of 1000"),
]


@pytest.mark.parametrize("path,status,shape,reason", LIMITS, ids=[p for p, *_ in LIMITS])
def test_a_body_over_the_limit_is_refused_in_its_routes_shape(path: str, status: int, shape: str, reason: str) -> None:
    gw = Gateway(MemoryTransport(), token="tok", max_body_bytes=1000)  # type: ignore[arg-type]
    gw.agl1_api.queue = gw.agl_store.queue = SimpleNamespace()  # type: ignore[assignment]  # refused before the queue is asked
    [(got, text, _headers)] = call(gw, [("POST", path, b"x" * 1001, AUTH)])
    assert got == status, text
    assert (json.loads(text) == {"detail": reason}) if shape == "detail" else (text == reason), text


# Sent without its length (chunked), a body over the limit is found while it is read. Each family answers as it
# did before the front door: OTLP and the events route 413 (counted), 1.x's /api 400 in its shape, 0.3's /v1/agl
# aiohttp's own 413 (plain text; its routes let aiohttp's refusal through). "counted": in requests_total. The
# body is well over the limit: aiohttp's own limit, the gateway's + 1, lets one byte more through.
CHUNKED = [
    ("/v1/traces", 413, "text", "body is over the limit of 1000 bytes", True),
    (EVENT, 413, "text", "body is over the limit of 1000 bytes", True),
    ("/api/rollouts", 400, "detail", "body is over the limit of 1000 bytes", False),
    ("/v1/agl/spans", 413, "aiohttp", "Maximum request body size 1001 exceeded.", False),
    ("/v1/agl/rollouts", 413, "aiohttp", "Maximum request body size 1001 exceeded.", False),
    ("/v1/agl/queues/rollouts/enqueue", 413, "aiohttp", "Maximum request body size 1001 exceeded.", False),
]


@pytest.mark.parametrize("path,status,shape,reason,counted", CHUNKED, ids=[p for p, *_ in CHUNKED])
def test_a_chunked_body_over_the_limit_is_refused_as_before(path: str, status: int, shape: str, reason: str,
                                                            counted: bool) -> None:
    gw = Gateway(MemoryTransport(), token="tok", max_body_bytes=1000)  # type: ignore[arg-type]
    gw.agl1_api.queue = gw.agl_store.queue = SimpleNamespace()  # type: ignore[assignment]  # refused before the queue is asked
    [(got, text, headers)] = call(gw, [("POST", path, b"x" * 2000, AUTH)], chunked=True)
    assert got == status, text
    if shape == "detail":
        assert json.loads(text) == {"detail": reason}
    elif shape == "text":
        assert text == reason
    else:  # aiohttp's, at its own limit (the gateway's + 1)
        assert text == reason and headers["Content-Type"].startswith("text/plain"), text
    assert answered(gw) == ({str(status): 1} if counted else {})


DEEP = b"[" * 100_000 + b"]" * 100_000  # beyond Python's recursion limit
TOO_DEEP = "body is nested too deeply: JSON arrays and objects may nest a few hundred levels at most"


@pytest.mark.parametrize("path", ["/v1/agl/rollouts", "/v1/agl/spans", "/v1/agl/queues/rollouts/enqueue",
                                  "/v1/agl/rollouts/ro-1/attempts/at-1", "/v1/agl/workers/w-1"])
def test_json_nested_too_deeply_is_400_on_every_0_3_route_and_counted(path: str) -> None:
    gw = Gateway(MemoryTransport(), token="tok")  # type: ignore[arg-type]
    gw.agl_store.queue = SimpleNamespace()  # type: ignore[assignment]  # refused before the queue is asked
    [(status, text, _headers)] = call(gw, [("POST", path, DEEP, AUTH)])
    assert (status, json.loads(text)) == (400, {"detail": TOO_DEEP}), text
    assert answered(gw) == {"400": 1}


@pytest.mark.parametrize("method,path", [("POST", "/api/rollouts"), ("PATCH", "/api/rollouts/ro-1")])
def test_json_nested_too_deeply_is_400_in_1_x_words(method: str, path: str) -> None:
    gw = Gateway(MemoryTransport(), token="tok")  # type: ignore[arg-type]
    gw.agl1_api.queue = SimpleNamespace()  # type: ignore[assignment]  # refused before the queue is asked
    [(status, text, _headers)] = call(gw, [(method, path, DEEP, AUTH)])
    assert (status, json.loads(text)) == (400, {"detail": "body is JSON nested too deep"}), text
    assert answered(gw) == {}


@pytest.mark.parametrize("path,shape", [("/v1/traces", "text"), ("/v1/agl/spans", "detail")])
def test_a_compressed_body_over_the_limit_as_sent_is_413(path: str, shape: str) -> None:
    """The front door reads a compressed body before any route, as sent: over the limit, aiohttp's limit
    answers it, with the gateway's limit in the reason (not its Content-Length)."""
    gw = Gateway(MemoryTransport(), token="tok", max_body_bytes=1000)  # type: ignore[arg-type]
    [(status, text, _headers)] = call(gw, [("POST", path, b"x" * 3000, {**AUTH, "Content-Encoding": "gzip"})])
    reason = "body is over the limit of 1000 bytes"
    assert status == 413, text
    assert (json.loads(text) == {"detail": reason}) if shape == "detail" else (text == reason), text
    assert answered(gw) == {"413": 1}


@pytest.mark.parametrize("path,shape", [("/v1/traces", "text"), (EVENT, "text"), ("/v1/agl/spans", "detail")])
def test_a_full_spool_is_503_with_retry_after(path: str, shape: str) -> None:
    gw = Gateway(FullTransport(), token="tok", retry_after_s=7)  # type: ignore[arg-type]
    body = b'{"event_type": "reward", "data": {"value": 1}}' if path == EVENT else (
        json.dumps({"rollout_id": "ro-1", "attempt_id": "at-1", "sequence_id": 1, "trace_id": "0" * 32, "span_id": "0" * 16,
                    "name": "s", "start_time": 1.0, "end_time": 2.0, "attributes": {}}).encode()
        if path.startswith("/v1/agl") else b'{"resourceSpans": []}')
    [(status, text, headers)] = call(gw, [("POST", path, body, AUTH)])
    reason = "Kafka is unreachable and the local spool is full; retry later"
    assert (status, headers.get("Retry-After")) == (503, "7"), text
    assert (json.loads(text) == {"detail": reason}) if shape == "detail" else (text == reason), text


def test_the_events_route_is_counted_with_the_otlp_route() -> None:
    transport = MemoryTransport()
    gw = Gateway(transport, token="tok")  # type: ignore[arg-type]
    answers = call(gw, [
        ("POST", EVENT, b'{"event_type": "reward", "data": {"value": 1}}', AUTH),
        ("POST", EVENT, b'{"data": {}}', AUTH),  # no event_type: 422, a rejected span
        ("POST", EVENT, b"{}", {"Content-Type": "application/json"}),  # no token
    ])
    assert [a[0] for a in answers] == [200, 422, 401], answers
    assert answers[2][1] == "missing or wrong bearer token" and "Basic" in answers[2][2]["WWW-Authenticate"]
    metrics: dict[str, Any] = {}
    for line in generate_latest(gw.registry).decode().splitlines():
        if line.startswith("rolloutbus_gateway_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            metrics[name] = float(value)
    assert metrics["rolloutbus_gateway_spans_accepted_total"] == 1 and metrics["rolloutbus_gateway_spans_rejected_total"] == 1
    assert {k: v for k, v in metrics.items() if k.startswith("rolloutbus_gateway_requests_total")} == {
        'rolloutbus_gateway_requests_total{code="200"}': 1, 'rolloutbus_gateway_requests_total{code="422"}': 1,
        'rolloutbus_gateway_requests_total{code="401"}': 1}
    assert len(transport.records) == 1


def test_the_one_guard_answers_401_before_the_handler_and_503_for_kafka_down() -> None:
    """``guarded``, the guard of every route: without the token the handler never runs (401); Kafka down inside it
    is 503 with Retry-After in the door's shape; what the handler answers itself passes through."""
    from aiohttp import web

    from foundation.errors import KafkaUnavailable
    from producers.ingest.front_door import FrontDoor, guarded

    ran: list[str] = []

    class Routes:
        door = FrontDoor(token="tok", max_body_bytes=1000, retry_after_s=7, detail=True)

        @guarded()
        async def down(self, request: web.Request) -> web.Response:
            ran.append("down")
            raise KafkaUnavailable("rb.control not reachable")

        @guarded()
        async def fine(self, request: web.Request) -> web.Response:
            ran.append("fine")
            return self.door.refuse(422, "its own words")

    async def go() -> list[tuple[int, str, str | None]]:
        routes, app = Routes(), web.Application()
        app.router.add_get("/down", routes.down)
        app.router.add_get("/fine", routes.fine)
        async with TestClient(TestServer(app)) as client:
            out = []
            for path, headers in (("/down", {}), ("/down", AUTH), ("/fine", AUTH)):
                r = await client.get(path, headers=headers)
                out.append((r.status, await r.text(), r.headers.get("Retry-After")))
            return out

    (no_token, down, fine) = asyncio.run(go())
    assert no_token[0] == 401 and ran == ["down", "fine"]
    assert down[0] == 503 and down[2] == "7" and json.loads(down[1]) == {"detail": "rb.control not reachable; retry later"}
    assert fine[0] == 422 and json.loads(fine[1]) == {"detail": "its own words"}
