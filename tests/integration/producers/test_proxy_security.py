"""``rolloutbus proxy`` in front of any upstream, safely: credentials in the upstream URL never shown,
the client's Authorization never sent upstream, token-id fields asked only of upstreams that take them,
hop-by-hop headers dropped both ways, upstream answers bounded, bad client bodies answered 400.

The proxy runs as the real command (its log captured, at DEBUG); the upstream is a fake OpenAI server in
this process that records what reached it; spans are read back from the real broker.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp import web

from producers_testkit import REPO, consume_all, free_port
from schemas.codec import unpack_tokens

pytestmark = pytest.mark.integration

URL_PASSWORD = "url-pw-4f9c2e71"
API_KEY = "sk-upstream-8a3d5b19"
TOKEN = "proxy-tok-6e0c1d42"
CLIENT_KEY = "sk-client-own-2b7f"
ANSWER = "Paris."
MSGS = [{"role": "user", "content": "Capital of France?"}]
BOUND = 200_000


@dataclass
class Upstream:
    """A fake OpenAI-compatible server on a thread; what the request's ``model`` names, it does."""

    seen: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)  # (headers, body) of each call
    port: int = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((dict(request.headers), body))
        model = body.get("model")
        ids = [ord(c) for c in ANSWER]
        completion: dict[str, Any] = {"id": f"c{len(self.seen)}", "model": model,
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER},
                                                   "finish_reason": "stop"}]}
        if body.get("return_token_ids"):
            completion["prompt_token_ids"] = [1, 2, 3]
            completion["choices"][0]["token_ids"] = ids
        if model == "echo-auth":  # an upstream that quotes the credential it refuses
            return web.json_response({"error": {"message": f"bad key: {request.headers.get('Authorization')}"}}, status=401)
        if model == "hop":
            return web.json_response(completion, headers={
                "Connection": "keep-alive, X-Hop-Named", "X-Hop-Named": "1", "Keep-Alive": "timeout=5",
                "Proxy-Authenticate": "Basic realm=up", "Trailer": "X-Checksum", "Upgrade": "h2c", "X-End-To-End": "kept"})
        if model == "big":  # larger than the bound, no Content-Length
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            for _ in range(64):
                await resp.write(b" " * (1 << 20))
            return resp
        if model == "bomb":  # small on the wire, 32 MiB decoded
            return web.Response(body=gzip.compress(b" " * (32 << 20)), headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
        if model == "endless-stream":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            chunk = {"id": "s", "model": model, "choices": [{"index": 0, "delta": {"content": "x" * 1000}}]}
            for _ in range(64 << 10):  # 64 MiB offered; the proxy must stop reading long before
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            return resp
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for part in (ANSWER[:3], ANSWER[3:]):
                delta: dict[str, Any] = {"index": 0, "delta": {"content": part}}
                await resp.write(b"data: " + json.dumps({"id": "s1", "model": model, "choices": [delta]}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return web.json_response(completion)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    app = web.Application(client_max_size=1 << 20)
    app.router.add_post("/v1/chat/completions", up.chat)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    up.port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield up
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@dataclass
class Proxy:
    base: str
    proc: subprocess.Popen[bytes]
    log: Path

    def chat(self, model: str, headers: dict[str, str] | None = None, **extra: Any) -> requests.Response:
        return requests.post(f"{self.base}/rollout/ro-s/attempt/at-s/v1/chat/completions",
                             json={"model": model, "messages": MSGS, **extra}, headers=headers or {}, timeout=30)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        return self.log.read_text(errors="replace")


@pytest.fixture
def start_proxy(test_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Proxy]]:
    started: list[Proxy] = []

    def start(upstream: str, *flags: str, **env: str) -> Proxy:
        port = free_port()
        log = tmp_path / f"proxy-{port}.log"
        penv = {**test_env, "PYTHONPATH": str(REPO), "ROLLOUTBUS_DATA_DIR": str(tmp_path / f"px-{port}"), **env}
        for name in ("ROLLOUTBUS_PROXY_TOKEN", "ROLLOUTBUS_PROXY_UPSTREAM_API_KEY"):
            if name not in env:
                penv.pop(name, None)
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "producers.ingest.llm_proxy_cli", "-v", "--upstream", upstream,
                                     "--port", str(port), *flags], env=penv, stdout=out, stderr=subprocess.STDOUT)
        px = Proxy(f"http://127.0.0.1:{port}", proc, log)
        started.append(px)
        for _ in range(150):
            assert proc.poll() is None, f"the proxy exited: {log.read_text()[-2000:]}"
            try:
                requests.get(f"{px.base}/healthz", timeout=1)
                return px
            except requests.ConnectionError:
                time.sleep(0.2)
        raise AssertionError("the proxy did not come up")

    yield start
    for px in started:
        px.stop()


