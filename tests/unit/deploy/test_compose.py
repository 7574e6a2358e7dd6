"""deploy/docker-compose.yml against the Compose Specification schema and the deployment rules."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from deploy_tools import ROOT, run_tool

COMPOSE = ROOT / "deploy" / "docker-compose.yml"


def test_compose_file_is_valid(tools: dict[str, str]) -> None:
    proc = run_tool(tools, "import compose; raise SystemExit(compose.main([]))")
    assert proc.returncode == 0, proc.stderr


def test_compose_file_passes_check_jsonschema_cli(tools: dict[str, str]) -> None:
    cli = str(Path(tools["TOOL_PYTHON"]).parent / "check-jsonschema")
    proc = subprocess.run([cli, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _check(tools: dict[str, str], doc: dict, tmp_path: Path) -> str:
    path = tmp_path / "compose.yml"
    path.write_text(yaml.safe_dump(doc))
    proc = run_tool(tools, f"import compose; raise SystemExit(compose.main([{str(path)!r}]))")
    assert proc.returncode == 1
    return proc.stderr


def test_schema_violation_is_reported(tools: dict[str, str], tmp_path: Path) -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    doc["services"]["gateway"]["restart_policy"] = "always"  # not a Compose service key
    doc["services"]["gateway"]["ports"] = 4318  # must be a list
    err = _check(tools, doc, tmp_path)
    assert "restart_policy" in err and "services/gateway/ports" in err


def test_rules_are_enforced(tools: dict[str, str], tmp_path: Path) -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    doc["services"]["stream-worker"]["environment"]["ROLLOUTBUS_CLICKHOUSE_PASSWORD"] = "hunter2"
    doc["services"]["kafka-3"]["environment"]["KAFKA_NODE_ID"] = 2
    doc["services"]["trainer"]["command"] = ["training"]
    del doc["services"]["trainer-gpu"]["profiles"]
    err = _check(tools, doc, tmp_path)
    assert "ROLLOUTBUS_CLICKHOUSE_PASSWORD is a literal" in err
    assert "distinct KAFKA_NODE_ID" in err
    assert "trainer: command ['training'] is not a rolloutbus subcommand" in err
    assert "trainer-gpu: needs profile `gpu`" in err
