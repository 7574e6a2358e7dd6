"""``ROLLOUTBUS_SERVE_TOKEN``: every route but /healthz needs ``Authorization: Bearer <token>``; a body nested
too deeply is a 400, not a 500."""

from __future__ import annotations

import asyncio

import torch
from aiohttp.test_utils import TestClient, TestServer

from trainer.model import build_tiny
from trainer.serve import Policy, PolicyServer

torch.set_num_threads(1)
CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_token_guards_everything_but_healthz() -> None:
    model, tok = build_tiny(seed=0)
    server = PolicyServer(Policy(model, tok, 1, "mem"), token="tok-123")

    async def go() -> None:
        async with TestClient(TestServer(server.app())) as client:
            assert (await client.get("/healthz")).status == 200
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "tok-123"}):
                r = await client.get("/v1/models", headers=headers)
                assert r.status == 401 and "tok-123" not in await r.text()
                assert (await client.post("/v1/chat/completions", json=CHAT, headers=headers)).status == 401
            good = {"Authorization": "Bearer tok-123"}
            assert (await client.get("/v1/models", headers=good)).status == 200
            assert (await client.post("/v1/chat/completions", json=CHAT, headers=good)).status == 200

    asyncio.run(go())


def test_deeply_nested_body_is_a_400() -> None:
    server = PolicyServer(None)

    async def go() -> None:
        async with TestClient(TestServer(server.app())) as client:
            r = await client.post("/v1/chat/completions", data="[" * 100_000, headers={"Content-Type": "application/json"})
            assert r.status == 400 and "Traceback" not in await r.text()

    asyncio.run(go())
