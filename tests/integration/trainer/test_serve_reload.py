"""The server follows rb.resources on the real broker and hot-reloads a newly published version."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Producer

from schemas.codec import encode
from schemas.models import ResourceVersion
from trainer.model import build_tiny, save_policy
from trainer.resources import ResourceFollower, read_latest
from trainer.serve import VERSION_HEADER, PolicyServer, initial_policy

pytestmark = pytest.mark.integration
torch.set_num_threads(1)


def test_hot_reload_on_new_version(kafka_conf: dict[str, Any], topics: Any, tmp_path: Path) -> None:
    for seed, name in ((0, "v0"), (1, "v5")):
        m, tok = build_tiny(seed=seed)
        save_policy(m, tok, tmp_path / name)
    server = PolicyServer(initial_policy(str(tmp_path / "v0")))
    follower = ResourceFollower(kafka_conf, topics.resources, "policy", lambda r: server.load_version(r.uri, r.version)).start()
    p = Producer(kafka_conf)

    def publish(name: str, version: int, uri: str) -> None:
        rec = ResourceVersion(name=name, version=version, uri=uri, base_model="rolloutbus-tiny", created_ns=time.time_ns())
        p.produce(topics.resources, key=name.encode(), value=encode(rec))
        assert p.flush(10) == 0

    async def go() -> None:
        client = TestClient(TestServer(server.app()))
        await client.start_server()
        try:
            req = {"messages": [{"role": "user", "content": "3+4"}], "max_tokens": 6, "temperature": 0, "logprobs": True}
            first = await client.post("/v1/chat/completions", json=req)
            assert first.headers[VERSION_HEADER] == "0"
            before = (await first.json())["choices"][0]["logprobs"]
            publish("other", 9, str(tmp_path / "v5"))  # another resource's versions are not ours
            publish("policy", 5, str(tmp_path / "v5"))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                r = await client.post("/v1/chat/completions", json=req)
                if r.headers[VERSION_HEADER] == "5":
                    body = await r.json()
                    assert body["resource_version"] == 5
                    assert body["choices"][0]["logprobs"] != before  # different weights answered
                    return
                await asyncio.sleep(0.2)
            pytest.fail("the server never switched to version 5")
        finally:
            await client.close()

    try:
        asyncio.run(go())
    finally:
        follower.stop()
    latest = read_latest(kafka_conf, topics.resources)
    assert latest["policy"].version == 5 and latest["other"].version == 9


def test_a_lagging_follower_trails_the_newest_version(kafka_conf: dict[str, Any], topics: Any, tmp_path: Path) -> None:
    """``lag`` 2 (``rolloutbus serve --follow-lag 2``, the staleness bench): versions 1..5 published one by one, the
    follower switches to each one two behind the newest, never ahead."""
    seen: list[int] = []
    p = Producer(kafka_conf)

    def publish(version: int) -> None:
        (tmp_path / f"v{version}").mkdir()  # a checkpoint that is gone is skipped
        rec = ResourceVersion(name="policy", version=version, uri=str(tmp_path / f"v{version}"), base_model="b",
                              created_ns=time.time_ns())
        p.produce(topics.resources, key=b"policy", value=encode(rec))
        assert p.flush(10) == 0

    publish(0)
    follower = ResourceFollower(kafka_conf, topics.resources, "policy", lambda r: seen.append(r.version), lag=2).start()
    try:
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen == [0]  # what the topic held at the start: its newest
        for v in range(1, 6):
            publish(v)
            want = max(0, v - 2)
            while seen[-1] != want and time.monotonic() < deadline:
                time.sleep(0.1)
            assert seen[-1] == want, (v, seen)
        assert seen == [0, 1, 2, 3]
    finally:
        follower.stop()
