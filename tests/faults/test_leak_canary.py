"""Canary secrets never leak: not in an answer, not in a log line.

Every secret the processes hold is set to a unique random string: the ClickHouse writer's and analyst's
passwords, a wrong password given on purpose, the Kafka SASL password, the gateway token, the metrics
token, the LLM proxy's token and its upstream key (in the upstream URL as ``user:key@``), the policy
server's and the dashboard's tokens. Then the store, the gateway, the stream worker, the proxy, the
policy server (``rolloutbus serve``) and the dashboard run for real and are driven through what works
and what fails: right and wrong tokens, bad bodies, SQL errors, a wrong ClickHouse password (in the
DSN's ``user:password@`` and ``?password=`` forms, and a lone ``token@``), Kafka unreachable, a dead
upstream. Every answer (status line, headers, body) and every line each process wrote is kept; none may
contain any canary.
"""

from __future__ import annotations

import base64
import http.server
import json
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from faultkit import ROOT, free_port, py, store, stop_worker, worker
from tests.integration.serverprocs import stop as stop_server
from tests.integration.serverprocs import wait_http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

CANARY = {name: f"canary-{name}-{secrets.token_hex(8)}" for name in
          ("ch-writer", "ch-analyst", "ch-wrong", "kafka-sasl", "gateway-token", "metrics-token", "proxy-token", "upstream-key",
           "serve-token", "dashboard-token")}
# The forms they travel in count too: the upstream's user:key as Basic auth, the writer's as Basic auth.
BASIC_UPSTREAM = base64.b64encode(f"user:{CANARY['upstream-key']}".encode()).decode()
DERIVED = {"upstream-key as Basic": BASIC_UPSTREAM,
           "ch-writer as Basic": base64.b64encode(f"rolloutbus:{CANARY['ch-writer']}".encode()).decode()}
SEEN: list[tuple[str, str]] = []  # (where, text): every answer and every log


def answer(where: str, r: requests.Response) -> requests.Response:
    headers = "\n".join(f"{k}: {v}" for k, v in r.headers.items())
    SEEN.append((where, f"{r.status_code} {r.reason}\n{headers}\n\n{r.text}"))
    return r


def stop(proc: subprocess.Popen[bytes], log: Path, where: str) -> None:
    stop_server(proc)
    SEEN.append((where, log.read_text(errors="replace")))


def assert_no_canary() -> None:
    found = [(where, name, text[max(0, text.find(value) - 200): text.find(value) + 60])
             for where, text in SEEN for name, value in {**CANARY, **DERIVED}.items() if value in text]
    assert not found, "secrets leaked:\n" + "\n".join(f"{w} ({n}): ...{t}..." for w, n, t in found[:10])


