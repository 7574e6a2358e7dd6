"""Property-based fuzzing of every route of ``rolloutbus proxy``.

Two proxies run as the real command with a token: one in front of a fake upstream whose answer the
request's ``model`` picks (a completion, an event stream, an upstream error, or a 200 that is no
completion at all: garbage, a list, ids of the wrong type, NaN, deep nesting, an empty body), one in
front of a port where nothing listens. Hypothesis sends them malformed, truncated, deeply nested and
huge bodies, wrong content types and encodings, random paths, methods and headers (sequence ids,
agent names, hop-by-hop, Authorization). No answer may be 5xx — except the dead upstream's 502, which
must say so as a JSON ``upstream_error`` — or carry a traceback; both proxies must still answer
``/healthz`` afterwards, and their logs must hold no traceback and no span it could not encode. The
number of cases tried is printed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, Verbosity, given, settings
from hypothesis import strategies as st

from tests.integration.serverprocs import assert_memory_bounded, rss_mib

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
TOKEN = "fuzz-proxy-tok-5a1e"
TRIED: dict[str, int] = {}
RSS: dict[str, tuple[int, float]] = {}  # each proxy's pid and resident MiB before fuzzing
ROUTES = ["/rollout/r1/attempt/a1/v1/chat/completions", "/rollout/r1/attempt/a1/v1/completions"]
PATHS = ROUTES + ["/healthz", "/metrics", "/rollout/r1/attempt/a1/v1", "/v1/chat/completions",
                  "/rollout/%ff%00/attempt/%2e%2e/v1/chat/completions", "/rollout//attempt/a/v1/completions"]
# What the fake upstream answers, by the request's model (a 200 the proxy must survive, unless said).
UPSTREAM = r'''
import json, sys
from aiohttp import web
ODD = {
    "garbage": b"not json {",
    "list": b"[1, 2]",
    "badids": json.dumps({"id": 5, "model": ["m"], "prompt_token_ids": [-1, "x"], "choices": [
        {"index": "0", "token_ids": [2 ** 40]}, 5, {"index": -1},
        {"index": 3, "token_ids": [1, 2], "logprobs": {"content": [{"logprob": "x"}, 5]}, "message": {"content": 7},
         "finish_reason": 9, "text": ["t"]}]}).encode(),
    "nan": b'{"choices": [{"index": 0, "token_ids": [1], "logprobs": {"content": [{"logprob": NaN}]}, "message": {"content": "a"}}]}',
    "deep": b'{"choices": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "empty": b"",
}
def completion(body, chat):
    ids = [80, 97, 114]
    choice = {"index": 0, "token_ids": ids, "finish_reason": "stop"}
    if chat:
        choice["message"] = {"role": "assistant", "content": "Par"}
        choice["logprobs"] = {"content": [{"token": "P", "logprob": -0.1}] * 3}
    else:
        choice["text"] = "Par"
        choice["logprobs"] = {"token_logprobs": [-0.1] * 3}
    return {"id": "c1", "model": "m", "prompt_token_ids": [1, 2], "choices": [choice]}
async def handle(request):
    try:
        body = json.loads(await request.read())
    except Exception:
        return web.json_response({"error": {"message": "bad json"}}, status=400)
    model = body.get("model") if isinstance(body, dict) else None
    if model == "err":
        return web.json_response({"error": {"message": "nope"}}, status=422)
    raw = ODD.get(model) or json.dumps(completion(body, request.path.endswith("chat/completions"))).encode()
    if not body.get("stream"):
        return web.Response(body=raw, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b"data: " + raw + b"\n\ndata: " + raw[:7] + b"\n\ndata: [DONE]\n\n")
    return resp
app = web.Application(client_max_size=128 << 20)
app.router.add_post("/v1/chat/completions", handle)
app.router.add_post("/v1/completions", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
'''
MODELS = ["ok", "err", "garbage", "list", "badids", "nan", "deep", "empty"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _up(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(150):
        assert proc.poll() is None, f"{proc.args} exited"
        try:
            requests.post(url, timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not come up")


@pytest.fixture(scope="module")
def proxies(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, Path]]]:
    """{"live": (port, log), "dead": (port, log)}: proxies in front of the fake upstream and of nothing."""
    from foundation.config import Topics
    from foundation.kafka_admin import ensure_topics, topic_specs

    topics = Topics(f"t{uuid.uuid4().hex[:10]}.")
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, topic_specs(topics, span_partitions=1))
    tmp = tmp_path_factory.mktemp("fuzz-proxy")
    (tmp / "upstream.py").write_text(UPSTREAM)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTBUS_")},
           "PYTHONPATH": str(REPO), "ROLLOUTBUS_KAFKA_BOOTSTRAP": kafka_bootstrap, "ROLLOUTBUS_TOPIC_PREFIX": topics.prefix,
           "ROLLOUTBUS_PROXY_TOKEN": TOKEN}
    up_port = _port()
    procs = [subprocess.Popen([sys.executable, str(tmp / "upstream.py"), str(up_port)], env=env)]
    out: dict[str, tuple[int, Path]] = {}
    try:
        _up(f"http://127.0.0.1:{up_port}/v1/completions", procs[0])
        for name, upstream in (("live", up_port), ("dead", _port())):
            port, log = _port(), tmp / f"{name}.log"
            with log.open("wb") as f:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "producers.ingest.llm_proxy_cli", "--upstream", f"http://u:pw-{name}@127.0.0.1:{upstream}/v1",
                     "--port", str(port), "--max-response-bytes", str(4 << 20)],
                    env={**env, "ROLLOUTBUS_DATA_DIR": str(tmp / name)}, stdout=f, stderr=subprocess.STDOUT))
            _up(f"http://127.0.0.1:{port}/healthz", procs[-1])
            out[name] = (port, log)
            RSS[name] = (procs[-1].pid, rss_mib(procs[-1].pid))
        yield out
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)


# ---------------------------------------------------------------- what is sent

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def payloads(draw: Any) -> bytes:
    """A body: mostly a request the proxy takes (so that it reaches the upstream), else anything."""
    kind = draw(st.sampled_from(["request"] * 4 + ["truncated", "json", "nested", "huge", "binary", "utf16", "latin1", "surrogates", "empty"]))
    if kind in ("request", "truncated"):
        body: dict[str, Any] = {"model": draw(st.sampled_from(MODELS) | st.text(max_size=8))}
        body["messages"] = draw(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", ""]), "content": JSON}),
                                         max_size=3) | JSON)
        for key in ("prompt", "stream", "n", "logprobs", "return_token_ids", "max_tokens", "temperature"):
            if draw(st.booleans()):
                body[key] = draw(st.booleans() if key == "stream" else JSON)
        raw = json.dumps(body, allow_nan=True).encode()
        return raw[: draw(st.integers(0, max(len(raw) - 1, 0)))] if kind == "truncated" else raw
    return {
        "json": lambda: json.dumps(draw(JSON), allow_nan=True).encode(),
        "nested": lambda: draw(st.sampled_from([b"[" * 100_000, b'{"messages":' * 50_000, b'{"prompt": ' + b"[" * 990 + b"]" * 990 + b"}",
                                                b'{"model": "ok", "messages": [' + b"{}," * 200_000 + b"{}]}"])),
        "huge": lambda: draw(st.sampled_from([b"x" * (3 << 20), b'{"model": "ok", "prompt": "' + b"a" * (3 << 20) + b'"}'])),
        "binary": lambda: draw(st.binary(max_size=300)),
        "utf16": lambda: json.dumps({"model": "ok", "messages": [{"role": "user", "content": "é"}]}).encode("utf-16"),
        "latin1": lambda: '{"model": "ok", "prompt": "é"}'.encode("latin-1"),
        "surrogates": lambda: b'{"model": "ok\\ud800", "prompt": "\\udc8a", "messages": [{"role": "\\udfff", "content": "\\ud83d"}]}',
        "empty": lambda: b"",
    }[kind]()


HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xff), max_size=24)


@st.composite
def calls(draw: Any) -> tuple[str, str, dict[str, str], bytes]:
    method = draw(st.sampled_from(["POST"] * 6 + ["GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]))
    path = draw(st.sampled_from(PATHS) | st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e,
                                                                         exclude_characters="#?"), max_size=40).map(lambda p: "/" + p))
    headers = {"Content-Type": draw(st.sampled_from(["application/json", "text/plain", "application/json; charset=utf-16",
                                                     "application/json; charset=nonsense", "multipart/form-data", ""]))}
    auth = draw(st.sampled_from(["good"] * 5 + ["none", "bad"]))
    if auth != "none":
        headers["Authorization"] = f"Bearer {TOKEN}" if auth == "good" else "Bearer " + draw(HEADER_TEXT)
    extra = {"x-rolloutbus-sequence-id": st.sampled_from(["0", "7", "-1", "²", "1" * 40, "1e3", " 5 "]) | HEADER_TEXT,
             "x-rolloutbus-agent-name": HEADER_TEXT, "Content-Encoding": st.sampled_from(["gzip", "deflate", "br", "bogus"]),
             "Connection": st.sampled_from(["keep-alive, X-Foo", "close", "upgrade"]), "TE": st.just("trailers"),
             "Upgrade": st.just("websocket"), "Proxy-Authorization": st.just("Basic eDp5")}
    for name in draw(st.lists(st.sampled_from(sorted(extra)), max_size=3, unique=True)):
        headers[name] = draw(extra[name])
    return method, path, headers, draw(payloads())


def fire(which: str, port: int, call: tuple[str, str, dict[str, str], bytes]) -> None:
    method, path, headers, body = call
    if any(v != v.strip() or "\r" in v or "\n" in v for v in headers.values()):
        return  # not a header a client can send (requests refuses it too)
    TRIED[which] = TRIED.get(which, 0) + 1
    try:
        resp = requests.request(method, f"http://127.0.0.1:{port}{path}", data=body, timeout=60,
                                headers={k: v.encode("latin-1") for k, v in headers.items()})
        status, answer = resp.status_code, resp.content
    except requests.ConnectionError:
        status, answer = 0, b""  # closed mid-request (a body it would not read): fine if it still answers
    shown = f"{which}: {method} {path[:60]} {headers} body[:80]={body[:80]!r} ({len(body)} bytes) -> {status} {answer[:300]!r}"
    assert b"Traceback" not in answer, shown
    if which == "dead" and status == 502:
        assert json.loads(answer)["error"]["type"] == "upstream_error", shown
        assert b"pw-dead" not in answer, shown
    else:
        assert status < 500, shown
    if status == 0:
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200, f"dead after {shown}"


FUZZ = settings(print_blob=False, verbosity=Verbosity.quiet, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])


@settings(FUZZ, max_examples=400)
@given(call=calls())
def test_fuzz_proxy_in_front_of_an_odd_upstream(proxies: dict[str, tuple[int, Path]], call: tuple[str, str, dict[str, str], bytes]) -> None:
    fire("live", proxies["live"][0], call)


@settings(FUZZ, max_examples=150)
@given(call=calls())
def test_fuzz_proxy_in_front_of_nothing(proxies: dict[str, tuple[int, Path]], call: tuple[str, str, dict[str, str], bytes]) -> None:
    fire("dead", proxies["dead"][0], call)


def test_every_upstream_answer_streamed_or_not(proxies: dict[str, tuple[int, Path]]) -> None:
    """The table behind the random cases: each odd upstream answer on each route, plain and streamed."""
    good = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for route in ROUTES:
        for model in MODELS:
            for stream in (False, True):
                body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "stream": stream})
                fire("live", proxies["live"][0], ("POST", route, good, body.encode()))


def test_both_proxies_still_healthy_with_clean_logs(proxies: dict[str, tuple[int, Path]], capsys: pytest.CaptureFixture[str]) -> None:
    for name, (port, log) in proxies.items():
        for _ in range(50):  # the transport encodes on its own thread: let it catch up
            health = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
            if health.json().get("queued"):
                time.sleep(0.2)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["encode_errors"] == 0, f"{name}: a span it could not encode"
        text = log.read_text(errors="replace")
        # aiohttp logs the requests its own parser refuses (400) with their trace; none may run through ours.
        ours = re.search(rf'File "{re.escape(str(REPO))}/(?!\.venv/).*', text)
        assert ours is None and "cannot encode" not in text, f"{name}: {text[max(0, ours.start() - 2000 if ours else -3000):][:4000]}"
        assert f"pw-{name}" not in text
    memory = ", ".join(assert_memory_bounded(f"{name} proxy", *RSS[name]) for name in proxies)
    with capsys.disabled():
        print(f"\nproxy fuzz cases tried: {TRIED} (total {sum(TRIED.values())}), 0 unintended 5xx; resident {memory}")
