"""Property-based fuzzing of ``rolloutbus gateway``'s HTTP endpoints, against the real broker.

The gateway runs as its own process (token set, a small body limit) writing to a fresh topic namespace.
Hypothesis sends it OTLP protobuf (valid ExportTraceServiceRequests, truncated, with bytes mutated,
random bytes), OTLP JSON (valid, truncated, wrong types, deeply nested), gzip and wrong encodings, wrong
content types, Agent Lightning 1.x's events route, the ``/v1/agl`` routes, and random paths, methods
and headers. Every answer must be below 500 (Kafka is up, so not even a 503), carry no traceback, and
the gateway must answer its health check afterwards.

And no span goes missing: for every OTLP request answered 200, the spans in it are either accepted or
counted in ``partial_success.rejected_spans``; the totals agree with ``/metrics``, and in a sample of
requests the accepted spans are exactly the records that reach the spans topic. The number of cases
tried is printed.
"""

from __future__ import annotations

import gzip
import http.client
import json
import re
import socket
import subprocess
import sys
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import Consumer
from hypothesis import HealthCheck, Verbosity, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from schemas.codec import decode_raw
from tests.integration.serverprocs import assert_memory_bounded, free_port, rss_mib, stop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
TOKEN = "fuzz-gw-token-4b1e"
MAX_BODY = 200_000
TRIED: Counter[str] = Counter()
# What the gateway must have counted, from its own answers: spans accepted and rejected, AL events too.
LEDGER: Counter[str] = Counter()
PROTOBUF, JSON = "application/x-protobuf", "application/json"
RSS: dict[str, tuple[int, float]] = {}  # the gateway's pid and resident MiB before fuzzing


@pytest.fixture(scope="module")
def fuzz_topics(kafka_bootstrap: str) -> Any:
    from foundation.config import Topics
    from foundation.kafka_admin import ensure_topics, topic_specs

    t = Topics(f"fz{uuid.uuid4().hex[:10]}.")
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, topic_specs(t, span_partitions=2))
    return t


@pytest.fixture(scope="module")
def gateway(kafka_bootstrap: str, fuzz_topics: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import os

    data = tmp_path_factory.mktemp("fuzz-gateway")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "ROLLOUTBUS_KAFKA_BOOTSTRAP": kafka_bootstrap,
           "ROLLOUTBUS_TOPIC_PREFIX": fuzz_topics.prefix, "ROLLOUTBUS_DATA_DIR": str(data / "data"),
           "ROLLOUTBUS_GATEWAY_TOKEN": TOKEN, "ROLLOUTBUS_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY),
           "ROLLOUTBUS_CLICKHOUSE_DSN": f"chdb://{data / 'clickhouse'}"}  # its Agent Lightning reads
    log = (data / "gateway.log").open("wb")  # not a pipe: it logs every rejection, and a full pipe would block it
    proc = subprocess.Popen([sys.executable, "-m", "producers.ingest.gateway_cli", "--port", str(port)], env=env, cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, (data / "gateway.log").read_text(errors="replace")[-3000:]
            try:
                if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        else:
            pytest.fail("the gateway did not start: " + (data / "gateway.log").read_text(errors="replace")[-3000:])
        # Its rb.resources follower starts on the first /v1/agl resources call and answers 503 "retry" until it
        # has read the topic to its end: let it, so that a 503 later is a fault.
        auth = {"Authorization": f"Bearer {TOKEN}"}
        while requests.get(f"{base}/v1/agl/resources/latest", headers=auth, timeout=5).status_code == 503:
            assert time.monotonic() < deadline + 30, "the gateway's rb.resources follower never caught up"
            time.sleep(0.2)
        RSS["gateway"] = (proc.pid, rss_mib(proc.pid))
        yield base
        text = (data / "gateway.log").read_text(errors="replace")
        assert "Traceback" not in text, text[-4000:]
    finally:
        stop(proc)
        log.close()


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


# ---------------------------------------------------------------- OTLP requests

def _kv(key: str, value: Any) -> KeyValue:
    v = AnyValue()
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    elif isinstance(value, list):
        v.array_value.values.extend(_kv("", x).value for x in value)
    else:
        v.string_value = str(value)
    return KeyValue(key=key, value=v)


# A span that is ours (attributed, well formed), and spans the gateway must reject, each for one reason.
GOOD = "good"
BAD_KINDS = {
    "no-ids": {},
    "bad-tokens": {"prompt_token_ids": "1,2,x"},
    "bad-sequence": {"agentlightning.span_sequence_id": "seven"},
    "bad-reward": {"agentlightning.reward.0.name": "task", "agentlightning.reward.0.value": "lots"},
    "non-finite-reward": {"agentlightning.reward.0.value": float("inf")},
    "tokens-out-of-range": {"prompt_token_ids": [1, -2]},
    "token-overflow": {"prompt_token_ids": "[1e999]"},
    "nested-token-string": {"prompt_token_ids": "[" * 5000},
}
SPAN_KINDS = [GOOD] * 4 + sorted(BAD_KINDS)
ATTR_VALUES = st.one_of(st.text(max_size=20), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True), st.booleans(),
                        st.lists(st.integers(0, 2**32 - 1), max_size=5))


