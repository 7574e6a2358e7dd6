"""A stock OpenTelemetry SDK program exports OTLP/HTTP to the gateway; its spans land on the real broker."""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from producers_testkit import consume_all
from schemas.codec import unpack_tokens

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]

SDK_PROGRAM = """
import sys
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

provider = TracerProvider(resource=Resource.create({"service.name": "stock-agent"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
    endpoint=sys.argv[1], headers={"Authorization": "Bearer s3cret"})))
tracer = provider.get_tracer("stock")
base = {"agentlightning.rollout_id": "ro-otlp", "agentlightning.attempt_id": "at-1"}
with tracer.start_as_current_span("openai.chat.completion", attributes={**base,
        "agentlightning.span_sequence_id": 1, "gen_ai.request.model": "tiny",
        "prompt_token_ids": [1, 2, 3], "response_token_ids": [7, 8], "custom.flag": True}):
    pass
with tracer.start_as_current_span("agentlightning.annotation", attributes={**base,
        "agentlightning.span_sequence_id": 2, "agentlightning.reward.0.name": "task",
        "agentlightning.reward.0.value": 0.75, "agentlightning.reward.1.name": "style",
        "agentlightning.reward.1.value": 0.5}):
    pass
with tracer.start_as_current_span("no-rollout"):
    pass
provider.shutdown()
print("exported")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gateway(test_env: dict[str, str]) -> Any:
    port = _free_port()
    env = {**test_env, "PYTHONPATH": str(REPO), "ROLLOUTBUS_GATEWAY_TOKEN": "s3cret", "ROLLOUTBUS_GATEWAY_MAX_BODY_BYTES": "200000"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "producers.ingest.gateway_cli", "--port", str(port)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                break
        except requests.ConnectionError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"gateway did not start: {proc.stderr.read() if proc.stderr else ''}")
    yield base, env
    proc.terminate()
    proc.wait(30)


def test_stock_sdk_spans_land_on_kafka_with_attributes(gateway: Any, kafka_conf: dict[str, Any], topics: Any) -> None:
    base, env = gateway
    out = subprocess.run([sys.executable, "-c", SDK_PROGRAM, f"{base}/v1/traces"], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "exported", out.stderr[-2000:]
    records = consume_all(kafka_conf, topics.spans, expect=2, timeout=30)
    spans = {r["name"]: (k, r) for k, _n, r, _p in records}
    assert set(spans) == {"openai.chat.completion", "agentlightning.annotation"}, "the unattributed span is rejected"
    key, llm = spans["openai.chat.completion"]
    assert key == b"ro-otlp" and llm["attempt_id"] == "at-1" and llm["sequence_id"] == 1
    assert llm["kind"] == "llm" and llm["llm"]["model"] == "tiny"
    assert unpack_tokens(llm["llm"]["prompt_token_ids"]) == [1, 2, 3]
    assert unpack_tokens(llm["llm"]["response_token_ids"]) == [7, 8]
    assert llm["attributes"]["custom.flag"] == "true" and llm["resource"]["service.name"] == "stock-agent"
    _, reward = spans["agentlightning.annotation"]
    assert reward["kind"] == "reward"
    assert reward["reward"] == {"value": 0.75, "primary": "task", "dimensions": {"task": 0.75, "style": 0.5}}

    metrics = requests.get(f"{base}/metrics", timeout=5).text
    assert "rolloutbus_gateway_spans_accepted_total 2.0" in metrics
    assert "rolloutbus_gateway_spans_rejected_total 1.0" in metrics


RESOURCE_PROGRAM = """
import sys
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

# The ids on the Resource only, where Agent Lightning's LightningStoreOTLPExporter puts them.
rollout, compression = sys.argv[2], sys.argv[3]
provider = TracerProvider(resource=Resource.create({"service.name": "al-agent",
    "agentlightning.rollout_id": rollout, "agentlightning.attempt_id": "at-r"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1],
    headers={"Authorization": "Bearer s3cret"}, compression=Compression(compression))))
