"""The gateway's token as Bearer or as a URL's userinfo (Basic), what Agent Lightning 0.3's client can send
(producers/ingest/auth.py and the routes that use it); no network."""

from __future__ import annotations

import asyncio
import base64

import pytest
from aiohttp import encode_basic_auth
from aiohttp.test_utils import TestClient, TestServer

from producers.ingest.auth import authorized
from producers.ingest.gateway import SERVER_OPTIONS, Gateway
from tests.unit.producers.memory_transport import MemoryTransport


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("header, ok", [
    ("Bearer tok", True),
    (basic("agl", "tok"), True),
    (basic("", "tok"), True),
    (basic("anyone", "tok"), True),
    ("basic " + base64.b64encode(b"agl:tok").decode(), True),  # the scheme is case-insensitive
    (encode_basic_auth("agl", "tok"), True),  # what aiohttp sends for http://agl:tok@host
    ("Bearer tok2", False),
    ("Bearer", False),
    ("bearer tok", False),
    ("tok", False),
    ("", False),
    (basic("agl", "tok2"), False),
    (basic("tok", ""), False),  # the token is the password, not the user
    ("Basic " + base64.b64encode(b"tok").decode(), False),  # no colon: no password
    ("Basic !!!notbase64", False),
    ("Basic", False),
    ("Bearer t\udcffk", False),  # not UTF-8
])
def test_the_token_as_bearer_or_as_a_basic_password(header: str, ok: bool) -> None:
    assert authorized(header, "tok") is ok


def test_a_token_with_a_colon_is_the_whole_password() -> None:
    assert authorized(basic("agl", "a:b"), "a:b") and not authorized(basic("agl", "a"), "a:b")


OTLP = b'{"resourceSpans": []}'


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/v1/agl/spans/next", b'{"rollout_id": "ro-1", "attempt_id": "at-1"}'),
    ("POST", "/v1/traces", OTLP),
    ("POST", "/api/rollouts/ro-1/attempt/0/events", b'{"event_type": "agent_output", "data": {}}'),
])
def test_every_route_takes_the_token_either_way_and_refuses_alike(method: str, path: str, body: bytes) -> None:
    gw = Gateway(MemoryTransport(), token="tok")  # type: ignore[arg-type]

    async def go() -> list[tuple[int, str, str | None]]:
        server = TestServer(gw.app())
        await server.start_server(**SERVER_OPTIONS)
        out = []
        async with TestClient(server) as client:
            for headers in ({"Authorization": "Bearer tok"}, {"Authorization": basic("agl", "tok")},
                            {"Authorization": basic("agl", "nope")}, {}):
                r = await client.request(method, path, data=body, headers={"Content-Type": "application/json", **headers})
                out.append((r.status, await r.text(), r.headers.get("WWW-Authenticate")))
        return out

    bearer, basic_, wrong, none = asyncio.run(go())
    assert bearer[0] == basic_[0] == 200, (bearer, basic_)
    assert wrong[0] == none[0] == 401 and wrong[1] == none[1] and "missing or wrong bearer token" in wrong[1]
    assert wrong[2] is not None and "Basic" in wrong[2] and "Bearer" in wrong[2]
