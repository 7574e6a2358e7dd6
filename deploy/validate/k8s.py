"""Validates the Kubernetes manifests under deploy/k8s/ offline.

For the base and every overlay: render with Kustomize (``kubectl kustomize`` or ``kustomize build``),
then validate every rendered object

- built-in kinds against the Kubernetes OpenAPI schemas shipped by the ``kubernetes-validate`` package,
  in strict mode (an unknown field is an error);
- custom resources (Strimzi KafkaTopic/KafkaUser, KubeRay RayJob, ClickHouseInstallation) against the
  schemas in deploy/validate/crds/, and the pod templates a RayJob embeds against PodTemplateSpec;
- a kind with no schema at all is an error, never a silent pass;

and the project's rules: no password/secret values in ConfigMaps, every ``*PASSWORD`` env var comes
from a Secret, stream-worker replicas <= rb.spans partitions, rb.batches has 1 partition, rb.resources
is compacted, every Service selects the pods of some workload.

Needs the ``kubernetes-validate`` and ``jsonschema`` packages (deploy/validate.sh installs them into a
tool venv). Run: ``python deploy/validate/k8s.py [--kustomize CMD] [--kubernetes-version 1.33]``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

HERE = Path(__file__).resolve().parent
K8S = HERE.parent / "k8s"
CRDS = HERE / "crds"
DEFAULT_K8S_VERSION = "1.33"
WORKLOADS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}


def kustomizations(root: Path = K8S) -> list[Path]:
    """Every directory with a kustomization.yaml: the base and each overlay."""
    return sorted(p.parent for p in root.rglob("kustomization.yaml"))


def render(directory: Path, kustomize: list[str]) -> list[dict[str, Any]]:
    """The objects ``kustomize build`` renders for ``directory``."""
    proc = subprocess.run([*kustomize, str(directory)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise ValueError(f"kustomize build failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _name(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def _crd_schema(obj: dict[str, Any]) -> dict[str, Any] | None:
    group = str(obj.get("apiVersion", "")).split("/")[0]
    path = CRDS / f"{str(obj.get('kind', '')).lower()}.{group}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _pod_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = obj.get("spec", {})
    if obj.get("kind") in WORKLOADS:
        yield "spec.template", spec.get("template", {})
    if obj.get("kind") == "RayJob":
        cluster = spec.get("rayClusterSpec", {})
        yield "rayClusterSpec.headGroupSpec.template", cluster.get("headGroupSpec", {}).get("template", {})
        for i, group in enumerate(cluster.get("workerGroupSpecs", [])):
            yield f"rayClusterSpec.workerGroupSpecs[{i}].template", group.get("template", {})


def validate_schema(obj: dict[str, Any], version: str) -> list[str]:
    """Schema errors for one object (empty list: valid)."""
    import jsonschema
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError

    crd = _crd_schema(obj)
    if crd is not None:
        errors = [f"{_name(obj)}: {'.'.join(map(str, e.path))}: {e.message}" for e in jsonschema.Draft202012Validator(crd).iter_errors(obj)]
        if obj.get("kind") == "RayJob":
            for where, template in _pod_templates(obj):
                errors += validate_schema({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": where}, "template": template}, version)
        return errors
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{_name(obj)}: {'.'.join(map(str, exc.path))}: {exc.message}"]
    except SchemaNotFoundError:
        return [f"{_name(obj)}: no schema for {obj.get('apiVersion')} {obj.get('kind')} (add one under {CRDS.relative_to(HERE.parent.parent)})"]
    return []


def _topic(objs: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    for o in objs:
        if o.get("kind") == "KafkaTopic" and o.get("spec", {}).get("topicName", o["metadata"]["name"]) == name:
            return o
    return None


def check_rules(objs: list[dict[str, Any]]) -> list[str]:
    """The project's own deployment rules (see the module docstring)."""
    problems = []
    secret_words = ("PASSWORD", "SECRET", "TOKEN", "PRIVATE_KEY")
    for o in objs:
        if o.get("kind") == "ConfigMap":
            for key in o.get("data", {}) or {}:
                if any(w in key.upper() for w in secret_words):
                    problems.append(f"{_name(o)}: key {key} looks like a secret; put it in a Secret")
        for where, template in _pod_templates(o):
            for c in template.get("spec", {}).get("containers", []) + template.get("spec", {}).get("initContainers", []):
                for env in c.get("env", []):
                    if any(w in env["name"].upper() for w in secret_words):
                        if "secretKeyRef" not in (env.get("valueFrom") or {}):
                            problems.append(f"{_name(o)} {where} container {c['name']}: {env['name']} must come from a Secret (valueFrom.secretKeyRef)")

    spans = _topic(objs, "rb.spans")
    if spans is None:
        problems.append("no KafkaTopic for rb.spans")
    else:
        partitions = spans["spec"].get("partitions", 0)
        for o in objs:
            if o.get("kind") == "Deployment" and o["metadata"]["name"].endswith("stream-worker"):
                if o["spec"].get("replicas", 1) > partitions:
                    problems.append(f"{_name(o)}: {o['spec']['replicas']} replicas > {partitions} partitions of rb.spans (extra workers idle)")
            if o.get("kind") == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"].endswith("stream-worker"):
                if o["spec"]["maxReplicas"] > partitions:
                    problems.append(f"{_name(o)}: maxReplicas > {partitions} partitions of rb.spans")
    batches = _topic(objs, "rb.batches")
    if batches is None or batches["spec"].get("partitions") != 1:
        problems.append("rb.batches must be a KafkaTopic with exactly 1 partition (the trainer reads groups in order)")
    resources = _topic(objs, "rb.resources")
    if resources is None or resources["spec"].get("config", {}).get("cleanup.policy") != "compact":
        problems.append("rb.resources must be a KafkaTopic with cleanup.policy: compact")

    from compose import rolloutbus_subcommands

    commands = rolloutbus_subcommands()
    for o in objs:
        for where, template in _pod_templates(o):
            for c in template.get("spec", {}).get("containers", []):
                args = c.get("args") or []
                if "rolloutbus" in str(c.get("image", "")) and args and args[0] not in commands:
                    problems.append(f"{_name(o)} {where} container {c['name']}: {args[0]!r} is not a rolloutbus subcommand")
        entry = str(o.get("spec", {}).get("entrypoint", "")).split()
        if o.get("kind") == "RayJob" and (entry[:1] != ["rolloutbus"] or entry[1:2] and entry[1] not in commands):
            problems.append(f"{_name(o)}: entrypoint should run a rolloutbus subcommand")

    pod_labels = [t.get("metadata", {}).get("labels", {}) for o in objs for _, t in _pod_templates(o)]
    for o in objs:
        if o.get("kind") == "Service":
            selector = o.get("spec", {}).get("selector") or {}
            if selector and not any(all(labels.get(k) == v for k, v in selector.items()) for labels in pod_labels):
                problems.append(f"{_name(o)}: selector {selector} matches no pod template")
    return problems


def validate_tree(kustomize: list[str], version: str = DEFAULT_K8S_VERSION, root: Path = K8S) -> tuple[int, list[str]]:
    """Render and check every kustomization under ``root``. Returns (objects checked, problems)."""
    problems: list[str] = []
    count = 0
    for directory in kustomizations(root):
        rel = directory.relative_to(root)
        try:
            objs = render(directory, kustomize)
        except ValueError as exc:
            problems.append(f"{rel}: {exc}")
            continue
        count += len(objs)
        for o in objs:
            problems += [f"{rel}: {p}" for p in validate_schema(o, version)]
        problems += [f"{rel}: {p}" for p in check_rules(objs)]
    return count, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kustomize", default="kubectl kustomize", help="command that renders a kustomization directory")
    parser.add_argument("--kubernetes-version", default=DEFAULT_K8S_VERSION)
    args = parser.parse_args(argv)
    count, problems = validate_tree(shlex.split(args.kustomize), args.kubernetes_version)
    for p in problems:
        print(f"k8s: {p}", file=sys.stderr)
    if not problems:
        print(f"k8s: {len(kustomizations())} kustomizations, {count} objects valid against Kubernetes {args.kubernetes_version} and CRD schemas")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
