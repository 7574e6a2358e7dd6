"""How deploy/containers reads the compose files (compose.py) and what it waits for (lifecycle.py): pure, no containers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "deploy" / "containers"))

from compose import ComposeError, Project, Reset, interpolate, merge  # noqa: E402
from lifecycle import KAFKA_READY, wait_plan  # noqa: E402

FILES = [REPO / "deploy" / "docker-compose.yml", REPO / "deploy" / "compose.local.yml"]
ENV = {"CLICKHOUSE_PASSWORD": "pw", "ANALYST_PASSWORD": "ap", "POLICY_TOKEN": "pt", "PROXY_TOKEN": "xt", "GATEWAY_TOKEN": "gt",
       "KAFKA_IMAGE": "localhost/rolloutbus-kafka:k", "ROLLOUTBUS_SLIM_IMAGE": "localhost/rolloutbus-slim:s",
       "ROLLOUTBUS_IMAGE": "localhost/rolloutbus:f"}


@pytest.mark.parametrize(("text", "env", "expected"), [
    ("${A}", {"A": "x"}, "x"),
    ("${A:-d}", {}, "d"),
    ("${A:-d}", {"A": ""}, "d"),
    ("${A-d}", {"A": ""}, ""),
    ("${A:+set}", {"A": "1"}, "set"),
    ("$$HOME ${B:-${A}}", {"A": "in"}, "$HOME in"),
    ("a $A b", {"A": "1"}, "a 1 b"),
])
def test_interpolation(text: str, env: dict[str, str], expected: str) -> None:
    assert interpolate(text, env) == expected


def test_a_required_variable_names_itself() -> None:
    with pytest.raises(ComposeError, match="set CLICKHOUSE_PASSWORD"):
        interpolate("${CLICKHOUSE_PASSWORD:?set CLICKHOUSE_PASSWORD}", {}, "services.init")


def test_merge_follows_the_compose_rules() -> None:
    base = {"environment": ["A=1", "B=2"], "ports": ["1:1", "2:2"], "command": ["a", "b"], "ulimits": {"n": 1}}
    over = {"environment": {"B": "3"}, "ports": ["9:2"], "command": ["c"], "ulimits": Reset()}
    out = merge(base, over)
    assert out["environment"] == {"A": "1", "B": "3"}
    assert out["ports"] == ["1:1", "9:2"]  # merged by container port
    assert out["command"] == ["c"]  # lists other than ports/volumes are replaced
    assert isinstance(out["ulimits"], Reset)


def test_the_local_run_swaps_images_not_the_topology() -> None:
    prod = Project.load(FILES[:1], env=ENV)
    local = Project.load(FILES, env=ENV)
    assert set(local.services) == set(prod.services) - {"trainer-gpu"}  # the gpu profile stays off
    assert local.services["kafka-1"].image == ENV["KAFKA_IMAGE"]
    assert local.services["kafka-2"].environment["KAFKA_NODE_ID"] == "2"  # the broker's settings are kept
    ch = local.services["clickhouse"]
    assert ch.image == ENV["ROLLOUTBUS_SLIM_IMAGE"] and ch.command()[0] == "store"
    assert ch.environment == {"ROLLOUTBUS_STORE_USERS": "rolloutbus:writer:pw,analyst:analyst:ap"}
    assert "ulimits" not in ch.spec
    for name in ("policy", "trainer"):
        assert local.services[name].image == ENV["ROLLOUTBUS_IMAGE"]
    for name in ("init", "gateway", "proxy", "stream-worker", "runner"):
        assert local.services[name].image == ENV["ROLLOUTBUS_SLIM_IMAGE"]
        assert local.services[name].command() == prod.services[name].command() or name == "runner"
    runner = local.services["runner"]
    assert runner.command() == ["run-agent", "rolloutbus.demo.agent:CalcAgent"]
    assert runner.environment["ROLLOUTBUS_LLM_PROXY_URL"] == "http://proxy:8080"
    assert runner.environment["ROLLOUTBUS_LLM_PROXY_TOKEN"] == "xt"
    assert runner.depends_on["policy"] == {"condition": "service_healthy"}


def test_replicas_get_one_host_port_each() -> None:
    p = Project.load(FILES, env={**ENV, "GATEWAY_PORTS": "5000-5001"})
    gw = p.services["gateway"]
    assert gw.replicas == 2
    replicas = [p.replica(gw, n) for n in (1, 2)]
    assert [r.ports for r in replicas] == [{"4318/tcp": 5000}, {"4318/tcp": 5001}]
    assert all(r.volumes[f"{p.name}_gateway-spool"] == ("/var/lib/rolloutbus/spool", "rw") for r in replicas)
    assert replicas[1].name == "rolloutbus-gateway-2"


def test_a_single_host_port_for_several_replicas_is_refused() -> None:
    p = Project.load(FILES, env={**ENV, "GATEWAY_PORTS": "5000"})
    with pytest.raises(ComposeError, match="give a range"):
        p.replica(p.services["gateway"], 1)


def test_health_checks_become_testcontainers_waits() -> None:
    p = Project.load(FILES, env=ENV)
    plan = {name: wait_plan(s, p.replica(s, 1)) for name, s in p.services.items()}
    # HTTP checks of a published port: waited for from outside, on the port the host publishes.
    assert plan["clickhouse"] == [("http", 8123, "/ping")]
    assert plan["gateway"] == [("http", 4318, "/healthz")]
    assert plan["proxy"] == [("http", 8080, "/healthz")]
    # Brokers: their log line, then the compose file's own check; the unpublished policy server: its check.
    for broker in ("kafka-1", "kafka-2", "kafka-3"):
        assert plan[broker][0] == ("log", KAFKA_READY)
        assert plan[broker][1] == ("exec", ["/bin/sh", "-c", p.services[broker].healthcheck["test"][1]])
    assert [kind for kind, _ in plan["policy"]] == ["exec"] and "8000/healthz" in " ".join(plan["policy"][0][1])
    assert plan["init"] == plan["stream-worker"] == plan["runner"] == []
