"""Validates deploy/docker-compose.yml offline.

1. Against the Compose Specification's JSON schema, as vendored by the ``check-jsonschema`` package
   (``check_jsonschema/builtin_schemas/vendor/compose-spec.json``; nothing is fetched).
2. The project's rules of the ``compose`` step (rules.py; structure.py): three KRaft brokers with
   distinct node ids, all in the controller quorum and all in ROLLOUTBUS_KAFKA_BOOTSTRAP; every
   rolloutbus process is there; every ``depends_on`` target exists; passwords are interpolated
   (``${...}``), never literal; each rolloutbus command is a real ``rolloutbus`` subcommand (read from
   rolloutbus/cli.py); the GPU trainer sits behind a profile with an NVIDIA device reservation.

Without FILE, the files layered on it (compose.local.yml, compose.gpu-vllm.yml: model.COMPOSE_FILES) are checked
against the schema too; their rules are the ``commands`` step's (commands.py).

What is NOT checked: variable interpolation results, image pulls, that containers start (no Docker
engine here). Run: ``python deploy/validate/compose.py [FILE]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rules  # noqa: E402 - deploy/validate/*.py, on the path just above
from model import COMPOSE, COMPOSE_FILES, ComposeFile, read_compose  # noqa: E402


def compose_schema() -> dict[str, Any]:
    """The Compose Specification schema that ships inside check-jsonschema."""
    from importlib import resources

    ref = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(ref.read_text())


def schema_errors(doc: dict[str, Any]) -> list[str]:
    import jsonschema

    schema = compose_schema()
    # The vendored schema declares its draft (2020-12: unevaluatedProperties); use that validator.
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(doc)]


def validate(path: Path = COMPOSE) -> list[str]:
    """Schema and rule problems of a compose file (empty: valid)."""
    try:
        doc = read_compose(path)
    except yaml.YAMLError as exc:
        return [f"not YAML: {exc}"]
    if not isinstance(doc, dict):
        return ["not a mapping"]
    return schema_errors(doc) + rules.run("compose", ComposeFile(path, doc))


def overlay_errors(path: Path) -> list[str]:
    """Schema problems of a compose file layered on the base (its rules run in commands.py)."""
    try:
        doc = read_compose(path)
    except yaml.YAMLError as exc:
        return [f"{path.name}: not YAML: {exc}"]
    return [f"{path.name}: {e}" for e in schema_errors(doc)] if isinstance(doc, dict) else [f"{path.name}: not a mapping"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else COMPOSE
    overlays = [] if args else [p for p in COMPOSE_FILES[1:] if p.exists()]
    problems = validate(path) + [e for p in overlays for e in overlay_errors(p)]
    names = ", ".join(p.name for p in overlays)
    return rules.report("compose", problems, f"{path.name} valid against the Compose Specification schema and the deployment rules"
                        + (f"; {names} against the schema" if overlays else ""))


if __name__ == "__main__":
    sys.exit(main())
