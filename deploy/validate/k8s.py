"""Validates the Kubernetes manifests under deploy/k8s/ offline.

For the base and every overlay: render with Kustomize (``kubectl kustomize`` or ``kustomize build``),
then validate every rendered object

- built-in kinds against the Kubernetes OpenAPI schemas shipped by the ``kubernetes-validate`` package,
  in strict mode (an unknown field is an error);
- custom resources (Strimzi KafkaTopic/KafkaUser, KubeRay RayJob, ClickHouseInstallation) against the
  schemas in deploy/validate/crds/, and the pod templates a RayJob embeds against PodTemplateSpec;
- a kind with no schema at all is an error, never a silent pass;

and the project's rules of the ``k8s`` step (rules.py; structure.py): no password/secret values in
ConfigMaps, every ``*PASSWORD`` env var comes from a Secret, stream-worker replicas <= rb.spans
partitions, rb.batches has 1 partition, rb.resources is compacted, containers run real subcommands,
every Service selects the pods of some workload.

Needs the ``kubernetes-validate`` and ``jsonschema`` packages (deploy/validate.sh installs them into a
tool venv). Run: ``python deploy/validate/k8s.py [--kustomize CMD] [--kubernetes-version 1.33]``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rules  # noqa: E402 - deploy/validate/*.py, on the path just above
from model import K8S, Kustomization, kustomizations, load, pod_templates, ref  # noqa: E402

HERE = Path(__file__).resolve().parent
CRDS = HERE / "crds"
DEFAULT_K8S_VERSION = "1.33"


def _crd_schema(obj: dict[str, Any]) -> dict[str, Any] | None:
    group = str(obj.get("apiVersion", "")).split("/")[0]
    path = CRDS / f"{str(obj.get('kind', '')).lower()}.{group}.json"
    return json.loads(path.read_text()) if path.exists() else None


def validate_schema(obj: dict[str, Any], version: str) -> list[str]:
    """Schema errors for one object (empty list: valid)."""
    import jsonschema
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError

    crd = _crd_schema(obj)
    if crd is not None:
        errors = [f"{ref(obj)}: {'.'.join(map(str, e.path))}: {e.message}" for e in jsonschema.Draft202012Validator(crd).iter_errors(obj)]
        if obj.get("kind") == "RayJob":
            for t in pod_templates(obj):
                errors += validate_schema({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": t.path}, "template": t.template}, version)
        return errors
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{ref(obj)}: {'.'.join(map(str, exc.path))}: {exc.message}"]
    except SchemaNotFoundError:
        return [f"{ref(obj)}: no schema for {obj.get('apiVersion')} {obj.get('kind')} (add one under {CRDS.relative_to(HERE.parent.parent)})"]
    return []


def check_rules(objs: list[dict[str, Any]]) -> list[str]:
    """The project's own deployment rules (see the module docstring)."""
    return rules.run("k8s", Kustomization("", objs))


def validate_tree(kustomize: list[str], version: str = DEFAULT_K8S_VERSION, root: Path = K8S) -> tuple[int, list[str]]:
    """Render and check every kustomization under ``root``. Returns (objects checked, problems)."""
    problems: list[str] = []
    count = 0
    for k in load([], kustomize, root).k8s:
        if k.error:
            problems.append(f"{k.name}: {k.error}")
            continue
        count += len(k.objs)
        for o in k.objs:
            problems += [f"{k.name}: {p}" for p in validate_schema(o, version)]
        problems += [f"{k.name}: {p}" for p in rules.run("k8s", k)]
    return count, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kustomize", default="kubectl kustomize", help="command that renders a kustomization directory")
    parser.add_argument("--kubernetes-version", default=DEFAULT_K8S_VERSION)
    args = parser.parse_args(argv)
    count, problems = validate_tree(shlex.split(args.kustomize), args.kubernetes_version)
    return rules.report("k8s", problems, f"{len(kustomizations())} kustomizations, {count} objects valid against Kubernetes "
                        f"{args.kubernetes_version} and CRD schemas")


if __name__ == "__main__":
    sys.exit(main())
