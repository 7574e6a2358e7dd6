"""Property-based fuzzing of the HTTP endpoints of ``rolloutbus store``, ``serve`` and ``dashboard``.

Each app runs for real on 127.0.0.1 (the store's engine on a scratch directory, the dashboard reading
that store with the schema migrated, serve with the tiny policy and a token). Hypothesis sends them
malformed, truncated and deeply nested JSON, huge bodies, wrong content types and encodings, random
paths, methods and headers. Every answer must be below 500 and carry no traceback, and each app must
still answer its health check afterwards. The number of cases tried is printed per app.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Verbosity, given, settings
from hypothesis import strategies as st

from tests.installs import installed

from tests.integration.serverprocs import assert_memory_bounded, rss_mib

pytestmark = pytest.mark.integration

installed("chdb", "pip install -e '.[all,test]'")
torch = installed("torch", "pip install -e '.[all,test]'")

TOKEN = "fuzz-token-0123"
EXAMPLES = 300
TRIED: dict[str, int] = {}
FOUND: list[str] = []  # every failure, one line each (hypothesis' own report of a 100 kB body is unreadable)


class AiohttpThread:
    """An aiohttp app served on 127.0.0.1 from its own event loop on a daemon thread."""

    def __init__(self, app: Any) -> None:
        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from rolloutbus.store.server import Engine, StoreServer

    engine = Engine(tmp_path_factory.mktemp("fuzz-store") / "clickhouse")
    server = StoreServer(("127.0.0.1", 0), engine)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    yield server.port
    server.shutdown()
    server.server_close()
    engine.close()


@pytest.fixture(scope="module")
def dashboard(store: int) -> Iterator[int]:
    from foundation.clickhouse import connect, open_store
    from rolloutbus.dashboard.app import Dashboard, Reader

    dsn = f"http://127.0.0.1:{store}"
    open_store(dsn, "rb_fuzz").close()

    def panels() -> Any:
        return connect(dsn, database="rb_fuzz", readonly=True, create_database=False)

    dash = Dashboard(Reader(panels), Reader(panels, panels=False), token=TOKEN)
    srv = AiohttpThread(dash.app())
    yield srv.port
    srv.close()
    dash.close()


@pytest.fixture(scope="module")
def rss_before(store: int, serve: int, dashboard: int) -> float:
    """This process's resident MiB with the three apps up (they serve from its threads), taken when the table
    of nasty bodies starts: after the random cases (run first), which warm the store's engine caches and the
    allocator's arenas (about 300 MiB); what grows after that grows with the number of requests."""
    return rss_mib(os.getpid())


@pytest.fixture(scope="module")
def serve() -> Iterator[int]:
    from trainer.model import build_tiny
    from trainer.serve import Policy, PolicyServer

    torch.set_num_threads(1)
    model, tok = build_tiny(seed=0)
    srv = AiohttpThread(PolicyServer(Policy(model, tok, 1, "mem"), default_max_tokens=4, token=TOKEN).app())
    yield srv.port
    srv.close()


# ---------------------------------------------------------------- what is sent

def _nested(depth: int) -> bytes:
    return b"[" * depth


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _chat_like(draw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "policy"}
    body["messages"] = draw(st.one_of(
        JSON_VALUES,
        st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", ""]),
                                        "content": JSON_VALUES}), max_size=3)))
    for key in ("max_tokens", "n", "temperature", "prompt", "stream", "logprobs", "return_token_ids", "sql", "max_completion_tokens"):
        if draw(st.booleans()):
            body[key] = draw(st.one_of(JSON_VALUES, st.integers(-5, 6), st.floats(-1, 3)))
    if body.get("max_tokens") is not None and isinstance(body["max_tokens"], int) and body["max_tokens"] > 6:
        body["max_tokens"] = 6  # a valid huge max_tokens is a long generation, not a fault
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), (int, float)) and not isinstance(body.get(key), bool) and body[key] > 6:
            body[key] = 6
    if isinstance(body.get("n"), (int, float)) and not isinstance(body["n"], bool) and body["n"] > 3:
        body["n"] = 3
    return body


