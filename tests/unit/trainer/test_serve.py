"""The OpenAI-compatible server over the tiny policy: shapes, vLLM extras, batching, version swap."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from trainer.model import build_tiny, sequence_logprobs
from trainer.serve import VERSION_HEADER, Policy, PolicyServer

torch.set_num_threads(1)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _client(server: PolicyServer) -> TestClient:
    client = TestClient(TestServer(server.app()))
    await client.start_server()
    return client


def test_chat_with_token_ids_and_logprobs() -> None:
    model, tok = build_tiny(seed=0)
    server = PolicyServer(Policy(model, tok, 3, "mem"))

    async def go() -> None:
        client = await _client(server)
        try:
            msgs = [{"role": "user", "content": "2+2"}]
            r = await client.post("/v1/chat/completions", json={"model": "policy", "messages": msgs, "max_tokens": 8,
                                                                 "logprobs": True, "return_token_ids": True})
            assert r.status == 200 and r.headers[VERSION_HEADER] == "3"
            body = await r.json()
            assert body["resource_version"] == 3
            assert body["prompt_token_ids"] == tok.apply_chat_template(msgs)
            ch = body["choices"][0]
            assert 1 <= len(ch["token_ids"]) <= 8 and ch["finish_reason"] in ("stop", "length")
            lps = [c["logprob"] for c in ch["logprobs"]["content"]]
            assert len(lps) == len(ch["token_ids"])
            # the reported logprobs are the policy's own (what GRPO's ratio needs)
            assert sequence_logprobs(model, body["prompt_token_ids"], ch["token_ids"]) == pytest.approx(lps, abs=1e-4)
            assert ch["message"]["content"] == tok.decode(ch["token_ids"])
            r = await client.post("/v1/completions", json={"prompt": "1+1=", "max_tokens": 4, "logprobs": True,
                                                           "return_token_ids": True, "temperature": 0})
            body = await r.json()
            ch = body["choices"][0]
            assert ch["prompt_token_ids"] == tok.encode("1+1=", add_bos=True) and len(ch["logprobs"]["token_logprobs"]) == len(ch["token_ids"])
            assert (await (await client.get("/healthz")).json())["resource_version"] == 3
            assert (await (await client.get("/v1/models")).json())["data"][0]["id"] == "policy"
            bad = await client.post("/v1/chat/completions", data=b"{not json")
            assert bad.status == 400 and "JSON" in (await bad.json())["error"]["message"]
            bad = await client.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
            assert bad.status == 400
        finally:
            await client.close()

    _run(go())


def test_concurrent_requests_share_batches_and_swap_between_them() -> None:
    model, tok = build_tiny(seed=0)
    server = PolicyServer(Policy(model, tok, 1, "a"), max_batch=8)

    async def go() -> None:
        client = await _client(server)
        try:
            req = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
            rs = await asyncio.gather(*[client.post("/v1/chat/completions", json=req) for _ in range(8)])
            assert all(r.status == 200 for r in rs)
            sampled = sum([(await r.json())["usage"]["completion_tokens"] for r in rs])
            assert server.steps_run < sampled  # several requests were sampled by the same forward passes
            other, _ = build_tiny(seed=1)
            server.offer(Policy(other, tok, 2, "b"))
            r = await client.post("/v1/chat/completions", json=req)
            assert r.headers[VERSION_HEADER] == "2"
            server.offer(Policy(model, tok, 1, "a"))  # an older version never replaces a newer one
            r = await client.post("/v1/chat/completions", json=req)
            assert r.headers[VERSION_HEADER] == "2"
        finally:
            await client.close()

    _run(go())


def test_a_short_request_answers_while_a_long_one_is_still_sampling() -> None:
    """Continuous batching: a request that joins later and needs few tokens does not wait for the long one."""
    model, tok = build_tiny(seed=0)

    class NoStop(type(tok)):  # type: ignore[misc]
        stop_ids = ()  # the untrained model must not end the long answer early

    no_stop = NoStop()
    server = PolicyServer(Policy(model, no_stop, 1, "a"), max_batch=8)

    async def go() -> None:
        client = await _client(server)
        try:
            order: list[str] = []

            async def ask(name: str, max_tokens: int, delay: float) -> int:
                await asyncio.sleep(delay)
                r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": max_tokens, "temperature": 0})
                order.append(name)
                return int((await r.json())["usage"]["completion_tokens"])

            long, short = await asyncio.gather(ask("long", 400, 0.0), ask("short", 3, 0.05))
            assert (long, short) == (400, 3)
            assert order == ["short", "long"]
        finally:
            await client.close()

    _run(go())
