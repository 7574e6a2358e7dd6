"""The deployment files as one model: the compose files and the rendered kustomizations, read once.

Every check of deploy/validate reads deploy/ through this module: the schema checks (compose.py, k8s.py,
run by the tool venv) and the rules (rules.py, run by the project's Python). It needs PyYAML and the
standard library only, and imports nothing of the project, so both interpreters can load it.

- compose: a :class:`ComposeFile` (an override layered on its base file), its services with their
  environment as written and as interpolated with the file's defaults, their published ports and volumes;
- k8s: a :class:`Kustomization` (the objects ``kustomize build`` renders), its pod templates (workloads and
  RayJob groups), its ConfigMaps, Services and KafkaUsers;
- both: the :class:`Container` s that run the rolloutbus image: where each is declared, its argv after the
  image's entrypoint (``$(VAR)`` / ``${VAR:-default}`` expanded), its environment.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
# The base, then the files layered on it: the local podman run's, the GPU policy server's (vLLM).
COMPOSE_FILES = [COMPOSE, DEPLOY / "compose.local.yml", DEPLOY / "compose.gpu-vllm.yml"]
DOCKERFILE = DEPLOY / "Dockerfile"
WORKLOADS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}
LONG_RUNNING = {"Deployment", "StatefulSet", "DaemonSet"}


@dataclass
class Container:
    """One process deploy/ starts: where it is declared, its argv after the image's entrypoint, its env."""

    where: str
    argv: list[str]
    env: dict[str, str]
    kind: str = ""  # the workload kind (k8s), "compose" or "RayJob"
    obj: dict[str, Any] = field(default_factory=dict)
    template: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)  # the k8s container, or the compose service

    @property
    def declared_in(self) -> str:
        """The last word of ``where``: the compose service's name."""
        return self.where.rsplit(" ", 1)[1]


def _is_rolloutbus_image(image: Any) -> bool:
    return "rolloutbus" in str(image).lower()


def under(path: str, mount: str) -> bool:
    """Whether ``path`` is ``mount`` or below it."""
    p, m = PurePosixPath(path), PurePosixPath(mount)
    return p == m or m in p.parents


# --------------------------------------------------------------------------- compose


def expand(text: str) -> str:
    """Compose interpolation with the defaults written in the file (``${X:-d}`` → d; a required ``${X:?msg}``
    → ``x``, a value the operator must give; ``${X}`` → empty, as compose leaves an unset variable)."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        default = m.group(3)
        if m.group(2) is None:
            return ""
        return default if m.group(2) in (":-", "-") and default is not None else "x"

    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}", one, text)


class _ComposeLoader(yaml.SafeLoader):
    """Compose files may carry ``!reset`` / ``!override`` tags (merge control): read as plain values."""


_ComposeLoader.add_multi_constructor("!", lambda loader, suffix, node: (
    loader.construct_mapping(node) if isinstance(node, yaml.MappingNode)
    else loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) else loader.construct_scalar(node)))


def read_compose(path: Path) -> Any:
    """A compose file's YAML as it stands (None when empty); raises ``yaml.YAMLError`` when it is not YAML."""
    return yaml.load(path.read_text(), Loader=_ComposeLoader)  # noqa: S506 - a SafeLoader subclass


def load_compose(path: Path) -> dict[str, Any]:
    """A compose file as a document (``{}`` when empty)."""
    return read_compose(path) or {}


def environment(service: dict[str, Any], interpolate: bool = True) -> dict[str, str]:
    """A service's ``environment`` (mapping or list form), interpolated with the file's defaults or as written."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): expand(str(v)) if interpolate else str(v) for k, v in env.items()}


def volume_mounts(service: dict[str, Any], interpolate: bool = True) -> list[tuple[str, str]]:
    """(source, target) of each volume (short or long syntax); source "" for an anonymous volume."""
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            out.append((str(v.get("source", "")), str(v.get("target", ""))))
            continue
        parts = (expand(str(v)) if interpolate else str(v)).split(":")
        out.append((parts[0], parts[1]) if len(parts) > 1 else ("", parts[0]))
    return out


def published_ports(service: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(host address, host port, container port) of each published port, with the file's defaults;
    host address "" means every interface (what compose and podman do when none is given)."""
    out = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            ip, host, target = (expand(str(p.get(k, ""))) for k in ("host_ip", "published", "target"))
        else:
            text, ip = expand(str(p)).split("/")[0], ""
            if text.startswith("["):  # [::1]:8123:8123
                ip, text = text[1:].split("]", 1)
                text = text.lstrip(":")
            parts = text.split(":")
            if len(parts) >= 3:
                ip, host, target = ":".join(parts[:-2]), parts[-2], parts[-1]
            elif len(parts) == 2:
                host, target = parts
            else:
                host, target = "", parts[0]
        try:
            out.append((ip.strip("[]"), host, int(target.split("-")[0])))
        except ValueError:
            continue  # not a port number: the schema check reports it
    return out


