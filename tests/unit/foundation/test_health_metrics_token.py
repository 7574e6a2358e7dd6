"""``/metrics`` of the stream worker's and the trainer's health server behind a bearer token; the probes open.

One server (:mod:`foundation.health`) serves both processes: with a token (given, or
``ROLLOUTBUS_METRICS_TOKEN``) ``/metrics`` answers only ``Authorization: Bearer <token>``; ``/healthz`` and
``/readyz`` stay open and say nothing of the configuration. Bound beyond loopback without a token, the
start warns."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from foundation.health import HealthServer, serve_health

TOKEN = "metrics-tok-91c3"


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("rolloutbus_test_things", "things", registry=registry).inc(2)
    return registry


def test_metrics_needs_the_token_and_the_probes_do_not() -> None:
    server = HealthServer(lambda: (False, "kafka: no partition of the spans topic assigned"), _registry(), token=TOKEN).start()
    try:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}, {"Authorization": f"Bearer {TOKEN}x"}):
            status, body = _get(server.port, "/metrics", headers)
            assert status == 401 and "rolloutbus_test_things" not in body and TOKEN not in body, (headers, body)
        status, body = _get(server.port, "/metrics", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and "rolloutbus_test_things_total 2.0" in body
        assert _get(server.port, "/healthz") == (200, "ok\n")
        assert _get(server.port, "/readyz") == (503, "kafka: no partition of the spans topic assigned\n")
    finally:
        server.close()


def test_the_token_comes_from_the_environment_when_the_process_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTBUS_METRICS_TOKEN", TOKEN)
    server = serve_health(lambda: (True, "ready"), "127.0.0.1", _free_port(), explicit=True, flag="--metrics-port",
                          env="X", registry=_registry())
    assert server is not None
    try:
        assert _get(server.port, "/metrics")[0] == 401
        assert _get(server.port, "/metrics", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    finally:
        server.close()


@pytest.mark.parametrize("host,token,warned", [("0.0.0.0", None, True), ("0.0.0.0", TOKEN, False), ("127.0.0.1", None, False)])
def test_metrics_open_beyond_loopback_is_warned_about(host: str, token: str | None, warned: bool, caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLOUTBUS_METRICS_TOKEN", raising=False)
    with caplog.at_level(logging.INFO, logger="foundation.health"):
        server = serve_health(lambda: (True, "ready"), host, _free_port(), explicit=True, flag="--metrics-host", env="X",
                              registry=_registry(), token=token)
    assert server is not None
    server.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert bool(warnings) == warned, warnings
    if warned:
        assert "ROLLOUTBUS_METRICS_TOKEN" in warnings[0] and "anyone" in warnings[0]
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
