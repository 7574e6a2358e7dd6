"""The LLM proxy in front of a fake OpenAI-compatible upstream process: token ids recorded on Kafka
decode to exactly the text the client got, streaming and not; upstream errors pass through."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from producers_testkit import consume_all
from schemas.codec import unpack_floats, unpack_tokens

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]

# A toy vLLM: token id = code point; answers a fixed text; sets the resource version header.
UPSTREAM = r'''
import json, sys
from aiohttp import web
ANSWER = "Paris is the capital of France. ✓"
def toks(s): return [ord(c) for c in s]
def lp(n): return [-0.01 * (i + 1) for i in range(n)]
async def chat(request):
    body = await request.json()
    assert body["return_token_ids"] is True and body["logprobs"] is True
    if body["model"] == "fail":
        return web.json_response({"error": {"message": "rate limited", "code": 429}}, status=429)
    prompt = toks(json.dumps(body["messages"]))
    hdr = {"x-rolloutbus-resource-version": "7"}
    if not body.get("stream"):
        return web.json_response({"id": "c1", "model": body["model"], "prompt_token_ids": prompt, "choices": [{
            "index": 0, "message": {"role": "assistant", "content": ANSWER}, "token_ids": toks(ANSWER),
            "logprobs": {"content": [{"token": c, "logprob": x} for c, x in zip(ANSWER, lp(len(ANSWER)))]},
            "finish_reason": "stop"}]}, headers=hdr)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **hdr})
    await resp.prepare(request)
    lps = lp(len(ANSWER))
    for i in range(0, len(ANSWER), 4):
        part = ANSWER[i:i + 4]
        chunk = {"id": "c2", "model": body["model"], "choices": [{"index": 0, "delta": {"content": part},
                 "token_ids": toks(part), "logprobs": {"content": [{"token": c, "logprob": x} for c, x in zip(part, lps[i:i+4])]},
                 "finish_reason": "stop" if i + 4 >= len(ANSWER) else None}]}
        if i == 0:
            chunk["prompt_token_ids"] = prompt
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp
async def completions(request):
    body = await request.json()
    prompt = toks(body["prompt"])
    return web.json_response({"id": "t1", "model": body["model"], "choices": [{"index": 0, "text": ANSWER,
        "prompt_token_ids": prompt, "token_ids": toks(ANSWER), "logprobs": {"token_logprobs": lp(len(ANSWER))},
        "finish_reason": "length"}]}, headers={"x-rolloutbus-resource-version": "8"})
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_post("/v1/completions", completions)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''
ANSWER = "Paris is the capital of France. ✓"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"process exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            requests.get(url, timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.2)
    pytest.fail(f"{url} did not come up")


@pytest.fixture
def proxy(test_env: dict[str, str], tmp_path: Path) -> Any:
    env = {**test_env, "PYTHONPATH": str(REPO)}
    up_port, px_port = _port(), _port()
    script = tmp_path / "upstream.py"
    script.write_text(UPSTREAM)
    upstream = subprocess.Popen([sys.executable, str(script), str(up_port)], env=env, stderr=subprocess.PIPE, text=True)
    px = subprocess.Popen(
        [sys.executable, "-m", "producers.ingest.llm_proxy_cli", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--port", str(px_port)],
        env=env, stderr=subprocess.PIPE, text=True,
    )
    try:
        _wait(f"http://127.0.0.1:{up_port}/", upstream)
        _wait(f"http://127.0.0.1:{px_port}/healthz", px)
        yield f"http://127.0.0.1:{px_port}"
    finally:
        px.terminate()
        px.wait(30)
        upstream.terminate()
        upstream.wait(10)


def test_proxy_records_token_ids_that_decode_to_the_returned_text(proxy: str, kafka_conf: dict[str, Any], topics: Any) -> None:
    base = f"{proxy}/rollout/ro-p/attempt/at-p/v1"
    msgs = [{"role": "user", "content": "Capital of France?"}]
    plain = requests.post(f"{base}/chat/completions", json={"model": "tiny", "messages": msgs}, timeout=10)
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"] == ANSWER

    streamed_text = ""
    with requests.post(f"{base}/chat/completions", json={"model": "tiny", "messages": msgs, "stream": True},
                       headers={"x-rolloutbus-sequence-id": "5"}, stream=True, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                streamed_text += json.loads(line[6:])["choices"][0]["delta"].get("content", "")
    assert streamed_text == ANSWER

    comp = requests.post(f"{base}/completions", json={"model": "tiny", "prompt": "Q:"}, timeout=10)
    assert comp.json()["choices"][0]["text"] == ANSWER
    bad = requests.post(f"{base}/chat/completions", json={"model": "tiny", "messages": msgs},
                        headers={"x-rolloutbus-sequence-id": "-1"}, timeout=10)
    assert bad.status_code == 400 and "non-negative integer" in bad.json()["error"]["message"], "not sent upstream, not recorded"
    err = requests.post(f"{base}/chat/completions", json={"model": "fail", "messages": msgs}, timeout=10)
    assert err.status_code == 429 and err.json() == {"error": {"message": "rate limited", "code": 429}}

    records = consume_all(kafka_conf, topics.spans, expect=4, timeout=30)
    spans = [r for k, _n, r, _p in records]
    assert all(k == b"ro-p" for k, *_ in records)
    assert [s["sequence_id"] for s in spans] == [0, 5, 0, 0], "the agent's header, else unnumbered (the span stage numbers it)"
    for s in spans[:3]:
        llm = s["llm"]
        assert s["kind"] == "llm" and s["status_code"] == "OK"
        assert "".join(map(chr, unpack_tokens(llm["response_token_ids"]))) == ANSWER
        assert len(unpack_floats(llm["response_logprobs"])) == len(ANSWER)
    assert "".join(map(chr, unpack_tokens(spans[0]["llm"]["prompt_token_ids"]))) == json.dumps(msgs)
    assert "".join(map(chr, unpack_tokens(spans[1]["llm"]["prompt_token_ids"]))) == json.dumps(msgs)
    assert "".join(map(chr, unpack_tokens(spans[2]["llm"]["prompt_token_ids"]))) == "Q:"
    assert [s["llm"]["resource_version"] for s in spans[:3]] == [7, 7, 8]
    assert [s["attributes"]["gen_ai.prompt"] for s in spans[:3]] == ["user: Capital of France?"] * 2 + ["Q:"], "the prompt's text too"
    assert spans[2]["llm"]["finish_reason"] == "length" and spans[0]["llm"]["model"] == "tiny"
    assert spans[3]["status_code"] == "ERROR" and "429" in spans[3]["status_message"]