@st.composite
def otlp_requests(draw: Any, rollout: str) -> tuple[ExportTraceServiceRequest, int]:
    """An ExportTraceServiceRequest with a mix of good and bad spans → (request, how many are bad)."""
    req = ExportTraceServiceRequest()
    bad = 0
    for r in range(draw(st.integers(1, 2))):
        rs = req.resource_spans.add()
        rs.resource.attributes.append(_kv("service.name", draw(st.text(max_size=10))))
        for _ in range(draw(st.integers(1, 2))):
            ss = rs.scope_spans.add()
            ss.scope.name = "fuzz"
            for i in range(draw(st.integers(0, 4))):
                kind = draw(st.sampled_from(SPAN_KINDS))
                s = ss.spans.add()
                s.name = draw(st.sampled_from(["openai.chat.completion", "agentlightning.annotation", "tool-run", "agent.run", ""]))
                s.trace_id = draw(st.binary(min_size=16, max_size=16))
                s.span_id = draw(st.binary(min_size=8, max_size=8))
                s.start_time_unix_nano = draw(st.integers(0, 2**63 - 1))
                s.end_time_unix_nano = draw(st.integers(0, 2**63 - 1))
                s.status.code = draw(st.sampled_from([0, 1, 2]))
                for key in draw(st.lists(st.sampled_from(["custom.a", "gen_ai.request.model", "gen_ai.tool.name", "x"]),
                                         max_size=3, unique=True)):
                    s.attributes.append(_kv(key, draw(ATTR_VALUES)))
                if kind != "no-ids":
                    s.attributes.append(_kv("agentlightning.rollout_id", f"{rollout}-{r}"))
                    s.attributes.append(_kv("agentlightning.attempt_id", "at-1"))
                if kind == GOOD:
                    s.attributes.append(_kv("agentlightning.span_sequence_id", i + 1))
                else:
                    bad += 1
                    for k, v in BAD_KINDS[kind].items():
                        s.attributes.append(_kv(k, v))
    return req, bad


