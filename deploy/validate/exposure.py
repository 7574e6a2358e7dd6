"""Rules on open addresses: nothing deploy/ starts answers beyond loopback without asking for credentials.

8. a server on an address other than loopback has its credential: the gateway's, proxy's, policy
   server's, dashboard's tokens, the store's passwords (without them they refuse to start), and the
   stream worker's and the trainer's ``ROLLOUTBUS_METRICS_TOKEN`` (without it their ``/metrics`` answers
   anyone; they only log a WARNING);
9. compose: a port published on every host interface (no host address, ``0.0.0.0`` or ``::``, with the
   file's defaults) belongs to a service that asks for credentials there: a Kafka listener with SASL
   (or TLS client certificates), a ClickHouse server whose passwords cannot be empty, a rolloutbus
   server with its token / passwords (rule 8). Anything else is published on 127.0.0.1
   (``"${KAFKA_BIND:-127.0.0.1}:29092:29092"``) until the operator opens it on purpose.
"""

from __future__ import annotations

import re
from typing import Any

from facts import EXPOSED, METRICS_SERVERS, METRICS_TOKEN, listener
from model import ComposeFile, Container, Kustomization, environment, published_ports
from processes import Process, Processes
from wiring import loopback

EVERY_INTERFACE = {"", "0.0.0.0", "::", "*"}


def _metrics_token(c: Container, s: Any) -> bool:
    return bool(c.env.get(METRICS_TOKEN) or getattr(s, "metrics_token", None))


def has_credential(p: Process, port: int | None = None) -> bool:
    """Whether the process asks every client for a credential (on ``port``, when its listener is that one)."""
    c, ns, s = p
    if ns.command in EXPOSED:
        credential = getattr(s, EXPOSED[ns.command][1], None)
        if ns.command == "store":
            try:
                return bool(credential) and bool(s.has_credentials())
            except Exception:  # noqa: BLE001 - users that do not parse are the store's own error
                return False
        return bool(credential)
    if ns.command in METRICS_SERVERS:
        served = listener(ns.command, s)
        return served is not None and (port is None or port == served[1]) and _metrics_token(c, s)
    return False


def _exposure(p: Process) -> list[str]:
    c, ns, s = p
    if ns.command in METRICS_SERVERS:
        served = listener(ns.command, s)
        if served is None or loopback(served[0]) or _metrics_token(c, s):
            return []
        return [f"{c.where}: `{ns.command}` serves /metrics on {served[0]}:{served[1]} without {METRICS_TOKEN}: anyone "
                "who reaches that address reads it (set the variable from a Secret, e.g. rolloutbus-http key "
                "metrics-token, and scrape with its bearer token; or bind 127.0.0.1)"]
    if ns.command not in EXPOSED:
        return []
    host_field, credential, variable = EXPOSED[ns.command]
    host = str(getattr(s, host_field, "127.0.0.1"))
    if loopback(host) or getattr(s, credential, None) or getattr(s, "insecure", False):
        return []
    return [f"{c.where}: `{ns.command}` listens on {host} without {variable}: it refuses to start "
            "(set the variable from a Secret, or pass --insecure on purpose)"]


def credentials(target: ComposeFile | Kustomization, procs: Processes) -> list[str]:
    """Rule 8: a server on a non-loopback address has its credential (or says --insecure): else it would
    not start, or (metrics) would answer anyone."""
    return [problem for p in procs for problem in _exposure(p)]


def _kafka_listener(env: dict[str, str], port: int) -> tuple[str, str] | None:
    """(listener name, security protocol) of the broker's listener on ``port``, or None."""
    protocols = dict(x.strip().split(":", 1) for x in env.get("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "").split(",") if ":" in x)
    for item in env.get("KAFKA_LISTENERS", "").split(","):
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)://[^,]*:(\d+)\s*$", item)
        if m and int(m.group(2)) == port:
            return m.group(1), protocols.get(m.group(1), m.group(1)).upper()
    return None


def _unguarded(spec: dict[str, Any], port: int, rb: Process | None) -> str | None:
    """Why the service's ``port`` lets anyone in (None: it asks for credentials)."""
    env = environment(spec)
    if rb is not None:
        command = rb.ns.command
        if has_credential(rb, port):
            return None
        if command in EXPOSED:
            return f"`rolloutbus {command}` has no {EXPOSED[command][2]} (or a user without a password)"
        if command in METRICS_SERVERS:
            return f"`rolloutbus {command}` serves /metrics without {METRICS_TOKEN}"
        return f"`rolloutbus {command}` asks no credentials"
    if "KAFKA_LISTENERS" in env:
        found = _kafka_listener(env, port)
        if found is None:
            return f"no Kafka listener is on port {port}"
        name, protocol = found
        client_auth = env.get(f"KAFKA_LISTENER_NAME_{name.upper()}_SSL_CLIENT_AUTH", env.get("KAFKA_SSL_CLIENT_AUTH", ""))
        if protocol.startswith("SASL_") or (protocol == "SSL" and client_auth == "required"):
            return None
        return f"its Kafka listener {name} is {protocol}: anyone may produce and consume (use SASL_SSL or SASL_PLAINTEXT)"
    if "clickhouse-server" in str(spec.get("image", "")):
        passwords = {k: v for k, v in env.items() if "PASSWORD" in k}
        if "CLICKHOUSE_PASSWORD" in passwords and all(passwords.values()) and env.get("CLICKHOUSE_SKIP_USER_SETUP") != "1":
            return None
        return "a ClickHouse user there may have no password (interpolate each from a required variable, ${VAR:?...})"
    return "nothing there asks for credentials"


def published(f: ComposeFile, procs: Processes) -> list[str]:
    """Rule 9: what compose publishes on every host interface asks for credentials. In an override, the
    services whose ports or command it changes are checked as merged with the base file."""
    by_service = {p.container.declared_in: p for p in procs}
    problems = []
    for svc, spec in f.services.items():
        if f.base is not None:
            if "ports" not in spec and "command" not in spec:
                continue
            spec = f.merged(svc)
        for ip, host, target in published_ports(spec):
            if ip not in EVERY_INTERFACE:
                continue
            why = _unguarded(spec, target, by_service.get(svc))
            if why:
                problems.append(
                    f"{f.name}: service {svc} publishes port {target} on every host interface "
                    f"({ip or '*'}:{host or 'any'}), but {why}: publish it on 127.0.0.1 "
                    f"(\"${{..._BIND:-127.0.0.1}}:{host or target}:{target}\") and open it only with credentials in place")
    return problems