@st.composite
def bodies(draw: Any) -> tuple[bytes, str | None]:
    kind = draw(st.sampled_from(["json", "json-truncated", "nested", "huge", "binary", "text", "latin1", "utf16", "empty", "form"]))
    ctype = draw(st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x", "application/octet-stream", "application/json; charset=utf-16",
                                  "application/json; charset=nonsense", "", None]))
    if kind in ("json", "json-truncated"):
        raw = json.dumps(_chat_like(draw), allow_nan=True).encode()
        if kind == "json-truncated":
            raw = raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    elif kind == "nested":
        raw = draw(st.sampled_from([_nested(100_000), b'{"messages":' * 50_000, b'{"sql":' + b"[" * 100_000,
                                    b'{"a":' * 2000 + b"1" + b"}" * 2000]))
    elif kind == "huge":
        raw = draw(st.sampled_from([b"x" * (3 << 20), b'{"sql": "' + b"a" * (2 << 20) + b'"}', b"[" + b"1," * (1 << 20) + b"1]"]))
    elif kind == "binary":
        raw = draw(st.binary(max_size=300))
    elif kind == "text":
        raw = draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    elif kind == "latin1":
        raw = json.dumps({"sql": "SELECT 'é'", "messages": [{"role": "user", "content": "é"}]}, ensure_ascii=False).encode("latin-1")
    elif kind == "utf16":
        raw = json.dumps(_chat_like(draw)).encode("utf-16")
    elif kind == "form":
        raw = b"query=" + draw(st.binary(max_size=100)) + b"&sql=" + draw(st.binary(max_size=50))
    else:
        raw = b""
    return raw, ctype


PATH_CHARS = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters="#"), max_size=40)


@st.composite
def requests(draw: Any, paths: list[str]) -> tuple[str, str, dict[str, str], bytes]:
    # Mostly the methods, routes and token the apps serve, so that bodies reach the handlers.
    method = draw(st.sampled_from(["POST"] * 4 + ["GET"] * 3 + ["PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "FOO"]))
    path = draw(st.one_of(st.sampled_from(paths), st.sampled_from(paths).map(lambda p: p + "?").flatmap(
        lambda p: PATH_CHARS.map(lambda q: p + q)), PATH_CHARS.map(lambda p: "/" + p)))
    body, ctype = draw(bodies())
    headers: dict[str, str] = {}
    if ctype is not None:
        headers["Content-Type"] = ctype
    auth = draw(st.sampled_from(["good"] * 4 + ["none", "bad", "weird"]))
    if auth == "good":
        headers["Authorization"] = f"Bearer {TOKEN}"
    elif auth == "bad":
        headers["Authorization"] = "Bearer " + draw(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=20))
    elif auth == "weird":
        headers["Authorization"] = "Basic ////" if draw(st.booleans()) else "Bearer \xe9\xff"
    if draw(st.booleans()):
        headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "deflate", "br", "zstd", "lz4", "identity", "bogus"]))
    if draw(st.booleans()):
        headers["Accept-Encoding"] = draw(st.sampled_from(["gzip", "zstd", "lz4", "deflate", "*", "nonsense"]))
    for name in draw(st.lists(st.sampled_from(["X-ClickHouse-User", "X-ClickHouse-Key", "X-ClickHouse-Database",
                                               "X-ClickHouse-Format", "X-ClickHouse-Query-Id"]), max_size=2, unique=True)):
        headers[name] = draw(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=20))
    return method, path, headers, body