def _spans(kafka_conf: dict[str, Any], topics: Any, expect: int) -> list[dict[str, Any]]:
    """The spans recorded, in the order of the calls."""
    spans = [rec for _k, _name, rec, _p in consume_all(kafka_conf, topics.spans, expect=expect, timeout=30)]
    return sorted(spans, key=lambda s: s["start_time_ns"])


def test_credentials_in_the_upstream_url_are_used_but_never_shown(
        upstream: Upstream, start_proxy: Callable[..., Proxy], kafka_conf: dict[str, Any], topics: Any) -> None:
    url = f"http://alice:{URL_PASSWORD}@127.0.0.1:{upstream.port}/v1"
    px = start_proxy(url)
    ok = px.chat("tiny")
    refused = px.chat("echo-auth")
    health = requests.get(f"{px.base}/healthz", timeout=5)
    dead_port = free_port()
    dead = start_proxy(f"http://alice:{URL_PASSWORD}@127.0.0.1:{dead_port}/v1")
    unreachable = dead.chat("tiny")
    dead_health = requests.get(f"{dead.base}/healthz", timeout=5)
    logs = px.stop() + dead.stop()
    spans = _spans(kafka_conf, topics, expect=3)

    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == ANSWER
    assert upstream.seen[0][0]["Authorization"] == "Basic YWxpY2U6dXJsLXB3LTRmOWMyZTcx", "the URL's user:password, as Basic"
    assert refused.status_code == 401 and refused.json()["error"]["message"].startswith("bad key: Basic ")
    assert unreachable.status_code == 502
    assert f"alice:***@127.0.0.1:{dead_port}" in unreachable.json()["error"]["message"], unreachable.text
    assert f"alice:***@127.0.0.1:{upstream.port}" in logs, "the start line names the upstream, redacted"
    for shown in (ok.text, refused.text, unreachable.text, health.text, dead_health.text, logs, repr(spans)):
        assert URL_PASSWORD not in shown and "YWxpY2U6dXJsLXB3LTRmOWMyZTcx" not in shown
    for answer in (health, dead_health):
        assert answer.status_code == 200 and answer.json()["status"] == "ok"
        assert "127.0.0.1" not in answer.text and "upstream" not in answer.text, f"/healthz shows configuration: {answer.text}"
    assert [s["status_code"] for s in spans] == ["OK", "ERROR", "ERROR"]
    assert "401" in spans[1]["status_message"] and "unreachable" in spans[2]["status_message"]


