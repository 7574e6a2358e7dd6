"""Probes and metrics of a long-running consumer: ``/healthz``, ``/readyz`` and ``/metrics`` on one port.

* ``/healthz`` — liveness: 200 ``ok`` while the process answers. It says nothing else (no names, no
  addresses), so it can be opened to a kubelet without revealing the configuration.
* ``/readyz`` — readiness: 200 ``ready`` only when :class:`Readiness` finds the process connected and
  making progress, else 503 with one short reason (``kafka: ...``, ``clickhouse: ...``, ``stalled: ...``).
* ``/metrics`` — the Prometheus text format of a registry. With a token (``serve_health(token=...)``, else
  ``ROLLOUTBUS_METRICS_TOKEN``) it answers only ``Authorization: Bearer <token>`` (Prometheus:
  ``authorization: {credentials: ...}``); the probes stay open for the kubelet. Bound beyond loopback
  without a token, the start logs a WARNING saying who can read it.

:class:`Readiness` is plain state that the process's own loop updates (assignment, backlog, progress,
named problems) and the server's thread reads; the rule that turns it into a verdict is a pure function
of that state and the time, so it is tested without a broker.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from foundation.errors import ConfigError
from foundation.exposure import is_loopback

log = logging.getLogger(__name__)

Verdict = tuple[bool, str]


@dataclass
class Readiness:
    """What a consumer's loop reports about itself. Times are ``time.monotonic()`` seconds.

    Ready means: started; the loop called :meth:`watch` within ``stall_s``; at least one partition of its input topic assigned; no named problem
    (``problem("clickhouse", ...)`` until ``clear("clickhouse")``); and either nothing is waiting to be
    read (backlog 0 or unknown) or progress was made within ``stall_s`` (counted from the assignment,
    so a worker that just joined has time to catch up).
    """

    input_name: str = "input"  # what the assignment is of, for the reason ("the spans topic")
    stall_s: float = 120.0
    started: bool = False
    assigned: int = 0
    assigned_at: float | None = None
    backlog: int | None = None
    last_progress: float | None = None
    problems: dict[str, tuple[str, float]] = field(default_factory=dict)
    _last_watch: float = field(default=float("-inf"), repr=False)
    _alive: float | None = field(default=None, repr=False)  # the last time the loop called start() or watch()
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self, now: float | None = None) -> None:
        self.beat(now)
        self.started = True

    def beat(self, now: float | None = None) -> None:
        """The loop ran (:meth:`watch` calls this): a loop that stops calling it is stalled after ``stall_s``."""
        self._alive = time.monotonic() if now is None else now

    def assignment(self, partitions: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            if partitions and not self.assigned:
                self.assigned_at = now
            self.assigned = partitions

    def progress(self, now: float | None = None) -> None:
        self.last_progress = time.monotonic() if now is None else now

    def problem(self, name: str, reason: str, now: float | None = None) -> None:
        """Not ready because of ``name`` (``kafka``, ``clickhouse``) until :meth:`clear` — the first
        time it was seen is kept, so the reason says for how long."""
        now = time.monotonic() if now is None else now
        with self._lock:
            since = self.problems.get(name, (reason, now))[1]
            self.problems[name] = (reason, since)

    def clear(self, name: str) -> None:
        with self._lock:
            self.problems.pop(name, None)

    def watch(self, consumer: Any, topic: str, now: float | None = None, every_s: float = 1.0) -> None:
        """Read the assignment (partitions of ``topic``) and the backlog off a confluent-kafka consumer, at
        most every ``every_s``; call it from the thread that polls. Cached watermarks: never waits."""
        now = time.monotonic() if now is None else now
        self.beat(now)
        if now - self._last_watch < every_s:
            return
        self._last_watch = now
        try:
            partitions = sorted(tp.partition for tp in consumer.assignment() if tp.topic == topic)
        except Exception:  # noqa: BLE001 - a closed consumer holds nothing
            partitions = []
        self.assignment(len(partitions), now)
        self.backlog = backlog(consumer, topic, partitions)

    def verdict(self, now: float | None = None) -> Verdict:
        """(ready, reason): the first thing that keeps the process from being ready, or ``ready``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            problems = dict(self.problems)
            assigned, assigned_at = self.assigned, self.assigned_at
        if not self.started:
            return False, "starting"
        if self._alive is not None and now - self._alive > self.stall_s:  # the loop is stuck (a hung step, insert, ...)
            return False, f"stalled: the consumer loop has not run for {now - self._alive:.0f}s"
        if not assigned:
            return False, f"kafka: no partition of {self.input_name} assigned (joining the consumer group)"
        if problems:
            name, (reason, since) = min(problems.items())
            return False, f"{name}: {reason} (for {now - since:.0f}s)"
        if self.backlog:
            last = max(x for x in (self.last_progress, assigned_at, 0.0) if x is not None)
            if now - last > self.stall_s:
                return False, f"stalled: no progress for {now - last:.0f}s with {self.backlog} records waiting"
        return True, "ready"


_HOST = re.compile(r"^[A-Za-z0-9_.-]+$")


def check_bind_host(v: str) -> str:
    """A settings validator: an address or host name to bind (``127.0.0.1``, ``0.0.0.0``, ``::``), no port."""
    host = v.strip("[]") if v.startswith("[") else v
    try:
        ok = bool(_HOST.match(host)) if ":" not in host else bool(ipaddress.IPv6Address(host))
    except ValueError:
        ok = False
    if not ok:
        raise ValueError("must be an address or host name to bind, without scheme or port (127.0.0.1, 0.0.0.0, ::)")
    return host