tracer = provider.get_tracer("stock")
with tracer.start_as_current_span("agent.run"):
    with tracer.start_as_current_span("openai.chat.completion", attributes={"gen_ai.request.model": "tiny",
            "prompt_token_ids": [1, 2], "response_token_ids": [3]}):
        pass
    with tracer.start_as_current_span("agentlightning.annotation", attributes={
            "agentlightning.reward.0.name": "task", "agentlightning.reward.0.value": 1.0}):
        pass
provider.shutdown()
print("exported")
"""


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_stock_sdk_with_ids_on_its_resource_gets_every_span_attributed(
    gateway: Any, kafka_conf: dict[str, Any], topics: Any, compression: str
) -> None:
    base, env = gateway
    rollout = f"ro-res-{compression}"
    out = subprocess.run([sys.executable, "-c", RESOURCE_PROGRAM, f"{base}/v1/traces", rollout, compression],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "exported", out.stderr[-2000:]
    records = consume_all(kafka_conf, topics.spans, expect=3, timeout=30)
    assert sorted(r["name"] for _k, _n, r, _p in records) == ["agent.run", "agentlightning.annotation", "openai.chat.completion"]
    assert {(k, r["rollout_id"], r["attempt_id"]) for k, _n, r, _p in records} == {(rollout.encode(), rollout, "at-r")}
    assert [r["sequence_id"] for _k, _n, r, _p in records] == [0, 0, 0], "unnumbered: the span stage numbers them"
    by_name = {r["name"]: r for _k, _n, r, _p in records}
    assert by_name["openai.chat.completion"]["kind"] == "llm" and by_name["agentlightning.annotation"]["reward"]["value"] == 1.0
    metrics = requests.get(f"{base}/metrics", timeout=5).text
    assert "rolloutbus_gateway_spans_accepted_total 3.0" in metrics and "rolloutbus_gateway_spans_rejected_total 0.0" in metrics


def test_otlp_json_with_ids_on_the_resource(gateway: Any, kafka_conf: dict[str, Any], topics: Any) -> None:
    base, _ = gateway
    res = [{"key": "agentlightning.rollout_id", "value": {"stringValue": "ro-json-res"}},
           {"key": "agentlightning.attempt_id", "value": {"stringValue": "at-1"}},
           {"key": "agentlightning.span_sequence_id", "value": {"stringValue": "3"}}]
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "name": "tool-run",
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000500000000",
            "attributes": [{"key": "gen_ai.tool.name", "value": {"stringValue": "calc"}}]}
    body = {"resourceSpans": [{"resource": {"attributes": res}, "scopeSpans": [{"spans": [
        {**span, "spanId": "b7ad6b7169203331"},
        {**span, "spanId": "b7ad6b7169203332",  # the span's own sequence id wins
         "attributes": span["attributes"] + [{"key": "agentlightning.span_sequence_id", "value": {"intValue": "4"}}]}]}]}]}
    for i, gz in enumerate((False, True)):
        data = __import__("json").dumps(body).encode()
        headers = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
        if gz:
            data, headers = gzip.compress(data), {**headers, "Content-Encoding": "gzip"}
        resp = requests.post(f"{base}/v1/traces", data=data, headers=headers, timeout=5)
        assert resp.status_code == 200 and "rejectedSpans" not in resp.text, resp.text
    records = consume_all(kafka_conf, topics.spans, expect=4, timeout=20)
    assert len(records) == 4
    assert {(k, r["attempt_id"]) for k, _n, r, _p in records} == {(b"ro-json-res", "at-1")}
    assert sorted(r["sequence_id"] for _k, _n, r, _p in records) == [3, 3, 4, 4]


def test_gateway_http_contract(gateway: Any, kafka_conf: dict[str, Any], topics: Any) -> None:
    base, _ = gateway
    url = f"{base}/v1/traces"
    auth = {"Authorization": "Bearer s3cret"}
    assert requests.post(url, data=b"x", headers={"Content-Type": "application/x-protobuf"}, timeout=5).status_code == 401
    bad = requests.post(url, data=b"\xff\xff\xff", headers={**auth, "Content-Type": "application/x-protobuf"}, timeout=5)
    assert bad.status_code == 400 and "protobuf" in bad.text
    big = requests.post(url, data=b"0" * 300_000, headers={**auth, "Content-Type": "application/x-protobuf"}, timeout=5)
    assert big.status_code == 413
    bomb = requests.post(url, data=gzip.compress(b"0" * 300_000), headers={**auth, "Content-Encoding": "gzip", "Content-Type": "application/x-protobuf"}, timeout=5)
    assert bomb.status_code == 413
    body = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "js"}}]},
        "scopeSpans": [{"spans": [
            {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "tool-run",
             "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000500000000",
             "attributes": [{"key": "agentlightning.rollout_id", "value": {"stringValue": "ro-json"}},
                            {"key": "agentlightning.attempt_id", "value": {"stringValue": "at-j"}},
                            {"key": "gen_ai.tool.name", "value": {"stringValue": "calc"}},
                            {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": "x=1"}}]},
            {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203332", "name": "orphan"}]}]}]}
    resp = requests.post(url, data=gzip.compress(__import__("json").dumps(body).encode()),
                         headers={**auth, "Content-Type": "application/json", "Content-Encoding": "gzip"}, timeout=5)
    assert resp.status_code == 200, resp.text
    assert resp.json()["partialSuccess"]["rejectedSpans"] == "1"
    records = consume_all(kafka_conf, topics.spans, expect=1, timeout=20)
    [(key, _n, span, _p)] = records
    assert key == b"ro-json" and span["span_id"] == "b7ad6b7169203331" and span["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert span["kind"] == "tool" and span["tool"]["name"] == "calc" and span["sequence_id"] == 0
    assert span["resource"] == {"service.name": "js"}


def test_gateway_pushes_back_with_503_when_kafka_is_down_and_the_spool_is_full(test_env: dict[str, str], tmp_path: Path) -> None:
    """No broker at all: spans go to the spool until it is full; then the gateway answers 503 with
    Retry-After (what an OTLP exporter retries on) instead of accepting spans it cannot keep."""
    sys.path.insert(0, str(REPO / "bench"))
    from bench_gateway import build_bodies

    port = _free_port()
    env = {**test_env, "PYTHONPATH": str(REPO), "ROLLOUTBUS_KAFKA_BOOTSTRAP": f"127.0.0.1:{_free_port()}",
           "ROLLOUTBUS_DATA_DIR": str(tmp_path / "gw"), "ROLLOUTBUS_SPOOL_MAX_BYTES": "200000",
           "ROLLOUTBUS_GATEWAY_RETRY_AFTER_S": "7"}
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "producers.ingest.gateway_cli", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                requests.get(f"{base}/healthz", timeout=1)  # 200, or 503 "degraded" once it sees no broker
                break
            except requests.ConnectionError:
                time.sleep(0.2)
        body = build_bodies(200)[0]
        statuses: list[int] = []
        got_503 = None
        deadline = time.monotonic() + 60
        while got_503 is None and time.monotonic() < deadline:
            r = requests.post(f"{base}/v1/traces", data=body, headers={"Content-Type": "application/x-protobuf"}, timeout=10)
            statuses.append(r.status_code)
            if r.status_code == 503:
                got_503 = r
            else:
                assert r.status_code == 200, r.text
                time.sleep(0.05)
        assert got_503 is not None, f"no 503 in {len(statuses)} requests; gateway log:\n{(tmp_path / 'gateway.log').read_text()[-2000:]}"
        assert got_503.headers["Retry-After"] == "7" and "spool is full" in got_503.text
        assert statuses.count(200) >= 1  # it took spans while the spool had room
        metrics = requests.get(f"{base}/metrics", timeout=5).text
        assert 'rolloutbus_gateway_requests_total{code="503"} 1.0' in metrics
        # every span it answered 200 for is in the spool, kept for the broker's return; none was dropped
        health = requests.get(f"{base}/healthz", timeout=5).json()
        assert health["dropped_spool_full"] == 0 and health["dropped_queue_full"] == 0, health
        assert health["spool_pending"] == 200 * statuses.count(200), health
    finally:
        proc.terminate()
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
