"""Late feedback's three ways in — the SDK's emit_feedback, the gateway's JSON route and its OTLP route — each
land one Feedback record on <prefix>feedback of the real broker, keyed by the rollout id."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from producers.emit import FEEDBACK_ID, FEEDBACK_ROLLOUT_ID, FEEDBACK_VALUE, emit_feedback
from producers.ingest.gateway import SERVER_OPTIONS, Gateway
from producers.transport import SpanTransport
from schemas import codec
from schemas.models import Feedback
from tests.integration.streams.helpers import read_topic
from tests.unit.producers.memory_transport import MemoryTransport

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _otlp() -> bytes:
    req = ExportTraceServiceRequest()
    spans = req.resource_spans.add().scope_spans.add().spans
    s = spans.add()
    s.name, s.span_id, s.end_time_unix_nano = "thumbs-up", bytes.fromhex("00000000000000aa"), 1234
    for key, value in ((FEEDBACK_ROLLOUT_ID, "ro-otlp"), (FEEDBACK_ID, "fb-otlp"), ("user", "u7")):
        s.attributes.add(key=key).value.string_value = value
    s.attributes.add(key=FEEDBACK_VALUE).value.double_value = 0.5
    other = spans.add()  # a span without feedback: refused in the partial success, nothing sent
    other.name = "chat"
    return req.SerializeToString()


def test_sdk_http_and_otlp_feedback_reach_the_topic(kafka_conf: dict[str, Any], topics: Any, tmp_path: Any) -> None:
    sdk = SpanTransport(kafka_conf, topics.feedback, tmp_path / "spool", spool_name="sdk")
    gw_transport = SpanTransport(kafka_conf, topics.feedback, tmp_path / "spool", spool_name="gw")
    try:
        fid = emit_feedback("ro-sdk", 1.0, feedback_id="fb-sdk", time_ns=99, metadata={"ticket": 7}, transport=sdk)
        assert fid == "fb-sdk"
        assert emit_feedback("ro-sdk", float("nan"), transport=sdk) is None  # logged, not sent, not raised
        gw = Gateway(MemoryTransport(), token="tok", feedback_transport=gw_transport)  # type: ignore[arg-type]

        async def go() -> list[tuple[int, str]]:
            server = TestServer(gw.app())
            await server.start_server(**SERVER_OPTIONS)
            async with TestClient(server) as client:
                auth = {"Authorization": "Bearer tok"}
                out = []
                for path, body, ctype in (
                    ("/v1/feedback", json.dumps({"rollout_id": "ro-http", "value": -1, "time_ns": 5}).encode(), "application/json"),
                    ("/v1/feedback", b'{"rollout_id": "ro-http", "value": NaN}', "application/json"),
                    ("/v1/feedback", b'{"value": 1}', "application/json"),
                    ("/v1/feedback/traces", _otlp(), "application/x-protobuf"),
                ):
                    r = await client.post(path, data=body, headers={**auth, "Content-Type": ctype})
                    out.append((r.status, await r.text()))
                r = await client.post("/v1/feedback", data=b"{}", headers={"Content-Type": "application/json"})
                out.append((r.status, ""))
                return out

        answers = asyncio.run(go())
        assert [a[0] for a in answers] == [202, 400, 400, 200, 401]
        assert "NaN is not a JSON value" in answers[1][1] and "rollout_id" in answers[2][1]
        assert sdk.flush(30) == 0 and gw_transport.flush(30) == 0
    finally:
        sdk.close(10)
        gw_transport.close(10)
    got = read_topic(kafka_conf, topics.feedback, 3, 30)
    records = sorted(((k.decode(), codec.decode(v)) for k, v in got), key=lambda kv: kv[0])
    assert all(isinstance(fb, Feedback) for _, fb in records)
    assert [(k, fb.feedback_id, fb.value, fb.source) for k, fb in records] == [
        ("ro-http", records[0][1].feedback_id, -1.0, "http"), ("ro-otlp", "fb-otlp", 0.5, "otlp"), ("ro-sdk", "fb-sdk", 1.0, "sdk")]
    assert records[0][1].time_ns == 5 and records[1][1].time_ns == 1234 and records[2][1].time_ns == 99
    assert records[1][1].metadata == {"user": "u7"} and records[2][1].metadata == {"ticket": "7"}