def _hex_ids(obj: Any) -> Any:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON writes trace and span ids as hex."""
    import base64

    if isinstance(obj, dict):
        return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else _hex_ids(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids(x) for x in obj]
    return obj


def otlp_json(req: ExportTraceServiceRequest) -> bytes:
    from google.protobuf import json_format

    return json.dumps(_hex_ids(json_format.MessageToDict(req))).encode()


def _mutate(draw: Any, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(draw(st.integers(1, 6))):
        if not b:
            break
        i = draw(st.integers(0, len(b) - 1))
        op = draw(st.sampled_from(["flip", "drop", "dup", "insert"]))
        if op == "flip":
            b[i] = draw(st.integers(0, 255))
        elif op == "drop":
            del b[i]
        elif op == "dup":
            b[i:i] = b[i: i + draw(st.integers(1, 16))]
        else:
            b[i:i] = draw(st.binary(min_size=1, max_size=8))
    return bytes(b)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
NESTED = [b"[" * 100_000, b'{"resourceSpans":' * 30_000, b'{"a":' * 2000 + b"1" + b"}" * 2000, b"[" * 995 + b"]" * 995]


@st.composite
def otlp_bodies(draw: Any) -> tuple[bytes, str | None, str]:
    """→ (body, Content-Type or None, what it is)."""
    req, _bad = draw(otlp_requests(f"fz-{draw(st.integers(0, 99))}"))
    raw_pb = req.SerializeToString()
    kind = draw(st.sampled_from(["pb", "pb-truncated", "pb-mutated", "pb-random", "json", "json-truncated", "json-mutated",
                                 "json-random", "json-otlp-shaped", "nested", "empty", "huge"]))
    if kind == "pb":
        body, ctype = raw_pb, PROTOBUF
    elif kind == "pb-truncated":
        body, ctype = raw_pb[: draw(st.integers(0, max(len(raw_pb) - 1, 0)))], PROTOBUF
    elif kind == "pb-mutated":
        body, ctype = _mutate(draw, raw_pb), PROTOBUF
    elif kind == "pb-random":
        body, ctype = draw(st.binary(max_size=400)), PROTOBUF
    elif kind.startswith("json") and kind != "json-random" and kind != "json-otlp-shaped":
        body, ctype = otlp_json(req), JSON
        if kind == "json-truncated":
            body = body[: draw(st.integers(0, max(len(body) - 1, 0)))]
        elif kind == "json-mutated":
            body = _mutate(draw, body)
    elif kind == "json-random":
        body, ctype = json.dumps(draw(JSON_VALUES)).encode(), JSON
    elif kind == "json-otlp-shaped":
        # The right field names with wrong values in them.
        span = {k: draw(JSON_VALUES) for k in draw(st.lists(st.sampled_from(
            ["traceId", "spanId", "parentSpanId", "name", "startTimeUnixNano", "endTimeUnixNano", "attributes", "events",
             "status", "kind"]), max_size=5, unique=True))}
        body = json.dumps({"resourceSpans": [{"resource": {"attributes": draw(JSON_VALUES)},
                                              "scopeSpans": [{"spans": [span]}]}]}).encode()
        ctype = JSON
    elif kind == "nested":
        body, ctype = draw(st.sampled_from(NESTED)), JSON
    elif kind == "huge":
        body, ctype = draw(st.sampled_from([b"\x0a" * (MAX_BODY + 10), gzip.compress(b"\x00" * (4 * MAX_BODY))])), PROTOBUF
    else:
        body, ctype = b"", draw(st.sampled_from([PROTOBUF, JSON]))
    ctype = draw(st.sampled_from([ctype] * 6 + [None, "", "text/plain", "application/json; charset=utf-16",
                                                "application/x-protobuf; charset=binary", "multipart/form-data; boundary=x",
                                                "APPLICATION/JSON", "application/octet-stream"]))
    return body, ctype, kind


def _encode(draw: Any, body: bytes, headers: dict[str, str]) -> bytes:
    enc = draw(st.sampled_from(["none"] * 5 + ["gzip", "gzip", "gzip-truncated", "gzip-label-only", "deflate", "deflate-label-only",
                                              "br", "zstd", "bogus", "identity"]))
    if enc == "none":
        return body
    if enc == "gzip":
        headers["Content-Encoding"] = "gzip"
        return gzip.compress(body)
    if enc == "gzip-truncated":
        headers["Content-Encoding"] = "gzip"
        z = gzip.compress(body)
        return z[: draw(st.integers(0, len(z) - 1))]
    if enc == "deflate":
        headers["Content-Encoding"] = "deflate"
        return zlib.compress(body)
    headers["Content-Encoding"] = enc.removesuffix("-label-only")
    return body


def _auth(draw: Any, headers: dict[str, str]) -> None:
    auth = draw(st.sampled_from(["good"] * 6 + ["none", "bad", "weird"]))
    if auth == "good":
        headers["Authorization"] = f"Bearer {TOKEN}"
    elif auth == "bad":
        headers["Authorization"] = "Bearer " + draw(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=20))
    elif auth == "weird":
        headers["Authorization"] = draw(st.sampled_from(["Basic ////", "Bearer \xe9\xff", "Bearer", f"bearer {TOKEN}", f"Bearer  {TOKEN}"]))


@st.composite
def otlp_calls(draw: Any) -> tuple[str, str, dict[str, str], bytes, bytes, str | None]:
    body, ctype, _kind = draw(otlp_bodies())
    headers: dict[str, str] = {}
    if ctype is not None:
        headers["Content-Type"] = ctype
    _auth(draw, headers)
    sent = _encode(draw, body, headers)
    method = draw(st.sampled_from(["POST"] * 8 + ["GET", "PUT"]))
    path = draw(st.sampled_from(["/v1/traces"] * 8 + ["/v1/traces/", "/v1/traces?x=1", "/v1/trace"]))
    return method, path, headers, sent, body, ctype


# ---------------------------------------------------------------- Agent Lightning routes, anything else

EVENT_TYPES = st.sampled_from(["model_request", "reward", "agent_output", "custom", "", None, 5])


@st.composite
def event_bodies(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["event", "event", "event", "random", "nested", "truncated", "binary"]))
    if kind in ("event", "truncated"):
        data: Any = draw(st.one_of(JSON_VALUES, st.fixed_dictionaries({}, optional={
            "response": st.one_of(JSON_VALUES, st.fixed_dictionaries({}, optional={
                "choices": st.one_of(JSON_VALUES, st.lists(st.fixed_dictionaries({}, optional={
                    "token_ids": st.one_of(JSON_VALUES, st.lists(st.integers(-3, 2**33), max_size=3)),
                    "logprobs": JSON_VALUES, "finish_reason": JSON_VALUES}), max_size=2)),
                "prompt_token_ids": st.one_of(JSON_VALUES, st.lists(st.integers(0, 9), max_size=3)),
                "id": JSON_VALUES, "model": JSON_VALUES})),
            "value": st.one_of(JSON_VALUES, st.integers(), st.just(10**400), st.floats()),
            "latency_ms": st.one_of(JSON_VALUES, st.just(10**400), st.just(1e305), st.floats()),
            "model_version": st.one_of(JSON_VALUES, st.just(10**30), st.just(1e400), st.text(max_size=5)),
            "http_status": st.one_of(JSON_VALUES, st.integers()),
            "status": st.sampled_from(["error", "ok", 5]),
            "server": JSON_VALUES, "request": JSON_VALUES, "model": JSON_VALUES,
        })))
        body = json.dumps({"event_type": draw(EVENT_TYPES), "data": data}, allow_nan=True).encode()
        if kind == "truncated":
            body = body[: draw(st.integers(0, len(body) - 1))]
        return body
    if kind == "random":
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == "nested":
        return draw(st.sampled_from(NESTED))
    return draw(st.binary(max_size=200))


AGL_PATHS = ["/v1/agl/health", "/v1/agl/spans", "/v1/agl/spans/next", "/v1/agl/rollouts/ro-fz/attempts/at-1",
             "/v1/agl/resources/latest", "/v1/agl/resources/r1", "/v1/agl/workers/w1", "/v1/agl/queues/rollouts/dequeue",
             "/v1/agl/rollouts", "/v1/agl/"]


@st.composite
def agl_bodies(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["span", "span", "update", "random", "nested", "binary", "empty"]))
    if kind == "span":
        span = {k: draw(JSON_VALUES) for k in draw(st.lists(st.sampled_from(
            ["rollout_id", "attempt_id", "sequence_id", "trace_id", "span_id", "parent_id", "name", "status", "attributes",
             "events", "start_time", "end_time", "resource"]), max_size=8, unique=True))}
        for k in draw(st.lists(st.sampled_from(["rollout_id", "attempt_id", "trace_id", "span_id", "name"]), unique=True)):
            span[k] = "ro-fz" if k == "rollout_id" else "x1"
        if draw(st.booleans()):
            span["sequence_id"] = draw(st.integers(-2, 2**70))
        for k in ("start_time", "end_time"):
            if draw(st.booleans()):
                span[k] = draw(st.one_of(st.floats(allow_nan=True), st.integers(-(2**70), 2**70), st.just(10**400)))
        return json.dumps(span, allow_nan=True).encode()
    if kind == "update":
        return json.dumps({k: draw(JSON_VALUES) for k in draw(st.lists(st.sampled_from(
            ["status", "worker_id", "last_heartbeat_time", "metadata", "end_time"]), max_size=4, unique=True))}).encode()
    if kind == "random":
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == "nested":
        return draw(st.sampled_from(NESTED))
    if kind == "binary":
        return draw(st.binary(max_size=200))
    return b""


PATH_CHARS = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters="#"), max_size=40)
METHODS = st.sampled_from(["POST"] * 5 + ["GET"] * 3 + ["PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "FOO"])


@st.composite
def other_calls(draw: Any) -> tuple[str, str, dict[str, str], bytes]:
    route = draw(st.sampled_from(["events", "events", "agl", "agl", "api", "any"]))
    if route == "events":
        rid = draw(st.sampled_from(["ro-fz", "ro%20x", "%00", "a" * 300, "%ff%fe"]))
        path, body = f"/api/rollouts/{rid}/attempt/{draw(st.sampled_from(['at-1', '%2e%2e', 'x']))}/events", draw(event_bodies())
    elif route == "agl":
        path, body = draw(st.sampled_from(AGL_PATHS)), draw(agl_bodies())
    elif route == "api":
        path, body = "/api/" + draw(st.sampled_from(["rollouts", "rollouts/r", "models", "x/y/z", ""])), draw(event_bodies())
    else:
        path = draw(st.one_of(st.sampled_from(["/", "/healthz", "/metrics", "/v1", "/v1/logs", "/v1/metrics", "//v1/traces"]),
                              PATH_CHARS.map(lambda p: "/" + p)))
        body = draw(st.one_of(st.binary(max_size=100), event_bodies()))
    if draw(st.booleans()) and route != "any":
        path += "?" + draw(PATH_CHARS)
    headers: dict[str, str] = {}
    ctype = draw(st.sampled_from([JSON] * 4 + [None, "text/plain", PROTOBUF, "application/json; charset=latin-1", ""]))
    if ctype is not None:
        headers["Content-Type"] = ctype
    _auth(draw, headers)
    for name in draw(st.lists(st.sampled_from(["X-Forwarded-For", "Expect", "Accept", "Accept-Encoding", "X-Long", "Origin"]),
                              max_size=2, unique=True)):
        headers[name] = "y" * 9000 if name == "X-Long" else draw(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e),
                                                                           max_size=20))
    body = _encode(draw, body, headers)
    return draw(METHODS), path, headers, body


# ---------------------------------------------------------------- sending and checking

def send(port: int, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest(method, path, skip_accept_encoding="Accept-Encoding" in headers)
        for k, v in headers.items():
            conn.putheader(k, v.encode("latin-1", "replace"))
        conn.putheader("Content-Length", str(len(body)))
        try:
            conn.endheaders(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered (and closed) before reading a body it will not use: read the answer
        try:
            resp = conn.getresponse()
        except (ConnectionError, http.client.RemoteDisconnected):
            return 0, {}, b""
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


STANDARD_METHODS = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE"}


def check(base: str, what: str, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
    TRIED[what] += 1
    port = _port(base)
    try:
        status, rh, answer = send(port, method, path, headers, body)
    except (ConnectionError, http.client.HTTPException, socket.timeout) as exc:
        raise AssertionError(f"{what}: {method} {path[:80]} ({len(body)} bytes) broke the connection: {exc!r}") from exc
    shown = f"{what}: {method} {path[:80]} {headers if len(str(headers)) < 300 else '(long headers)'} body[:80]={body[:80]!r} " \
            f"({len(body)} bytes) -> {status} {answer[:300]!r}"
    if status == 0:
        assert send(port, "GET", "/healthz", {}, b"")[0] == 200, f"dead after {shown}"
        return status, rh, answer
    # 501 with the reason is the answer to Agent Lightning calls this gateway does not serve (their own tests say
    # which); any other 5xx is a fault.
    assert status < 500 or (status == 501 and (method == "HEAD" or answer.startswith(b'{"detail": '))), shown
    assert b"Traceback" not in answer and b'File "' not in answer, shown
    parsed = method in STANDARD_METHODS and all(len(v) < 8190 for v in headers.values())  # else aiohttp's parser answers
    if 400 <= status < 500 and status not in (404, 405) and method != "HEAD" and parsed:
        assert answer.strip(), f"no reason given: {shown}"
        assert b"\n" not in answer.strip(), f"the reason is not one line: {shown}"
    return status, rh, answer


def _rejected(status_body: bytes, ctype: str) -> tuple[int, str]:
    if ctype.startswith(JSON):
        ps = json.loads(status_body).get("partialSuccess", {})
        return int(ps.get("rejectedSpans", 0)), ps.get("errorMessage", "")
    resp = ExportTraceServiceResponse.FromString(status_body)
    return resp.partial_success.rejected_spans, resp.partial_success.error_message


def _gateway_ctype(headers: dict[str, str]) -> str:
    return headers.get("Content-Type", PROTOBUF).split(";")[0].strip().lower()


def account_otlp(status: int, headers: dict[str, str], answer: bytes, sent_body: bytes) -> None:
    """An OTLP request answered 200: every span in it was accepted or counted as rejected."""
    from producers.ingest.front_door import inflate
    from producers.ingest.otlp_decoding import decode_request

    if status != 200:
        return
    ctype = _gateway_ctype(headers)
    # What the gateway decoded (it answered 200, so it could): a body labelled deflate that is not
    # zlib is read as bare deflate, as clients that omit the header send it.
    try:
        plain = inflate(sent_body, headers.get("Content-Encoding", ""), 1 << 30) if sent_body else b""
        req = decode_request(plain, ctype)
    except ValueError as exc:
        raise AssertionError(f"answered 200 to a body that does not decode ({exc}): {headers} {sent_body[:200]!r}") from exc
    sent = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
    rejected, message = _rejected(answer, ctype)
    assert 0 <= rejected <= sent, (sent, rejected, message)
    assert (rejected > 0) == bool(message), message
    LEDGER["accepted"] += sent - rejected
    LEDGER["rejected"] += rejected


def metrics(base: str) -> dict[str, float]:
    text = requests.get(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).text
    out = {}
    for name in ("rolloutbus_gateway_spans_accepted_total", "rolloutbus_gateway_spans_rejected_total"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        assert m, text[:2000]
        out[name.removeprefix("rolloutbus_gateway_spans_").removesuffix("_total")] = float(m.group(1))
    return out


FUZZ = settings(print_blob=False, verbosity=Verbosity.quiet, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture,
                                       HealthCheck.large_base_example])


@settings(FUZZ, max_examples=600)
@given(call=otlp_calls())
def test_fuzz_otlp(gateway: str, call: tuple[str, str, dict[str, str], bytes, bytes, str | None]) -> None:
    method, path, headers, sent, _plain, _ctype = call
    status, _rh, answer = check(gateway, "otlp", method, path, headers, sent)
    if method == "POST" and path.split("?")[0] == "/v1/traces":
        account_otlp(status, headers, answer, sent)


@settings(FUZZ, max_examples=500)
@given(call=other_calls())
def test_fuzz_agent_lightning_and_other_routes(gateway: str, call: tuple[str, str, dict[str, str], bytes]) -> None:
    method, path, headers, body = call
    status, _rh, _answer = check(gateway, "agl+other", method, path, headers, body)
    if re.fullmatch(r"/api/rollouts/[^/]+/attempt/[^/]+/events", path.split("?")[0]) and method == "POST":
        LEDGER["accepted" if status == 200 else "rejected" if status == 422 else "refused"] += 1


NASTY = [b"[" * 100_000, b'{"resourceSpans":' * 30_000, b"{", b"", b"\xff\xfe\x00", b"[1," * 60_000 + b"1]", b"null",
         b'{"resourceSpans": null}', b'{"resourceSpans": [null]}', b'{"resourceSpans": [{"scopeSpans": [{"spans": [null]}]}]}',
         b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": 5}]}]}]}',
         b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "1e400"}]}]}]}',
         b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": -1}]}]}]}',
         b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "\\ud800"}]}]}]}',
         b'{"event_type": "reward", "data": {"value": 1e999}}', b'{"event_type": "model_request", "data": {"latency_ms": 1e305}}',
         b'{"event_type": "model_request", "data": {"model_version": 1e400}}', b'{"event_type": "reward", "data": {"value": '
         + b"9" * 400 + b"}}", b'{"event_type": "model_request", "data": {"latency_ms": ' + b"9" * 400 + b"}}"]
NASTY_PATHS = ["/v1/traces", "/api/rollouts/ro-fz/attempt/at-1/events", "/api/rollouts", "/v1/agl/spans",
               "/v1/agl/rollouts/ro-fz/attempts/at-1", "/v1/agl/workers/w1", "/v1/agl/spans/next", "/healthz", "/metrics"]


def test_every_route_with_every_nasty_body(gateway: str) -> None:
    """The table behind the random cases: each route, each nasty body, JSON and protobuf."""
    for path in NASTY_PATHS:
        for body in NASTY:
            for ctype in (JSON, PROTOBUF):
                headers = {"Content-Type": ctype, "Authorization": f"Bearer {TOKEN}"}
                status, _rh, answer = check(gateway, "table", "POST", path, headers, body)
                if path == "/v1/traces":
                    account_otlp(status, headers, answer, body)
                elif path.endswith("/events"):
                    LEDGER["accepted" if status == 200 else "rejected" if status == 422 else "refused"] += 1


def test_every_span_is_accepted_or_counted_as_rejected(gateway: str, kafka_bootstrap: str, fuzz_topics: Any) -> None:
    """A sample of well-formed OTLP requests (protobuf and JSON, gzip or not), each a known mix of good
    spans and spans the gateway must refuse: the ones it accepts are exactly the records on the spans
    topic, the others are counted in partial_success and /metrics. Spans sent = accepted + rejected."""
    before = metrics(gateway)
    run = f"acct-{uuid.uuid4().hex[:8]}"
    sent = bad = rejected = 0
    reasons: list[str] = []

    @settings(FUZZ, max_examples=40)
    @given(req=otlp_requests(run), as_json=st.booleans(), gz=st.booleans())
    def one(req: tuple[ExportTraceServiceRequest, int], as_json: bool, gz: bool) -> None:
        nonlocal sent, bad, rejected
        message, n_bad = req
        plain = otlp_json(message) if as_json else message.SerializeToString()
        headers = {"Content-Type": JSON if as_json else PROTOBUF, "Authorization": f"Bearer {TOKEN}"}
        body = gzip.compress(plain) if gz else plain
        if gz:
            headers["Content-Encoding"] = "gzip"
        status, _rh, answer = check(gateway, "accounting", "POST", "/v1/traces", headers, body)
        assert status == 200, answer[:500]
        r, why = _rejected(answer, headers["Content-Type"])
        sent += sum(len(ss.spans) for rs in message.resource_spans for ss in rs.scope_spans)
        bad += n_bad
        rejected += r
        reasons.append(why)

    one()
    assert rejected == bad, f"the gateway rejected {rejected} spans, {bad} were bad: {[r for r in reasons if r][:5]}"
    assert sent > bad > 0
    on_topic = _count_records(kafka_bootstrap, fuzz_topics.spans, run, expect=sent - bad)
    after = metrics(gateway)
    assert on_topic == sent - bad, f"{sent} spans sent, {bad} rejected, {on_topic} on the topic"
    assert after["accepted"] - before["accepted"] == sent - bad
    assert after["rejected"] - before["rejected"] == rejected
    TRIED["accounting spans"] = sent
    LEDGER["accepted"] += sent - bad
    LEDGER["rejected"] += rejected


def _count_records(bootstrap: str, topic: str, prefix: str, expect: int, timeout: float = 30.0) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"fz-{uuid.uuid4().hex}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    n = 0
    deadline, quiet_until = time.monotonic() + timeout, None
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                if n >= expect:
                    quiet_until = quiet_until or time.monotonic() + 1.5  # a short grace read: duplicates must show up too
                    if time.monotonic() > quiet_until:
                        break
                continue
            if msg.error():
                continue
            _name, rec = decode_raw(msg.value())
            n += str(rec.get("rollout_id", "")).startswith(prefix)
    finally:
        c.close()
    return n


def test_the_gateway_is_healthy_and_its_counters_add_up_after_fuzzing(gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert requests.get(f"{gateway}/healthz", timeout=5).status_code == 200
    m = metrics(gateway)
    assert m["accepted"] == LEDGER["accepted"], (m, LEDGER)
    assert m["rejected"] == LEDGER["rejected"], (m, LEDGER)
    memory = assert_memory_bounded("gateway", *RSS["gateway"])
    with capsys.disabled():
        print(f"\ngateway fuzz cases tried: {dict(TRIED)} (total {sum(v for k, v in TRIED.items() if k != 'accounting spans')}); "
              f"spans accepted {LEDGER['accepted']}, rejected {LEDGER['rejected']} (= /metrics), 0 x 5xx; resident {memory}")
