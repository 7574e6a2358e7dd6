"""Rules on the shape of the deployment, which need none of the project's code (the tool venv runs them).

compose (docker-compose.yml): every service the stack needs; three KRaft brokers with distinct node ids,
all in the controller quorum, each with a named volume and a healthcheck; passwords interpolated, never
literal; every ``depends_on`` target exists; each rolloutbus service runs a real subcommand and lists
every broker in ROLLOUTBUS_KAFKA_BOOTSTRAP; the GPU trainer sits behind a profile with an NVIDIA device
reservation.

k8s (each rendered kustomization): no password/secret values in ConfigMaps, every secret-looking env var
from a Secret; stream-worker replicas <= rb.spans partitions; rb.batches has 1 partition; rb.resources is
compacted; containers and RayJob entrypoints run real subcommands; every Service selects some pod.
"""

from __future__ import annotations

from typing import Any

from facts import rolloutbus_subcommands
from model import ComposeFile, Kustomization, environment, pod_templates, ref, selects
from processes import Processes

REQUIRED_SERVICES = {"kafka-1", "kafka-2", "kafka-3", "clickhouse", "init", "gateway", "proxy", "stream-worker", "runner", "trainer", "trainer-gpu"}
SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN", "PRIVATE_KEY")


# --------------------------------------------------------------------------- compose


def _brokers(f: ComposeFile) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in f.services.items() if str(s.get("image", "")).startswith("apache/kafka")}


def required_services(f: ComposeFile, _: Processes) -> list[str]:
    missing = REQUIRED_SERVICES - set(f.services)
    return [f"services missing: {sorted(missing)}"] if missing else []


def kraft_brokers(f: ComposeFile, _: Processes) -> list[str]:
    """Three brokers, distinct node ids, each a voter of the others' quorum, a named log volume, a healthcheck."""
    problems = []
    brokers = _brokers(f)
    ids = [environment(s, interpolate=False).get("KAFKA_NODE_ID") for s in brokers.values()]
    if len(brokers) < 3 or len(set(ids)) != len(ids):
        problems.append(f"need 3 KRaft brokers with distinct KAFKA_NODE_ID, got {dict(zip(brokers, ids))}")
    for name, s in brokers.items():
        voters = environment(s, interpolate=False).get("KAFKA_CONTROLLER_QUORUM_VOTERS", "")
        for other, node_id in zip(brokers, ids):
            if f"{node_id}@{other}:" not in voters:
                problems.append(f"{name}: KAFKA_CONTROLLER_QUORUM_VOTERS lacks {node_id}@{other}")
        if not any(str(v).startswith(f"{name}:") for v in s.get("volumes", [])):
            problems.append(f"{name}: its log dir needs a named volume")
        if "healthcheck" not in s:
            problems.append(f"{name}: no healthcheck")
    return problems


def passwords_interpolated(f: ComposeFile, _: Processes) -> list[str]:
    return [f"{name}: {key} is a literal; interpolate it from the environment (${{VAR}})"
            for name, s in f.services.items() for key, value in environment(s, interpolate=False).items()
            if ("PASSWORD" in key or "SECRET" in key) and not value.startswith("${")]


def depends_on_services(f: ComposeFile, _: Processes) -> list[str]:
    return [f"{name}: depends_on {dep}, which is not a service"
            for name, s in f.services.items() for dep in s.get("depends_on") or {} if dep not in f.services]


def compose_subcommands(f: ComposeFile, _: Processes) -> list[str]:
    """Each service of the rolloutbus image runs a subcommand and reaches every broker."""
    problems = []
    commands, brokers = rolloutbus_subcommands(), _brokers(f)
    for name, s in f.services.items():
        if not str(s.get("image", "")).startswith("${ROLLOUTBUS_IMAGE"):
            continue
        env = environment(s, interpolate=False)
        cmd = s.get("command") or []
        if not cmd or cmd[0] not in commands:
            problems.append(f"{name}: command {cmd[:1]} is not a rolloutbus subcommand ({sorted(commands)})")
        if "ROLLOUTBUS_KAFKA_BOOTSTRAP" not in env:
            problems.append(f"{name}: no ROLLOUTBUS_KAFKA_BOOTSTRAP")
        elif brokers and not all(f"{b}:9092" in env["ROLLOUTBUS_KAFKA_BOOTSTRAP"] for b in brokers):
            problems.append(f"{name}: ROLLOUTBUS_KAFKA_BOOTSTRAP should list every broker")
    return problems