def backlog(consumer: Any, topic: str, partitions: list[int]) -> int | None:
    """Records between a confluent-kafka consumer's position and the high watermark on ``partitions`` of
    ``topic``, summed; None while unknown (nothing fetched yet)."""
    from confluent_kafka import KafkaException, TopicPartition

    if not partitions:
        return None
    total, known = 0, False
    try:
        for tp in consumer.position([TopicPartition(topic, p) for p in partitions]):
            if tp.offset < 0:  # no position yet
                continue
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0:
                total += max(high - tp.offset, 0)
                known = True
    except KafkaException:
        return None
    return total if known else None


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            try:
                ok, reason = self.server.ready()
            except Exception as exc:  # noqa: BLE001 - a probe answers, whatever the check did
                ok, reason = False, f"readiness check failed: {type(exc).__name__}"
            self._send(200 if ok else 503, (reason + "\n").encode())
        elif path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            token = self.server.token
            if token is not None:
                given = (self.headers.get("Authorization") or "").encode("latin-1", "replace")
                if not hmac.compare_digest(given, f"Bearer {token}".encode("latin-1", "replace")):
                    self._send(401, b"/metrics needs Authorization: Bearer <the metrics token>\n",
                               extra={"WWW-Authenticate": "Bearer"})
                    return
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        else:
            self._send(404, b"not found: /healthz, /readyz, /metrics\n")

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - probes every few seconds: not logged
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    ready: Callable[[], Verdict]
    registry: Any
    token: str | None = None


class _Server6(_Server):
    address_family = socket.AF_INET6


class HealthServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` on ``host:port``, served from a daemon thread.

    ``port=0`` binds a free port (tests); the settings treat 0 as "off" before this is built. With ``token``,
    ``/metrics`` needs ``Authorization: Bearer <token>``."""

    def __init__(self, ready: Callable[[], Verdict], registry: Any = None, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        self._ready, self._registry, self.host, self.port = ready, registry, host, port
        self._token = token or None
        self._server: _Server | None = None

    def start(self) -> "HealthServer":
        """Bind and serve. Raises OSError when the address cannot be bound."""
        server_class = _Server6 if ":" in self.host else _Server
        server = server_class((self.host, self.port), _Handler)
        server.ready, server.registry, server.token = self._ready, self._registry, self._token
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, name="health-server", daemon=True).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


METRICS_TOKEN_ENV = "ROLLOUTBUS_METRICS_TOKEN"


def serve_health(ready: Callable[[], Verdict], host: str, port: int, *, explicit: bool, flag: str, env: str,
                 registry: Any = None, token: str | None = None) -> HealthServer | None:
    """Start a :class:`HealthServer`, or None when ``port`` is 0 (off).

    A port given explicitly (flag or variable) that cannot be bound is a :class:`ConfigError`. The
    default port already in use (a second process of the same kind on one host) is a warning: the
    process runs without probes rather than not at all. ``token`` (None: ``ROLLOUTBUS_METRICS_TOKEN``,
    read here because the stream worker's and the trainer's settings do not carry it yet) guards
    ``/metrics``; bound beyond loopback without one, a WARNING says so.
    """
    if not port:
        return None
    if token is None:
        token = os.environ.get(METRICS_TOKEN_ENV) or None
    server = HealthServer(ready, registry, host, port, token=token)
    try:
        server.start()
    except OSError as exc:
        where = f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE and not explicit:
            log.warning("the default metrics port %s is in use (another process on this host?): no /metrics, /healthz or "
                        "/readyz from this one; choose a port with %s or %s", where, flag, env)
            return None
        why = exc.strerror or str(exc)
        raise ConfigError(f"cannot serve /metrics, /healthz, /readyz on {where}: {why} "
                          f"(choose another with {flag} or {env}; 0 turns them off)") from exc
    log.info("serving /metrics, /healthz, /readyz on http://%s:%d%s", host, server.port,
             " (/metrics with its bearer token)" if token else "")
    if token is None and not is_loopback(host):
        log.warning("/metrics on %s:%d answers anyone who can reach that address: set %s (then scrape with "
                    "Authorization: Bearer <token>) or bind 127.0.0.1 with %s", host, server.port, METRICS_TOKEN_ENV, flag)
    return server



def health_settings(process: str, port: int, stall_s: float, stalled_when: str) -> Any:
    """The settings of one process kind's health endpoint, declared once for every kind: ``<process>_metrics_port``
    (``port``; 0: off), ``<process>_metrics_host`` (an address to bind, checked) and ``<process>_stall_s`` (how long
    ``stalled_when`` may last before /readyz turns 503). A process's settings class derives from the class returned
    (a ``CommonSettings``), so its variables stay ``ROLLOUTBUS_<PROCESS>_METRICS_PORT`` and so on."""
    from pydantic import Field, create_model, field_validator

    from foundation.config import PORT, CommonSettings

    return create_model(
        f"{process.title()}HealthSettings", __base__=CommonSettings,
        __validators__={"check_metrics_host": field_validator(f"{process}_metrics_host")(check_bind_host)},
        **{f"{process}_metrics_port": (int, Field(default=port, ge=0, le=PORT["le"],
                                                  description="Port of /metrics, /healthz and /readyz; 0: off.")),
           f"{process}_metrics_host": (str, Field(default="127.0.0.1", description="Address /metrics, /healthz and "
                                                  "/readyz bind; 0.0.0.0 (or ::) opens them to a probe or a scraper from "
                                                  "outside the host.")),
           f"{process}_stall_s": (float, Field(default=stall_s, gt=0, description=f"/readyz turns 503 when {stalled_when} "
                                               "for this long."))})


__all__ = ["HealthServer", "METRICS_TOKEN_ENV", "Readiness", "Verdict", "backlog", "check_bind_host", "health_settings",
           "serve_health"]