class Upstream(http.server.ThreadingHTTPServer):
    """An OpenAI-compatible model server that answers one short completion and keeps the keys it was sent;
    with ``echo`` a careless one that refuses the key and quotes it back in its error."""

    daemon_threads = True

    def __init__(self, echo: bool = False) -> None:
        self.keys: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.server.keys.append(self.headers.get("Authorization", ""))  # type: ignore[attr-defined]
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if echo:
                    body = json.dumps({"error": {"message": f"invalid credentials {self.headers.get('Authorization')} "
                                                           f"for {self.headers.get('Host')}", "type": "auth"}}).encode()
                    self.send_response(401)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                body = json.dumps({"id": "c1", "object": "chat.completion", "model": "m", "created": 1,
                                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "8"},
                                                "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def secret_env(test_env: dict[str, str]) -> dict[str, str]:
    return {**test_env, "ROLLOUTBUS_KAFKA_SASL_PASSWORD": CANARY["kafka-sasl"], "ROLLOUTBUS_KAFKA_SASL_USERNAME": "rolloutbus",
            "ROLLOUTBUS_CLICKHOUSE_PASSWORD": CANARY["ch-writer"], "ROLLOUTBUS_METRICS_TOKEN": CANARY["metrics-token"]}


@pytest.fixture
def the_store(secret_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    log = tmp_path / "store.log"
    users = f"rolloutbus:writer:{CANARY['ch-writer']},analyst:analyst:{CANARY['ch-analyst']}"
    proc, url = store({**secret_env, "ROLLOUTBUS_STORE_USERS": users}, tmp_path / "store", log)
    yield url
    stop(proc, log, "store log")


OTLP = {"resourceSpans": [{"resource": {"attributes": [
    {"key": "agentlightning.rollout_id", "value": {"stringValue": "ro-canary"}},
    {"key": "agentlightning.attempt_id", "value": {"stringValue": "at-1"}}]},
    "scopeSpans": [{"spans": [{"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": f"b7ad6b716920333{i}", "name": "tool-run",
                               "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000500000000",
                               "attributes": [{"key": "gen_ai.tool.name", "value": {"stringValue": "calc"}},
                                              {"key": "agentlightning.span_sequence_id", "value": {"intValue": str(i + 1)}}]}
                              for i in range(3)]}]}]}


def drive_store(url: str) -> None:
    writer = {"X-ClickHouse-User": "rolloutbus", "X-ClickHouse-Key": CANARY["ch-writer"]}
    analyst = {"X-ClickHouse-User": "analyst", "X-ClickHouse-Key": CANARY["ch-analyst"]}
    assert answer("store select", requests.post(url, data="SELECT 1", headers=writer, timeout=30)).status_code == 200
    answer("store bad sql", requests.post(url, data="SELECT * FROM nowhere WHERE", headers=writer, timeout=30))
    answer("store analyst write", requests.post(url, data="CREATE TABLE t (a Int8) ENGINE = Memory", headers=analyst, timeout=30))
    answer("store wrong password", requests.post(url, data="SELECT 1", timeout=30,
                                                 headers={"X-ClickHouse-User": "rolloutbus", "X-ClickHouse-Key": CANARY["ch-wrong"]}))
    answer("store password in the URL", requests.get(url, timeout=30, params={
        "user": "rolloutbus", "password": CANARY["ch-writer"], "query": "SELECT nope FROM nowhere"}))
    answer("store wrong password in the URL", requests.get(url, timeout=30, params={
        "user": "analyst", "password": CANARY["ch-wrong"], "query": "SELECT 1"}))
    basic = base64.b64encode(f"rolloutbus:{CANARY['ch-writer']}".encode()).decode()
    answer("store basic auth, bad settings", requests.post(url + "/?max_result_rows=abc", data="SELECT 1", timeout=30,
                                                           headers={"Authorization": f"Basic {basic}"}))
    answer("store settings echo", requests.post(url, data="SELECT name, value FROM system.settings WHERE changed", headers=writer,
                                                timeout=30))


def test_no_secret_reaches_an_answer_or_a_log(secret_env: dict[str, str], the_store: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    SEEN.clear()
    dsn = the_store.replace("http://", "http://rolloutbus@")
    env = {**secret_env, "ROLLOUTBUS_CLICKHOUSE_DSN": dsn}
    drive_store(the_store)

    # ---- the gateway, with Kafka
    gw_port, gw_log = free_port(), tmp_path / "gateway.log"
    gw = py({**env, "ROLLOUTBUS_GATEWAY_TOKEN": CANARY["gateway-token"], "ROLLOUTBUS_DATA_DIR": str(tmp_path / "gw"),
             "ROLLOUTBUS_GATEWAY_PORT": str(gw_port)}, "-m", "producers.ingest.gateway_cli", log=gw_log)
    base = f"http://127.0.0.1:{gw_port}"
    wait_http(base + "/healthz", gw)
    good = {"Authorization": f"Bearer {CANARY['gateway-token']}"}
    assert answer("gateway spans", requests.post(base + "/v1/traces", json=OTLP, headers=good, timeout=10)).status_code == 200
    answer("gateway no token", requests.post(base + "/v1/traces", json=OTLP, timeout=10))
    answer("gateway wrong token", requests.post(base + "/v1/traces", json=OTLP, headers={"Authorization": "Bearer nope"}, timeout=10))
    answer("gateway bad body", requests.post(base + "/v1/traces", data=b"\xff\x00junk", headers=good, timeout=10))
    answer("gateway nested body", requests.post(base + "/v1/traces", data=b"[" * 100_000, timeout=10,
                                                headers={**good, "Content-Type": "application/json"}))
    answer("gateway bad event", requests.post(base + "/api/rollouts/ro-canary/attempt/at-1/events", json={"event_type": 5},
                                              headers=good, timeout=10))
    for path in ("/healthz", "/metrics", "/v1/agl/health", "/v1/agl/rollouts", "/v1/agl/spans?rollout_id=ro-canary",
                 "/v1/agl/resources/latest", "/api/rollouts/nope", "/nowhere"):
        answer(f"gateway GET {path}", requests.get(base + path, headers=good, timeout=30))

    # ---- the stream worker, writing to the store with the writer's password
    mport = free_port()
    w = worker(env, "--metrics-port", str(mport), "-v")
    wait_http(f"http://127.0.0.1:{mport}/healthz", w, timeout=90)
    deadline = time.monotonic() + 90
    stored = 0
    analyst = {"X-ClickHouse-User": "analyst", "X-ClickHouse-Key": CANARY["ch-analyst"]}
    while time.monotonic() < deadline and stored < 3:
        r = requests.post(the_store, data="SELECT count() FROM rolloutbus.spans WHERE rollout_id = 'ro-canary'", headers=analyst,
                          timeout=30)
        stored = int(r.text.strip() or 0) if r.status_code == 200 else 0
        time.sleep(1)
    assert stored == 3, f"the worker stored {stored} of 3 spans: {w.output()[-3000:]}"
    bare = answer("worker /metrics without token", requests.get(f"http://127.0.0.1:{mport}/metrics", timeout=5))
    assert bare.status_code == 401, bare.text
    m = answer("worker /metrics", requests.get(f"http://127.0.0.1:{mport}/metrics", timeout=5,
                                               headers={"Authorization": f"Bearer {CANARY['metrics-token']}"}))
    assert m.status_code == 200 and "rolloutbus_streams" in m.text
    for path in ("/healthz", "/readyz", "/nowhere"):
        answer(f"worker {path}", requests.get(f"http://127.0.0.1:{mport}{path}", timeout=5))
    _rc, out = stop_worker(w)
    SEEN.append(("worker log", out))

    # ---- a worker given a wrong ClickHouse password: it fails, and says so without the password it tried
    bad = worker({**env, "ROLLOUTBUS_CLICKHOUSE_PASSWORD": CANARY["ch-wrong"]}, "--metrics-port", "0", "-v")
    try:
        own_rc: int | None = bad.wait(60)
    except subprocess.TimeoutExpired:
        own_rc = None
    _rc, out = stop_worker(bad)
    SEEN.append(("worker with a wrong password", out))
    # It stops by itself, status 1 (a refused login is the project's error, one line), not held up until stopped.
    assert own_rc == 1, f"a worker ClickHouse refused exited with {own_rc} (None: still running after 60 s)\n{out[-2000:]}"
    assert "AUTHENTICATION" in out.upper() or "password" in out.lower(), out[-2000:]
    q = subprocess.run([*_cli(), "query", "SELECT 1"], env={**env, "ROLLOUTBUS_CLICKHOUSE_PASSWORD": CANARY["ch-wrong"]},
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    SEEN.append(("query with a wrong password", q.stdout + q.stderr))
    q = subprocess.run([*_cli(), "query", "SELECT nope"], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    SEEN.append(("query, bad SQL", q.stdout + q.stderr))
    stop(gw, gw_log, "gateway log")

    # ---- gateways reading ClickHouse with the password in the DSN (nothing there) and with a wrong password
    for label, extra in (("password in a dead DSN", {"ROLLOUTBUS_CLICKHOUSE_DSN": f"http://rolloutbus:{CANARY['ch-writer']}@127.0.0.1:{free_port()}"}),
                         ("wrong password", {"ROLLOUTBUS_CLICKHOUSE_PASSWORD": CANARY["ch-wrong"]})):
        port3, log3 = free_port(), tmp_path / f"gateway-{label.replace(' ', '-')}.log"
        gw3 = py({**env, **extra, "ROLLOUTBUS_GATEWAY_TOKEN": CANARY["gateway-token"],
                  "ROLLOUTBUS_DATA_DIR": str(tmp_path / f"gw3-{len(SEEN)}"), "ROLLOUTBUS_GATEWAY_PORT": str(port3)},
                 "-m", "producers.ingest.gateway_cli", log=log3)
        wait_http(f"http://127.0.0.1:{port3}/healthz", gw3)
        for path in ("/v1/agl/rollouts", "/v1/agl/spans?rollout_id=ro-canary", "/v1/agl/rollouts/ro-canary"):
            answer(f"gateway ({label}) GET {path}", requests.get(f"http://127.0.0.1:{port3}{path}", headers=good, timeout=30))
        answer(f"gateway ({label}) dequeue", requests.post(f"http://127.0.0.1:{port3}/v1/agl/queues/rollouts/dequeue", json={},
                                                          headers=good, timeout=30))
        stop(gw3, log3, f"gateway ({label}) log")
        q = subprocess.run([*_cli(), "query", "--trajectory", "ro-canary"], env={**env, **extra}, capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        SEEN.append((f"query ({label})", q.stdout + q.stderr))

    # ---- a gateway whose Kafka is unreachable (SASL configured): it spools, and logs why, without the password
    gw2_port, gw2_log = free_port(), tmp_path / "gateway-nokafka.log"
    gw2 = py({**env, "ROLLOUTBUS_GATEWAY_TOKEN": CANARY["gateway-token"], "ROLLOUTBUS_DATA_DIR": str(tmp_path / "gw2"),
              "ROLLOUTBUS_GATEWAY_PORT": str(gw2_port), "ROLLOUTBUS_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
              "ROLLOUTBUS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "ROLLOUTBUS_KAFKA_SASL_MECHANISM": "PLAIN"},
             "-m", "producers.ingest.gateway_cli", log=gw2_log)
    base2 = f"http://127.0.0.1:{gw2_port}"
    wait_http(base2 + "/healthz", gw2)
    answer("gateway (no Kafka) spans", requests.post(base2 + "/v1/traces", json=OTLP, headers=good, timeout=10))
    time.sleep(3)  # the client tries the broker and logs it away
    for path in ("/healthz", "/metrics"):
        answer(f"gateway (no Kafka) GET {path}", requests.get(base2 + path, headers=good, timeout=10))
    stop(gw2, gw2_log, "gateway (no Kafka) log")

    # ---- the LLM proxy: the upstream key in the upstream URL, a live upstream and a dead one
    upstream, careless = Upstream(), Upstream(echo=True)
    chat = {"model": "m", "messages": [{"role": "user", "content": "5 3 gain"}]}
    ptok = {"Authorization": f"Bearer {CANARY['proxy-token']}"}
    for label, port in (("live", upstream.server_address[1]), ("dead", free_port()), ("echoing", careless.server_address[1])):
        pport, plog = free_port(), tmp_path / f"proxy-{label}.log"
        proxy = py({**env, "ROLLOUTBUS_PROXY_TOKEN": CANARY["proxy-token"], "ROLLOUTBUS_DATA_DIR": str(tmp_path / f"px-{label}"),
                    "ROLLOUTBUS_PROXY_PORT": str(pport)},
                   "-m", "producers.ingest.llm_proxy_cli", "--upstream-kind", "openai",
                   "--upstream", f"http://user:{CANARY['upstream-key']}@127.0.0.1:{port}/v1", log=plog)
        pbase = f"http://127.0.0.1:{pport}"
        wait_http(pbase + "/healthz", proxy)
        url = pbase + "/rollout/ro-canary/attempt/at-1/v1/chat/completions"
        r = answer(f"proxy ({label}) chat", requests.post(url, json=chat, headers=ptok, timeout=30))
        assert r.status_code == {"live": 200, "dead": 502, "echoing": 401}[label], r.text
        if label == "echoing":
            assert "invalid credentials" in r.text, r.text  # its error came through, the key in it scrubbed
        answer(f"proxy ({label}) no token", requests.post(url, json=chat, timeout=30))
        answer(f"proxy ({label}) bad body", requests.post(url, data=b"{", headers={**ptok, "Content-Type": "application/json"},
                                                          timeout=30))
        answer(f"proxy ({label}) stream", requests.post(url, json={**chat, "stream": True}, headers=ptok, timeout=30))
        for path in ("/healthz", "/metrics", "/v1/models", "/rollout/ro-canary/attempt/at-1/v1/models"):
            answer(f"proxy ({label}) GET {path}", requests.get(pbase + path, headers=ptok, timeout=30))
        stop(proxy, plog, f"proxy ({label}) log")
    upstream.shutdown()
    careless.shutdown()
    assert f"Basic {BASIC_UPSTREAM}" in upstream.keys, f"the upstream was not sent its key: {upstream.keys}"

    assert_no_canary()
    with capsys.disabled():
        print(f"\ncanary leak check: {len(CANARY)} secrets, {len(SEEN)} answers and logs "
              f"({sum(len(t) for _w, t in SEEN)} characters), none leaked")


def _cli() -> list[str]:
    import sys

    return [sys.executable, "-m", "rolloutbus.cli"]  # run in ROOT: the package is importable there


def test_no_secret_leaks_from_serve_or_the_dashboard(secret_env: dict[str, str], the_store: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    SEEN.clear()
    # The store's password only in each DSN tried below (a password variable would override the DSN's).
    env = {k: v for k, v in secret_env.items() if k not in ("ROLLOUTBUS_CLICKHOUSE_DSN", "ROLLOUTBUS_CLICKHOUSE_PASSWORD")}
    port = the_store.rsplit(":", 1)[1]

    # ---- the policy server with the tiny model: a token, bad tokens, bad bodies
    sport, slog = free_port(), tmp_path / "serve.log"
    serve = py({**env, "ROLLOUTBUS_SERVE_TOKEN": CANARY["serve-token"], "ROLLOUTBUS_SERVE_PORT": str(sport)},
               "-m", "rolloutbus.cli", "serve", "--model", "tiny", "--no-follow", "--threads", "1", log=slog)
    sbase = f"http://127.0.0.1:{sport}"
    wait_http(sbase + "/healthz", serve, slog, timeout=120)
    good = {"Authorization": f"Bearer {CANARY['serve-token']}"}
    chat = {"model": "policy", "messages": [{"role": "user", "content": "5 3 gain"}], "max_tokens": 3}
    r = answer("serve chat", requests.post(sbase + "/v1/chat/completions", json=chat, headers=good, timeout=60))
    assert r.status_code == 200, r.text
    answer("serve stream", requests.post(sbase + "/v1/completions", json={"prompt": "5 3", "max_tokens": 2, "stream": True},
                                         headers=good, timeout=60))
    for label, headers in (("no token", {}), ("wrong token", {"Authorization": "Bearer nope"}),
                           ("token as Basic", {"Authorization": f"Basic {CANARY['serve-token']}"})):
        answer(f"serve {label}", requests.post(sbase + "/v1/chat/completions", json=chat, headers=headers, timeout=30))
    for label, body in (("not JSON", b"{"), ("nested", b"[" * 100_000), ("bad n", b'{"messages": [], "n": 1000}'),
                        ("bad prompt", b'{"prompt": [-1, 99999999999]}'), ("NaN", b'{"prompt": "x", "temperature": NaN}')):
        for route in ("/v1/chat/completions", "/v1/completions"):
            answer(f"serve {label} {route}", requests.post(sbase + route, data=body, timeout=30,
                                                           headers={**good, "Content-Type": "application/json"}))
    for path in ("/healthz", "/v1/models", "/metrics", "/nowhere"):
        answer(f"serve GET {path}", requests.get(sbase + path, headers=good, timeout=30))
    stop(serve, slog, "serve log")

    # ---- the dashboard: its token, the store's passwords in the DSN (each form), the analyst's password,
    # a scrape target and Kafka (SASL) it cannot reach
    dead = free_port()
    dsns = {"password in the DSN": f"http://rolloutbus:{CANARY['ch-writer']}@127.0.0.1:{port}",
            "wrong password as ?password=": f"http://127.0.0.1:{port}/?user=rolloutbus&password={CANARY['ch-wrong']}",
            "a lone token@": f"http://{CANARY['ch-wrong']}@127.0.0.1:{port}"}
    dtok = {"Authorization": f"Bearer {CANARY['dashboard-token']}"}
    from foundation.clickhouse import open_store

    open_store(dsns["password in the DSN"], "rolloutbus").close()  # the tables, so that the panels and SQL answer
    for label, dsn in dsns.items():
        dport, dlog = free_port(), tmp_path / f"dashboard-{len(SEEN)}.log"
        dash = py({**env, "ROLLOUTBUS_CLICKHOUSE_DSN": dsn,
                   "ROLLOUTBUS_DASHBOARD_TOKEN": CANARY["dashboard-token"], "ROLLOUTBUS_DASHBOARD_PORT": str(dport),
                   "ROLLOUTBUS_DASHBOARD_ANALYST_USER": "analyst", "ROLLOUTBUS_DASHBOARD_ANALYST_PASSWORD": CANARY["ch-analyst"],
                   "ROLLOUTBUS_DASHBOARD_SCRAPE": f"http://127.0.0.1:{dead}/metrics?token={CANARY['metrics-token']}",
                   "ROLLOUTBUS_KAFKA_BOOTSTRAP": f"127.0.0.1:{dead}", "ROLLOUTBUS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                   "ROLLOUTBUS_KAFKA_SASL_MECHANISM": "PLAIN"},
                  "-m", "rolloutbus.cli", "-v", "dashboard", log=dlog)
        dbase = f"http://127.0.0.1:{dport}"
        wait_http(dbase + "/healthz", dash, dlog)
        config = answer(f"dashboard ({label}) config", requests.get(dbase + "/api/config", headers=dtok, timeout=30))
        assert config.status_code == 200 and "127.0.0.1" in config.json()["clickhouse"], config.text
        for path in ("/", "/healthz", "/api/learning", "/api/pipeline", "/api/rollouts", "/api/rollouts?limit=abc",
                     "/api/rollout/ro-canary", "/static/../settings.py", "/nowhere"):
            answer(f"dashboard ({label}) GET {path}", requests.get(dbase + path, headers=dtok, timeout=30))
        for sql in ("SELECT currentUser()", "SELECT * FROM nowhere WHERE", "CREATE TABLE t (a Int8) ENGINE = Memory",
                    "SELECT name, value FROM system.settings WHERE changed"):
            r = answer(f"dashboard ({label}) SQL {sql}", requests.post(dbase + "/api/sql", json={"sql": sql}, headers=dtok,
                                                                       timeout=30))
            if sql == "SELECT currentUser()" and label == "password in the DSN":
                assert r.status_code == 200, r.text  # the SQL box works as the analyst
        answer(f"dashboard ({label}) SQL bad body", requests.post(dbase + "/api/sql", data=b"{", headers=dtok, timeout=30))
        for headers in ({}, {"Authorization": "Bearer nope"}):
            answer(f"dashboard ({label}) {headers or 'no token'}", requests.get(dbase + "/api/config", headers=headers, timeout=30))
        stop(dash, dlog, f"dashboard ({label}) log")

    assert_no_canary()
    with capsys.disabled():
        print(f"\ncanary leak check (serve, dashboard): {len(SEEN)} answers and logs "
              f"({sum(len(t) for _w, t in SEEN)} characters), none leaked")
