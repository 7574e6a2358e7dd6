"""Validates deploy/docker-compose.yml offline.

1. Against the Compose Specification's JSON schema, as vendored by the ``check-jsonschema`` package
   (``check_jsonschema/builtin_schemas/vendor/compose-spec.json``; nothing is fetched).
2. The project's rules: three KRaft brokers with distinct node ids, all in the controller quorum and
   all in ROLLOUTBUS_KAFKA_BOOTSTRAP; every rolloutbus process is there; every ``depends_on`` target
   exists; passwords are interpolated (``${...}``), never literal; each rolloutbus command is a real
   ``rolloutbus`` subcommand (read from rolloutbus/cli.py); the GPU trainer sits behind a profile with
   an NVIDIA device reservation.

What is NOT checked: variable interpolation results, image pulls, that containers start (no Docker
engine here). Run: ``python deploy/validate/compose.py [FILE]``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
REQUIRED_SERVICES = {"kafka-1", "kafka-2", "kafka-3", "clickhouse", "init", "gateway", "proxy", "stream-worker", "runner", "trainer", "trainer-gpu"}


def compose_schema() -> dict[str, Any]:
    """The Compose Specification schema that ships inside check-jsonschema."""
    from importlib import resources

    ref = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(ref.read_text())


def rolloutbus_subcommands(cli: Path = ROOT / "rolloutbus" / "cli.py") -> set[str]:
    """Subcommands of the `rolloutbus` CLI: built-ins (add_parser) and COMPONENTS keys."""
    text = cli.read_text()
    names = set(re.findall(r'sub\.add_parser\(\s*"([\w-]+)"', text))
    block = re.search(r"COMPONENTS[^=]*=\s*\{(.*?)\n\}", text, re.S)
    if block:
        names |= set(re.findall(r'^\s*"([\w-]+)"\s*:', block.group(1), re.M))
    return names


def schema_errors(doc: dict[str, Any]) -> list[str]:
    import jsonschema

    schema = compose_schema()
    # The vendored schema declares its draft (2020-12: unevaluatedProperties); use that validator.
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(doc)]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def rule_errors(doc: dict[str, Any]) -> list[str]:
    problems = []
    services: dict[str, Any] = doc.get("services", {})
    missing = REQUIRED_SERVICES - set(services)
    if missing:
        problems.append(f"services missing: {sorted(missing)}")

    brokers = {n: s for n, s in services.items() if str(s.get("image", "")).startswith("apache/kafka")}
    ids = [_env(s).get("KAFKA_NODE_ID") for s in brokers.values()]
    if len(brokers) < 3 or len(set(ids)) != len(ids):
        problems.append(f"need 3 KRaft brokers with distinct KAFKA_NODE_ID, got {dict(zip(brokers, ids))}")
    for name, s in brokers.items():
        env = _env(s)
        voters = env.get("KAFKA_CONTROLLER_QUORUM_VOTERS", "")
        for other, node_id in zip(brokers, ids):
            if f"{node_id}@{other}:" not in voters:
                problems.append(f"{name}: KAFKA_CONTROLLER_QUORUM_VOTERS lacks {node_id}@{other}")
        if not any(str(v).startswith(f"{name}:") for v in s.get("volumes", [])):
            problems.append(f"{name}: its log dir needs a named volume")
        if "healthcheck" not in s:
            problems.append(f"{name}: no healthcheck")

    commands = rolloutbus_subcommands()
    for name, s in services.items():
        env = _env(s)
        for key, value in env.items():
            if ("PASSWORD" in key or "SECRET" in key) and not value.startswith("${"):
                problems.append(f"{name}: {key} is a literal; interpolate it from the environment (${{VAR}})")
        deps = s.get("depends_on") or {}
        for dep in deps:
            if dep not in services:
                problems.append(f"{name}: depends_on {dep}, which is not a service")
        if str(s.get("image", "")).startswith("${ROLLOUTBUS_IMAGE"):
            cmd = s.get("command") or []
            if not cmd or cmd[0] not in commands:
                problems.append(f"{name}: command {cmd[:1]} is not a rolloutbus subcommand ({sorted(commands)})")
            if "ROLLOUTBUS_KAFKA_BOOTSTRAP" not in env:
                problems.append(f"{name}: no ROLLOUTBUS_KAFKA_BOOTSTRAP")
            elif brokers and not all(f"{b}:9092" in env["ROLLOUTBUS_KAFKA_BOOTSTRAP"] for b in brokers):
                problems.append(f"{name}: ROLLOUTBUS_KAFKA_BOOTSTRAP should list every broker")

    gpu = services.get("trainer-gpu", {})
    devices = gpu.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    if "gpu" not in (gpu.get("profiles") or []) or not any("gpu" in d.get("capabilities", []) for d in devices):
        problems.append("trainer-gpu: needs profile `gpu` and a device reservation with capabilities [gpu]")
    return problems


def validate(path: Path = COMPOSE) -> list[str]:
    """Schema and rule problems of a compose file (empty: valid)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        return [f"not YAML: {exc}"]
    if not isinstance(doc, dict):
        return ["not a mapping"]
    return schema_errors(doc) + rule_errors(doc)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else COMPOSE
    problems = validate(path)
    for p in problems:
        print(f"compose: {p}", file=sys.stderr)
    if not problems:
        print(f"compose: {path.name} valid against the Compose Specification schema and the deployment rules")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
