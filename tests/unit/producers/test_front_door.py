"""The gateway's front door (producers/ingest/front_door.py) as each family of routes answers through it: the
body limit by Content-Length, a spool that cannot keep a record, the token; and the events route of Agent
Lightning 1.x counted with the OTLP route. The transport is an in-memory stand-in; no broker."""

from __future__ import annotations

import asyncio
import json
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


def call(gw: Gateway, requests: list[tuple[str, str, bytes, dict[str, str]]]) -> list[tuple[int, str, dict[str, str]]]:
    async def go() -> list[tuple[int, str, dict[str, str]]]:
        server = TestServer(gw.app())
        await server.start_server(**SERVER_OPTIONS)
        out = []
        async with TestClient(server) as client:
            for method, path, body, headers in requests:
                r = await client.request(method, path, data=body, headers=headers)
                out.append((r.status, await r.text(), dict(r.headers)))
        return out

    return asyncio.run(go())


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
    gw.agl1_api.queue = gw.agl_store.queue = object()  # type: ignore[assignment]  # refused before the queue is asked
    [(got, text, _headers)] = call(gw, [("POST", path, b"x" * 1001, AUTH)])
    assert got == status, text
    assert (json.loads(text) == {"detail": reason}) if shape == "detail" else (text == reason), text


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