@dataclass
class ComposeFile:
    """One compose file; ``base`` is the document of the file it is layered on (None: it is the base)."""

    path: Path
    doc: dict[str, Any]
    base: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        return self.doc.get("services") or {}

    def in_base(self, svc: str) -> dict[str, Any]:
        """The base file's definition of ``svc`` ({} for a base file, or a service the base lacks)."""
        return ((self.base or {}).get("services") or {}).get(svc) or {}

    def merged(self, svc: str) -> dict[str, Any]:
        """``svc`` as compose runs it: the override's keys over the base's, the two environments merged."""
        spec, base = self.services[svc], self.in_base(svc)
        return {**base, **spec, "environment": {**environment(base), **environment(spec)}}

    @cached_property
    def containers(self) -> list[Container]:
        """Services that run the rolloutbus image with a command (an override's take the base's image)."""
        out = []
        for svc, s in self.services.items():
            image = s.get("image") or self.in_base(svc).get("image")
            if not _is_rolloutbus_image(image) or not s.get("command"):
                continue
            cmd = s["command"]
            argv = shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]
            out.append(Container(f"{self.name}: service {svc}", [expand(a) for a in argv], environment(s), "compose", spec=s))
        return out


# --------------------------------------------------------------------------- k8s


def kustomizations(root: Path = K8S) -> list[Path]:
    """Every directory with a kustomization.yaml: the base and each overlay."""
    return sorted(p.parent for p in root.rglob("kustomization.yaml"))


