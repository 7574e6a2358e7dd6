"""Nothing deploy/ starts answers on an open address without asking for credentials (deploy/validate/exposure.py,
rules 8 and 9, run by `make validate-deploy`).

compose: a port published on every host interface must belong to a service that asks for credentials
there; the brokers' PLAINTEXT external listeners (the audit's finding) are published on 127.0.0.1 until
KAFKA_BIND opens them. k8s: the stream workers' and the trainer's /metrics on 0.0.0.0 need
ROLLOUTBUS_METRICS_TOKEN (from the Secret rolloutbus-http).
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

import commands
import model
from deploy_tools import ROOT

COMPOSE = ROOT / "deploy" / "docker-compose.yml"
LOCAL = ROOT / "deploy" / "compose.local.yml"
OPEN = "on every host interface"


def _check(tmp_path: Path, text: str) -> str:
    path = tmp_path / "docker-compose.yml"
    path.write_text(text)
    return "\n".join(commands.check_compose(path))


def _with(tmp_path: Path, edit: Any) -> str:
    doc = yaml.safe_load(COMPOSE.read_text())
    edit(doc["services"])
    return _check(tmp_path, yaml.safe_dump(doc))


def test_the_compose_file_before_the_fix_fails_and_the_file_now_passes(tmp_path: Path) -> None:
    # The file as the audit found it: the bind address taken out of every published port.
    before = re.sub(r"\$\{(KAFKA|CLICKHOUSE)_BIND:-127\.0\.0\.1\}:", "", COMPOSE.read_text())
    assert '["${KAFKA_1_PORT:-29092}:29092"]' in before and '["${CLICKHOUSE_HTTP_PORT:-8123}:8123"]' in before
    problems = _check(tmp_path, before)
    for broker, port in (("kafka-1", 29092), ("kafka-2", 29093), ("kafka-3", 29094)):
        assert (f"service {broker} publishes port {port} {OPEN} (*:{port}), but its Kafka listener EXTERNAL is PLAINTEXT"
                in problems), problems
    assert commands.main(["--no-k8s", "--compose", str(tmp_path / "docker-compose.yml")]) == 1

    assert OPEN not in "\n".join(commands.check_compose(COMPOSE))
    assert OPEN not in "\n".join(commands.check_compose(LOCAL, model.load_compose(COMPOSE)))
    assert commands.main(["--no-k8s"]) == 0


def test_an_operator_opens_what_asks_for_credentials(tmp_path: Path) -> None:
    """KAFKA_BIND=0.0.0.0 passes once the external listener is SASL; CLICKHOUSE_BIND=0.0.0.0 with its
    passwords required; an explicit 0.0.0.0 in front of a PLAINTEXT listener is still refused."""
    text = COMPOSE.read_text().replace("${KAFKA_BIND:-127.0.0.1}", "${KAFKA_BIND:-0.0.0.0}")
    text = text.replace("${CLICKHOUSE_BIND:-127.0.0.1}", "${CLICKHOUSE_BIND:-0.0.0.0}")
    problems = _check(tmp_path, text)
    assert "kafka-1 publishes port 29092 on every host interface (0.0.0.0:29092)" in problems
    assert "service clickhouse publishes" not in problems  # every ClickHouse user has a required password

    sasl = text.replace("EXTERNAL:PLAINTEXT", "EXTERNAL:SASL_SSL")
    assert OPEN not in _check(tmp_path, sasl)
    mtls = text.replace("EXTERNAL:PLAINTEXT", "EXTERNAL:SSL").replace(
        "KAFKA_LOG_DIRS:", "KAFKA_LISTENER_NAME_EXTERNAL_SSL_CLIENT_AUTH: required\n  KAFKA_LOG_DIRS:")
    assert OPEN not in _check(tmp_path, mtls)


def test_clickhouse_with_a_password_that_may_be_empty_is_not_opened(tmp_path: Path) -> None:
    def edit(services: dict[str, Any]) -> None:
        services["clickhouse"]["ports"] = ["8123:8123"]
        services["clickhouse"]["environment"]["CLICKHOUSE_ANALYST_PASSWORD"] = "${ANALYST_PASSWORD:-}"

    problems = _with(tmp_path, edit)
    assert f"service clickhouse publishes port 8123 {OPEN} (*:8123), but a ClickHouse user there may have no password" in problems


def test_rolloutbus_servers_on_published_ports_need_their_credentials(tmp_path: Path) -> None:
    def edit(services: dict[str, Any]) -> None:
        del services["gateway"]["environment"]["ROLLOUTBUS_GATEWAY_TOKEN"]
        services["stream-worker"]["command"] = ["process", "--metrics-host", "0.0.0.0", "--metrics-port", "9101"]
        services["stream-worker"]["ports"] = ["9101-9103:9101"]
        services["trainer"]["command"] += ["--metrics-host", "0.0.0.0", "--metrics-port", "9100"]
        services["trainer"]["environment"] = {**services["trainer"].get("environment", {}), "ROLLOUTBUS_METRICS_TOKEN": "${METRICS_TOKEN:?set it}"}
        services["trainer"]["ports"] = ["127.0.0.1:9100:9100", "[::]:9200:9100"]

    problems = _with(tmp_path, edit)
    assert f"service gateway publishes port 4318 {OPEN} (*:4318-4319), but `rolloutbus gateway` has no ROLLOUTBUS_GATEWAY_TOKEN" in problems
    assert "`gateway` listens on 0.0.0.0 without ROLLOUTBUS_GATEWAY_TOKEN: it refuses to start" in problems
    assert f"service stream-worker publishes port 9101 {OPEN} (*:9101-9103), but `rolloutbus process` serves /metrics without ROLLOUTBUS_METRICS_TOKEN" in problems
    assert "service stream-worker: `process` serves /metrics on 0.0.0.0:9101 without ROLLOUTBUS_METRICS_TOKEN" in problems
    assert "service trainer" not in problems  # its token is required: /metrics asks for it on both addresses


def test_the_local_store_needs_passwords_to_be_published(tmp_path: Path) -> None:
    local = LOCAL.read_text().replace(":${CLICKHOUSE_PASSWORD:?set CLICKHOUSE_PASSWORD}", ":")
    path = tmp_path / "compose.local.yml"
    path.write_text(local)
    base = model.load_compose(COMPOSE)
    base["services"]["clickhouse"]["ports"] = ["8123:8123"]
    problems = "\n".join(commands.check_compose(path, base))
    assert f"compose.local.yml: service clickhouse publishes port 8123 {OPEN} (*:8123), but `rolloutbus store` has no " \
           "ROLLOUTBUS_STORE_USERS (or a user without a password)" in problems


@pytest.mark.parametrize(("entry", "expected"), [
    ("8123:8123", [("", "8123", 8123)]),
    ("${CLICKHOUSE_BIND:-127.0.0.1}:${CLICKHOUSE_HTTP_PORT:-8123}:8123", [("127.0.0.1", "8123", 8123)]),
    ("${BIND:-0.0.0.0}:29092:29092/tcp", [("0.0.0.0", "29092", 29092)]),
    ("[::1]:8123:8123", [("::1", "8123", 8123)]),
    ("[::]:8123:8123", [("::", "8123", 8123)]),
    ("4318-4319:4318", [("", "4318-4319", 4318)]),
    ("9000", [("", "", 9000)]),
    ({"target": 8123, "published": "8124", "host_ip": "127.0.0.1"}, [("127.0.0.1", "8124", 8123)]),
    ({"target": 8123}, [("", "", 8123)]),
    ("${UNSET_BIND}:8123:8123", [("", "8123", 8123)]),  # an unset variable is empty: every interface
])
def test_published_ports_are_read_as_compose_reads_them(entry: Any, expected: list[tuple[str, str, int]]) -> None:
    assert model.published_ports({"ports": [entry]}) == expected


@pytest.fixture(scope="module")
def base_objs(tools: dict[str, str]) -> list[dict[str, Any]]:
    return model.render(model.K8S / "base", shlex.split(tools["KUSTOMIZE"]))


def _container(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    obj = next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)
    return obj["spec"]["template"]["spec"]["containers"][0]


def test_k8s_metrics_on_an_open_address_need_the_token_from_the_secret(base_objs: list[dict[str, Any]]) -> None:
    objs = copy.deepcopy(base_objs)
    for kind, name in (("Deployment", "rolloutbus-stream-worker"), ("StatefulSet", "rolloutbus-trainer")):
        env = {e["name"]: e for e in _container(objs, kind, name)["env"]}
        assert env["ROLLOUTBUS_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "rolloutbus-http", "key": "metrics-token"}
    assert "/metrics" not in "\n".join(commands.check_k8s(objs, "base"))

    for kind, name in (("Deployment", "rolloutbus-stream-worker"), ("StatefulSet", "rolloutbus-trainer")):
        c = _container(objs, kind, name)
        c["env"] = [e for e in c["env"] if e["name"] != "ROLLOUTBUS_METRICS_TOKEN"]
    problems = "\n".join(commands.check_k8s(objs, "base"))
    assert "Deployment/rolloutbus-stream-worker container worker: `process` serves /metrics on 0.0.0.0:9101 without ROLLOUTBUS_METRICS_TOKEN" in problems
    assert "StatefulSet/rolloutbus-trainer container trainer: `train` serves /metrics on 0.0.0.0:9100 without ROLLOUTBUS_METRICS_TOKEN" in problems

    trainer = _container(objs, "StatefulSet", "rolloutbus-trainer")
    trainer["args"] = [a for a in trainer["args"] if a not in ("--metrics-host", "0.0.0.0")]  # loopback: no token needed
    assert "`train` serves /metrics" not in "\n".join(commands.check_k8s(objs, "base"))
