"""Checks what deploy/ starts against the code it runs, with the project's own Python (the real CLI
parser, the settings classes, the names the code derives its topics and groups from).

The rules of the ``commands`` step (rules.py: wiring.py 1-7, exposure.py 8-9, analyst.py 10, vllm_policy.py 11) over the
model of deploy/ (model.py) and the facts read from the code (facts.py): commands parse, ``ROLLOUTBUS_*``
variables are settings, Kafka users' ACLs cover their processes, Service ports and probes reach what
each process serves, spools persist, the proxy has its upstream and runners its URL, open addresses ask
for credentials, the analyst ClickHouse account is read-only with a secret password, a ``serve --engine vllm``
policy server has an image with the vLLM ``make test`` runs, a GPU and a model vLLM loads.

Run: ``python deploy/validate/commands.py [--kustomize CMD] [--compose FILE ...]`` (deploy/validate.sh
passes the Kustomize command it found). Needs the project's packages importable (the repository root
is put on ``sys.path``) and PyYAML.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import model  # noqa: E402 - deploy/validate/*.py, on the path just above
import rules  # noqa: E402


def check_compose(path: Path, base: dict[str, Any] | None = None) -> list[str]:
    """The rules for one compose file (``base``: the document it is layered on; then only its commands,
    variable names, published ports and ClickHouse users)."""
    return rules.run("commands", model.ComposeFile(path, model.load_compose(path), base))


def check_k8s(objs: list[dict[str, Any]], name: str) -> list[str]:
    """The rules for one rendered kustomization."""
    return rules.run("commands", model.Kustomization(name, objs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kustomize", default="kubectl kustomize", help="command that renders a kustomization directory")
    parser.add_argument("--compose", action="append", type=Path, help="compose files (default: docker-compose.yml, then compose.local.yml and compose.gpu-vllm.yml layered on it)")
    parser.add_argument("--no-k8s", action="store_true", help="check the compose files only")
    args = parser.parse_args(argv)

    deploy = model.load(args.compose, None if args.no_k8s else shlex.split(args.kustomize))
    problems: list[str] = []
    for f in deploy.compose:
        problems += rules.run("commands", f)
    count = 0
    for k in deploy.k8s:
        if k.error:
            problems.append(f"{k.name}: {k.error}")
            continue
        count += len(k.containers)
        problems += rules.run("commands", k)
    return rules.report("commands", problems, (
        f"{len(deploy.compose)} compose files and {count} k8s containers: every command parses with the rolloutbus CLI, "
        "every ROLLOUTBUS_* variable is a setting, Kafka users' ACLs cover their processes, ports and probes are served, spools persist, "
        "open addresses ask for credentials, the analyst account is read-only with a secret password, "
        "the vLLM policy server has vLLM, a GPU and a real model"))


if __name__ == "__main__":
    sys.exit(main())