def render(directory: Path, kustomize: list[str]) -> list[dict[str, Any]]:
    """The objects ``kustomize build`` renders for ``directory``."""
    proc = subprocess.run([*kustomize, str(directory)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise ValueError(f"kustomize build failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def ref(obj: dict[str, Any]) -> str:
    """``Kind/name`` of an object."""
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


@dataclass(frozen=True)
class PodTemplate:
    """A pod template inside an object: ``path`` as the schema names it, ``label`` as messages name it."""

    obj: dict[str, Any]
    path: str  # "spec.template", "rayClusterSpec.headGroupSpec.template", ...
    label: str  # "", " head", " worker group <name>"
    template: dict[str, Any]

    @property
    def labels(self) -> dict[str, str]:
        return self.template.get("metadata", {}).get("labels") or {}

    @property
    def containers(self) -> list[dict[str, Any]]:
        return list(self.template.get("spec", {}).get("containers", []))

    @property
    def init_containers(self) -> list[dict[str, Any]]:
        return list(self.template.get("spec", {}).get("initContainers", []))


def pod_templates(obj: dict[str, Any]) -> Iterator[PodTemplate]:
    """The pod templates of a workload, or of a RayJob's head and worker groups."""
    spec = obj.get("spec", {})
    if obj.get("kind") in WORKLOADS:
        yield PodTemplate(obj, "spec.template", "", spec.get("template", {}))
    if obj.get("kind") == "RayJob":
        cluster = spec.get("rayClusterSpec", {})
        yield PodTemplate(obj, "rayClusterSpec.headGroupSpec.template", " head", cluster.get("headGroupSpec", {}).get("template", {}))
        for i, group in enumerate(cluster.get("workerGroupSpecs", [])):
            yield PodTemplate(obj, f"rayClusterSpec.workerGroupSpecs[{i}].template", f" worker group {group.get('groupName')}",
                              group.get("template", {}))


def selects(selector: dict[str, Any], labels: dict[str, Any]) -> bool:
    """Whether a non-empty Service selector matches a pod's labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command and args (``$$`` escapes; unknown names stay)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


@dataclass
class Kustomization:
    """The objects one kustomization renders; ``error`` says why it did not render (then no objects)."""

    name: str  # the directory, relative to deploy/k8s
    objs: list[dict[str, Any]]
    error: str | None = None

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objs if o.get("kind") == kind]

    def named(self, kind: str) -> dict[str, dict[str, Any]]:
        """Objects of ``kind`` by name."""
        return {o["metadata"]["name"]: o for o in self.of_kind(kind)}

    @cached_property
    def config_maps(self) -> dict[str, dict[str, Any]]:
        """ConfigMap name → its data."""
        return {name: o.get("data") or {} for name, o in self.named("ConfigMap").items()}

    @cached_property
    def templates(self) -> list[PodTemplate]:
        return [t for o in self.objs for t in pod_templates(o)]

    @cached_property
    def service_ports(self) -> dict[str, set[int]]:
        """Service name → the ports it offers."""
        return {name: {int(p["port"]) for p in o["spec"].get("ports", [])} for name, o in self.named("Service").items()}

    def env(self, c: dict[str, Any]) -> dict[str, str]:
        """A container's environment: ConfigMaps it imports, then its env (Secrets as ``<secretKeyRef>``)."""
        env: dict[str, str] = {}
        for src in c.get("envFrom") or []:
            cm = src.get("configMapRef")
            if cm:
                env.update({src.get("prefix", "") + k: str(v) for k, v in self.config_maps.get(cm["name"], {}).items()})
        for e in c.get("env") or []:
            if "value" in e:
                env[e["name"]] = k8s_expand(str(e["value"]), env)
            elif (e.get("valueFrom") or {}).get("configMapKeyRef"):
                key = e["valueFrom"]["configMapKeyRef"]
                env[e["name"]] = str(self.config_maps.get(key["name"], {}).get(key["key"], ""))
            else:
                env[e["name"]] = f"<{next(iter(e.get('valueFrom') or {'unset': 0}))}>"
        return env

    @cached_property
    def containers(self) -> list[Container]:
        """Every container running the rolloutbus image with args, and each RayJob's entrypoint."""
        out = []
        for o in self.objs:
            for t in pod_templates(o):
                for c in t.containers:
                    if not _is_rolloutbus_image(c.get("image")) or not (c.get("args") or c.get("command")):
                        continue
                    env = self.env(c)
                    argv = [k8s_expand(str(a), env) for a in (c.get("command") or [])[1:] + (c.get("args") or [])]
                    out.append(Container(f"{self.name}: {o['kind']}/{o['metadata']['name']}{t.label} container {c['name']}",
                                         argv, env, o["kind"], o, t.template, c))
            if o.get("kind") == "RayJob":
                head = o["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
                c = head["spec"]["containers"][0]
                env = self.env(c)
                words = shlex.split(str(o["spec"].get("entrypoint", "")))
                argv = [k8s_expand(w, env) for w in words[1:]] if words[:1] == ["rolloutbus"] else ["<not rolloutbus>", *words]
                out.append(Container(f"{self.name}: RayJob/{o['metadata']['name']} entrypoint", argv, env, "RayJob", o, head, c))
        return out

    def selects(self, svc: dict[str, Any], c: Container) -> bool:
        """Whether Service ``svc`` selects the pods of ``c`` 's workload."""
        selector = svc.get("spec", {}).get("selector") or {}
        labels = c.template.get("metadata", {}).get("labels") or {}
        return c.kind in WORKLOADS and selects(selector, labels)


# --------------------------------------------------------------------------- the Dockerfile


@dataclass
class Stage:
    """One build stage of a Dockerfile: its name ("" for an unnamed one), what it is ``FROM``, its instructions
    (continuation lines joined, comments dropped), and the ``ENV`` it sets itself."""

    name: str
    base: str
    instructions: list[str]
    env: dict[str, str]


def dockerfile_stages(path: Path = DOCKERFILE) -> list[Stage]:
    """The stages of a Dockerfile in order (the last is what a build without ``--target`` makes)."""
    lines, current = [], ""
    for raw in path.read_text().splitlines():
        if not current and raw.lstrip().startswith("#"):
            continue
        current += raw.rstrip("\\").strip() + " " if raw.rstrip().endswith("\\") else raw.strip()
        if not raw.rstrip().endswith("\\"):
            if current.strip():
                lines.append(current.strip())
            current = ""
    stages: list[Stage] = []
    for line in lines:
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else ""
            stages.append(Stage(name, parts[0] if parts else "", [], {}))
        elif stages:
            stages[-1].instructions.append(line)
            if word.upper() == "ENV":
                for k, v in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|\S+)", rest):
                    stages[-1].env[k] = v.strip('"')
    return stages


def stage_chain(stages: list[Stage], name: str) -> list[Stage]:
    """The stage ``name`` and those it is built ``FROM`` (by name), nearest first."""
    by_name = {s.name: s for s in stages if s.name}
    chain, stage = [], by_name.get(name)
    while stage is not None and stage not in chain:
        chain.append(stage)
        stage = by_name.get(stage.base)
    return chain


def stage_env(stages: list[Stage], name: str) -> dict[str, str]:
    """The ``ENV`` a stage runs with: its own over those of the stages it is built ``FROM``."""
    env: dict[str, str] = {}
    for s in reversed(stage_chain(stages, name)):
        env.update(s.env)
    return env


# --------------------------------------------------------------------------- the whole of deploy/


@dataclass
class Model:
    """deploy/ read once: the compose files (each after the first layered on it) and every kustomization."""

    compose: list[ComposeFile]
    k8s: list[Kustomization]


def load(compose_files: list[Path] | None = None, kustomize: list[str] | None = None, root: Path = K8S) -> Model:
    """Read the compose files (default: those of :data:`COMPOSE_FILES` that exist) and, with a Kustomize
    command, render every kustomization under ``root`` (one that fails to render carries its error)."""
    files = compose_files if compose_files is not None else [p for p in COMPOSE_FILES if p.exists()]
    compose: list[ComposeFile] = []
    for path in files:
        compose.append(ComposeFile(path, load_compose(path), compose[0].doc if compose else None))
    k8s = []
    for directory in kustomizations(root) if kustomize is not None else []:
        name = str(directory.relative_to(root))
        try:
            k8s.append(Kustomization(name, render(directory, kustomize)))
        except ValueError as exc:
            k8s.append(Kustomization(name, [], str(exc)))
    return Model(compose, k8s)