def test_the_clients_authorization_never_reaches_the_upstream(upstream: Upstream, start_proxy: Callable[..., Proxy]) -> None:
    url = f"http://127.0.0.1:{upstream.port}/v1"
    with_key = start_proxy(url, ROLLOUTBUS_PROXY_UPSTREAM_API_KEY=API_KEY)
    assert with_key.chat("tiny", {"Authorization": f"Bearer {CLIENT_KEY}"}).status_code == 200
    both = start_proxy(url, ROLLOUTBUS_PROXY_UPSTREAM_API_KEY=API_KEY, ROLLOUTBUS_PROXY_TOKEN=TOKEN)
    assert both.chat("tiny", {"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # No upstream key: the agent's proxy token (ROLLOUTBUS_LLM_PROXY_TOKEN), or any other, stays here.
    bare = start_proxy(url)
    assert bare.chat("tiny", {"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert bare.chat("tiny", {"Authorization": f"Bearer {CLIENT_KEY}", "Proxy-Authorization": "Basic eDp5"}).status_code == 200

    sent = [headers.get("Authorization") for headers, _body in upstream.seen]
    assert sent == [f"Bearer {API_KEY}", f"Bearer {API_KEY}", None, None]
    assert all("Proxy-Authorization" not in headers for headers, _ in upstream.seen)


def test_openai_upstream_gets_no_token_id_fields_and_its_spans_keep_the_text(
        upstream: Upstream, start_proxy: Callable[..., Proxy], kafka_conf: dict[str, Any], topics: Any) -> None:
    px = start_proxy(f"http://127.0.0.1:{upstream.port}/v1", "--upstream-kind", "openai")
    plain = px.chat("gpt-x")
    streamed = px.chat("gpt-x", stream=True)
    vllm = start_proxy(f"http://127.0.0.1:{upstream.port}/v1")  # the default kind asks for ids
    assert vllm.chat("tiny").status_code == 200
    spans = _spans(kafka_conf, topics, expect=3)

    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"] == ANSWER
    assert streamed.status_code == 200 and streamed.text.count("data: ") == 3
    bodies = [body for _h, body in upstream.seen]
    assert [{k for k in b if k in ("return_token_ids", "logprobs")} for b in bodies] == [set(), set(), {"return_token_ids", "logprobs"}]
    assert bodies[0] == {"model": "gpt-x", "messages": MSGS}, "an openai upstream gets the request as the client wrote it"
    by_model = sorted(spans, key=lambda s: s["llm"]["model"])
    for s in by_model[:2]:
        assert s["status_code"] == "OK" and s["llm"]["model"] == "gpt-x"
        assert s["attributes"]["gen_ai.completion"] == ANSWER and s["attributes"]["gen_ai.prompt"] == "user: Capital of France?"
        assert s["attributes"]["rolloutbus.token_ids_missing"] == "prompt,response"
        assert list(unpack_tokens(s["llm"]["response_token_ids"])) == []
    assert "rolloutbus.token_ids_missing" not in by_model[2]["attributes"]
    assert "".join(map(chr, unpack_tokens(by_model[2]["llm"]["response_token_ids"]))) == ANSWER


def test_hop_by_hop_headers_are_dropped_both_ways(upstream: Upstream, start_proxy: Callable[..., Proxy]) -> None:
    px = start_proxy(f"http://127.0.0.1:{upstream.port}/v1")
    resp = px.chat("hop", {"Connection": "keep-alive, X-Client-Named", "X-Client-Named": "1", "Keep-Alive": "timeout=9",
                           "TE": "trailers", "Trailer": "X-Sum", "Upgrade": "foo/2", "Proxy-Authorization": "Basic eDp5"})
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == ANSWER
    assert resp.headers["X-End-To-End"] == "kept"
    for name in ("X-Hop-Named", "Keep-Alive", "Proxy-Authenticate", "Trailer", "Upgrade"):
        assert name not in resp.headers, f"{name} passed back to the client: {dict(resp.headers)}"
    got = {k.lower() for k in upstream.seen[0][0]}
    assert not got & {"x-client-named", "te", "trailer", "upgrade", "proxy-authorization"}, got


def test_upstream_answers_are_bounded(upstream: Upstream, start_proxy: Callable[..., Proxy],
                                      kafka_conf: dict[str, Any], topics: Any) -> None:
    px = start_proxy(f"http://127.0.0.1:{upstream.port}/v1", "--max-response-bytes", str(BOUND))
    big = px.chat("big")
    bomb = px.chat("bomb")
    with requests.post(f"{px.base}/rollout/ro-s/attempt/at-s/v1/chat/completions", stream=True, timeout=30,
                       json={"model": "endless-stream", "messages": MSGS, "stream": True}) as resp:
        received = b"".join(resp.iter_content(None))
    assert px.chat("tiny").status_code == 200, "still serving"
    spans = _spans(kafka_conf, topics, expect=4)

    for answer in (big, bomb):
        assert answer.status_code == 502, answer.text[:300]
        assert f"larger than the bound of {BOUND} bytes" in answer.json()["error"]["message"]
    assert resp.status_code == 200 and len(received) < BOUND + 4096
    last = received.rstrip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"data: ") and f"larger than the bound of {BOUND} bytes".encode() in last, last[:300]
    assert "error" in json.loads(last[6:])
    assert [s["status_code"] for s in spans] == ["ERROR", "ERROR", "ERROR", "OK"]
    assert all(str(BOUND) in s["status_message"] for s in spans[:3])


BAD_BODIES = [
    (b"[" * 100_000, "nested too deeply"),
    (b'{"messages":' * 50_000, "nested too deeply"),
    (json.dumps({"model": "m", "messages": 5}).encode(), "messages must be a list"),
    (json.dumps({"model": "m", "messages": [5]}).encode(), "messages must be a list"),
    (json.dumps({"model": 5, "messages": MSGS}).encode(), "model must be a string"),
    (b"[1, 2]", "must be a JSON object"),
    (b'"text"', "must be a JSON object"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "must be UTF-8"),
    (b'{"model": "m", "messages": [], "temperature": NaN}', "NaN is not JSON"),
    (b'{"model": "m"', "not JSON"),
    (b"", "not JSON"),
]


def test_bad_client_bodies_get_400_with_one_line(upstream: Upstream, start_proxy: Callable[..., Proxy]) -> None:
    px = start_proxy(f"http://127.0.0.1:{upstream.port}/v1")
    wrong = []
    for body, reason in BAD_BODIES:
        resp = requests.post(f"{px.base}/rollout/r/attempt/a/v1/chat/completions", data=body,
                             headers={"Content-Type": "application/json"}, timeout=30)
        message = resp.json()["error"]["message"] if resp.status_code == 400 else ""
        if resp.status_code != 400 or reason not in message or "\n" in message:
            wrong.append(f"{body[:40]!r}: {resp.status_code} {resp.text[:200]!r}")
    prompt = requests.post(f"{px.base}/rollout/r/attempt/a/v1/completions", json={"model": "m", "prompt": {"a": 1}}, timeout=30)
    assert wrong == []
    assert prompt.status_code == 400 and "prompt must be a string or a list" in prompt.json()["error"]["message"]
    assert upstream.seen == [], "nothing bad goes upstream"
    assert requests.get(f"{px.base}/healthz", timeout=5).status_code == 200
    assert "Traceback" not in px.stop()