def gpu_trainer(f: ComposeFile, _: Processes) -> list[str]:
    gpu = f.services.get("trainer-gpu", {})
    devices = gpu.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    if "gpu" not in (gpu.get("profiles") or []) or not any("gpu" in d.get("capabilities", []) for d in devices):
        return ["trainer-gpu: needs profile `gpu` and a device reservation with capabilities [gpu]"]
    return []


# --------------------------------------------------------------------------- k8s


def secrets_in_secrets(k: Kustomization, _: Processes) -> list[str]:
    """No secret-looking ConfigMap key; every secret-looking env var of a pod from a Secret."""
    problems = []
    for o in k.objs:
        if o.get("kind") == "ConfigMap":
            for key in o.get("data", {}) or {}:
                if any(w in key.upper() for w in SECRET_WORDS):
                    problems.append(f"{ref(o)}: key {key} looks like a secret; put it in a Secret")
        for t in pod_templates(o):
            for c in t.containers + t.init_containers:
                for env in c.get("env", []):
                    if any(w in env["name"].upper() for w in SECRET_WORDS) and "secretKeyRef" not in (env.get("valueFrom") or {}):
                        problems.append(f"{ref(o)} {t.path} container {c['name']}: {env['name']} must come from a Secret (valueFrom.secretKeyRef)")
    return problems


def _topic(k: Kustomization, name: str) -> dict[str, Any] | None:
    return next((o for o in k.of_kind("KafkaTopic") if o.get("spec", {}).get("topicName", o["metadata"]["name"]) == name), None)


def workers_within_partitions(k: Kustomization, _: Processes) -> list[str]:
    """rb.spans exists; stream workers (replicas, autoscaler maximum) no more than its partitions."""
    spans = _topic(k, "rb.spans")
    if spans is None:
        return ["no KafkaTopic for rb.spans"]
    problems = []
    partitions = spans["spec"].get("partitions", 0)
    for o in k.objs:
        if o.get("kind") == "Deployment" and o["metadata"]["name"].endswith("stream-worker"):
            if o["spec"].get("replicas", 1) > partitions:
                problems.append(f"{ref(o)}: {o['spec']['replicas']} replicas > {partitions} partitions of rb.spans (extra workers idle)")
        if o.get("kind") == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"].endswith("stream-worker"):
            if o["spec"]["maxReplicas"] > partitions:
                problems.append(f"{ref(o)}: maxReplicas > {partitions} partitions of rb.spans")
    return problems


def batches_one_partition(k: Kustomization, _: Processes) -> list[str]:
    batches = _topic(k, "rb.batches")
    if batches is None or batches["spec"].get("partitions") != 1:
        return ["rb.batches must be a KafkaTopic with exactly 1 partition (the trainer reads groups in order)"]
    return []


def resources_compacted(k: Kustomization, _: Processes) -> list[str]:
    resources = _topic(k, "rb.resources")
    if resources is None or resources["spec"].get("config", {}).get("cleanup.policy") != "compact":
        return ["rb.resources must be a KafkaTopic with cleanup.policy: compact"]
    return []


def k8s_subcommands(k: Kustomization, _: Processes) -> list[str]:
    """Each rolloutbus container's first argument, and each RayJob's entrypoint, is a subcommand."""
    problems = []
    commands = rolloutbus_subcommands()
    for o in k.objs:
        for t in pod_templates(o):
            for c in t.containers:
                args = c.get("args") or []
                if "rolloutbus" in str(c.get("image", "")) and args and args[0] not in commands:
                    problems.append(f"{ref(o)} {t.path} container {c['name']}: {args[0]!r} is not a rolloutbus subcommand")
        entry = str(o.get("spec", {}).get("entrypoint", "")).split()
        if o.get("kind") == "RayJob" and (entry[:1] != ["rolloutbus"] or entry[1:2] and entry[1] not in commands):
            problems.append(f"{ref(o)}: entrypoint should run a rolloutbus subcommand")
    return problems


def services_select_pods(k: Kustomization, _: Processes) -> list[str]:
    problems = []
    for o in k.of_kind("Service"):
        selector = o.get("spec", {}).get("selector") or {}
        if selector and not any(selects(selector, t.labels) for t in k.templates):
            problems.append(f"{ref(o)}: selector {selector} matches no pod template")
    return problems