def send(port: int, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest(method, path, skip_accept_encoding="Accept-Encoding" in headers)
        for k, v in headers.items():
            conn.putheader(k, v.encode("latin-1", "replace"))
        conn.putheader("Content-Length", str(len(body)))
        try:
            conn.endheaders(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (and closed) before reading all of a body it will not use: read its answer
        try:
            resp = conn.getresponse()
        except (ConnectionError, http.client.RemoteDisconnected):
            return 0, b""  # closed without an answer mid-body: allowed if it still answers afterwards (check)
        return resp.status, resp.read()
    finally:
        conn.close()


def check(app: str, port: int, req: tuple[str, str, dict[str, str], bytes]) -> None:
    TRIED[app] = TRIED.get(app, 0) + 1
    method, path, headers, body = req
    try:
        status, answer = send(port, method, path, headers, body)
    except (ConnectionError, http.client.HTTPException, socket.timeout) as exc:
        raise AssertionError(f"{app}: {method} {path[:80]} ({len(body)} bytes) broke the connection: {exc!r}") from exc
    if status == 0:
        assert send(port, "GET", HEALTH[app], {}, b"")[0] == 200, f"{app}: dead after {method} {path[:80]} ({len(body)} bytes)"
        return
    shown = f"{app}: {method} {path[:80]} {headers} body[:80]={body[:80]!r} ({len(body)} bytes) -> {status} {answer[:300]!r}"
    if status >= 500 or b"Traceback" in answer:
        FOUND.append(shown)
    assert status < 500, shown
    assert b"Traceback" not in answer, shown


FUZZ = settings(print_blob=False, verbosity=Verbosity.quiet, max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])

HEALTH = {"store": "/ping", "serve": "/healthz", "dashboard": "/healthz"}
STORE_PATHS = ["/", "/ping", "/?query=SELECT%201", "/?query=", "/?database=nope&query=SELECT%201", "/replicas_status", "/play"]
SERVE_PATHS = ["/healthz", "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1"]
DASH_PATHS = ["/", "/healthz", "/api/config", "/api/learning", "/api/pipeline", "/api/rollouts", "/api/rollout/x",
              "/api/sql", "/static/app.js", "/static/../settings.py", "/api/rollouts?limit=abc&version=1e9"]


@FUZZ
@given(req=requests(STORE_PATHS))
def test_fuzz_store(store: int, req: tuple[str, str, dict[str, str], bytes]) -> None:
    check("store", store, req)


@FUZZ
@given(req=requests(SERVE_PATHS))
def test_fuzz_serve(serve: int, req: tuple[str, str, dict[str, str], bytes]) -> None:
    check("serve", serve, req)


@FUZZ
@given(req=requests(DASH_PATHS))
def test_fuzz_dashboard(dashboard: int, req: tuple[str, str, dict[str, str], bytes]) -> None:
    check("dashboard", dashboard, req)


NASTY = [b"[" * 100_000, b'{"messages":' * 50_000, b'{"sql":' + b"[" * 100_000, b'{"sql": "SELECT 1"', b"{", b"",
         b"\xff\xfe\x00", b"[1," * 300_000 + b"1]", json.dumps({"messages": 5}).encode(), json.dumps({"sql": 5, "messages": [5], "prompt": {}}).encode(),
         json.dumps({"sql": None, "messages": [{"role": "user"}], "prompt": [10**30]}).encode(),
         json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": "x", "max_tokens": -1}).encode(),
         json.dumps({"prompt": [-1, 2**40], "max_tokens": 2}).encode(), json.dumps({"prompt": "", "max_tokens": 2}).encode(),
         json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}).encode(),
         b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": Infinity}', b'{"prompt": "x", "n": 1e400}',
         b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": NaN}',
         b'{"prompt": [1, 2], "max_tokens": -Infinity, "temperature": Infinity}']
CTYPES = ["application/json", "application/x-www-form-urlencoded", "application/json; charset=nonsense"]  # the last: found by the fuzzer


@pytest.mark.parametrize("app", ["store", "serve", "dashboard"])
def test_every_route_with_every_nasty_body(app: str, rss_before: float, request: pytest.FixtureRequest) -> None:
    """The table behind the random cases: each known route, POST and GET, each nasty body and content type."""
    port = request.getfixturevalue(app)
    paths = {"store": STORE_PATHS, "serve": SERVE_PATHS, "dashboard": DASH_PATHS}[app]
    for path in paths:
        for method in ("POST", "GET"):
            for body in NASTY:
                for ctype in CTYPES:
                    check(app, port, (method, path, {"Content-Type": ctype, "Authorization": f"Bearer {TOKEN}"}, body))


def test_each_app_still_answers_after_fuzzing(store: int, serve: int, dashboard: int, rss_before: float,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert send(store, "GET", "/ping", {}, b"")[0] == 200
    assert send(serve, "GET", "/healthz", {}, b"")[0] == 200
    assert send(serve, "GET", "/v1/models", {"Authorization": f"Bearer {TOKEN}"}, b"")[0] == 200
    assert send(dashboard, "GET", "/healthz", {}, b"")[0] == 200
    status, _ = send(dashboard, "GET", "/api/learning", {"Authorization": f"Bearer {TOKEN}"}, b"")
    assert status == 200
    memory = assert_memory_bounded("the three apps' process", os.getpid(), rss_before)
    with capsys.disabled():
        print(f"\nHTTP fuzz cases tried: {TRIED} (total {sum(TRIED.values())}), 0 x 5xx; resident {memory}")


