"""deploy/k8s rendered with Kustomize and validated against Kubernetes and CRD schemas, offline."""

from __future__ import annotations

import json

from deploy_tools import run_tool


def test_every_kustomization_renders_and_validates(tools: dict[str, str]) -> None:
    proc = run_tool(tools, "import os, shlex, k8s\nraise SystemExit(k8s.main(['--kustomize', os.environ['KUSTOMIZE']]))")
    assert proc.returncode == 0, proc.stderr
    assert "5 kustomizations" in proc.stdout  # base, cpu-trainer, fsdp-multinode, clickhouse-operator, gpu-vllm


def _render_base(tools: dict[str, str]) -> str:
    return "import os, shlex, json, k8s, model\nobjs = model.render(model.K8S / 'base', shlex.split(os.environ['KUSTOMIZE']))\n"


def test_base_has_the_expected_workloads(tools: dict[str, str]) -> None:
    proc = run_tool(tools, _render_base(tools) + "print(json.dumps(sorted(o['kind'] + '/' + o['metadata']['name'] for o in objs)))")
    assert proc.returncode == 0, proc.stderr
    names = set(json.loads(proc.stdout))
    assert "KafkaUser/rolloutbus" not in names, "one user per process kind, not one for all"
    for expected in [
        "StatefulSet/rolloutbus-gateway", "Service/rolloutbus-gateway", "HorizontalPodAutoscaler/rolloutbus-gateway",
        "StatefulSet/rolloutbus-proxy", "Service/rolloutbus-proxy", "HorizontalPodAutoscaler/rolloutbus-proxy",
        "Deployment/rolloutbus-policy", "Service/rolloutbus-policy", "PersistentVolumeClaim/rolloutbus-checkpoints",
        "Deployment/rolloutbus-stream-worker", "StatefulSet/rolloutbus-runner", "StatefulSet/rolloutbus-trainer",
        "Job/rolloutbus-migrate", "KafkaTopic/rb-spans", "KafkaTopic/rb-resources",
        *(f"KafkaUser/rolloutbus-{kind}" for kind in ("gateway", "proxy", "runner", "stream-worker", "trainer", "policy", "tasks", "optimizer")),
    ]:
        assert expected in names


def test_unknown_field_and_type_errors_are_caught(tools: dict[str, str]) -> None:
    code = _render_base(tools) + (
        "dep = next(o for o in objs if o['kind'] == 'Deployment')\n"
        "dep['spec']['template']['spec']['containers'][0]['imagePullPolicyy'] = 'Always'\n"
        "dep['spec']['replicas'] = 'two'\n"
        "topic = next(o for o in objs if o['kind'] == 'KafkaTopic')\n"
        "topic['spec']['partitons'] = 3\n"
        "unknown = {'apiVersion': 'example.com/v1', 'kind': 'Widget', 'metadata': {'name': 'w'}}\n"
        "print(json.dumps([k8s.validate_schema(o, '1.33') for o in (dep, topic, unknown)]))"
    )
    proc = run_tool(tools, code)
    assert proc.returncode == 0, proc.stderr
    dep_errors, topic_errors, unknown_errors = json.loads(proc.stdout)
    assert dep_errors and topic_errors and unknown_errors
    assert "partitons" in topic_errors[0]
    assert "no schema" in unknown_errors[0]


def test_project_rules_are_enforced(tools: dict[str, str]) -> None:
    code = _render_base(tools) + (
        "cm = next(o for o in objs if o['kind'] == 'ConfigMap')\n"
        "cm['data']['ROLLOUTBUS_CLICKHOUSE_PASSWORD'] = 'hunter2'\n"
        "w = next(o for o in objs if o['metadata']['name'] == 'rolloutbus-stream-worker' and o['kind'] == 'Deployment')\n"
        "w['spec']['replicas'] = 100\n"
        "res = next(o for o in objs if o['kind'] == 'KafkaTopic' and o['spec']['topicName'] == 'rb.resources')\n"
        "res['spec']['config']['cleanup.policy'] = 'delete'\n"
        "print(json.dumps(k8s.check_rules(objs)))"
    )
    proc = run_tool(tools, code)
    assert proc.returncode == 0, proc.stderr
    problems = " | ".join(json.loads(proc.stdout))
    assert "looks like a secret" in problems
    assert "100 replicas > 24 partitions" in problems
    assert "rb.resources must be" in problems
