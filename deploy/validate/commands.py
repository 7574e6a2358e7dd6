"""Checks what deploy/ starts against the code it runs, with the project's own Python (the real CLI
parser, the settings classes, the names the code derives its topics and groups from):

1. every command line parses with ``rolloutbus.cli.build_parser()``: the compose services that run the
   rolloutbus image (docker-compose.yml and compose.local.yml), every k8s container that runs it, and the
   RayJob entrypoint; ``$(VAR)`` (Kubernetes) and ``${VAR:-default}`` (compose) are expanded first;
2. every ``ROLLOUTBUS_*`` variable they set (environment, ConfigMap data) is a setting — a field or
   alias of a subclass of ``foundation.config.CommonSettings`` — or a name the code reads itself (a
   ``"ROLLOUTBUS_..."`` string literal in the project's packages);
3. k8s: a container that talks to Kafka connects as a KafkaUser (``ROLLOUTBUS_KAFKA_SASL_USERNAME``)
   whose Secret holds its password and whose ACLs allow every topic and group its process uses, derived
   from the code (the stream worker's application id, its span stage's and faust's groups, faust's
   changelog and leader topics, the trainer's and the runners' groups, the resource followers);
4. k8s: every Service port and every HTTP probe reaches a port the selected container's process serves,
   on an address other than loopback, and a probe's path is a GET route of that process; gateway,
   proxy, policy server, stream worker and trainer have HTTP readiness and liveness probes;
5. the producers' spool (``<data dir>/spool`` of gateway, proxy and runners) is on a persistent volume:
   a PersistentVolumeClaim or volumeClaimTemplate (k8s), a named volume or bind mount (compose);
6. the proxy's upstream (``--upstream`` / ``ROLLOUTBUS_PROXY_UPSTREAM``) names a Service (k8s) or a
   service (compose) that exists, unless it is a host outside the cluster;
7. runners get the proxy's base URL as ``ROLLOUTBUS_LLM_PROXY_URL`` (agents build each attempt's
   ``/rollout/<id>/attempt/<id>/v1`` from it with ``producers.proxy.proxy_url``), pointing at a port the
   proxy serves; an ``OPENAI_BASE_URL`` at the proxy is refused (it serves no bare ``/v1``: a 404);
8. a server on an address other than loopback has its credential: the gateway's, proxy's, policy
   server's, dashboard's tokens, the store's passwords (without them they refuse to start), and the
   stream worker's and the trainer's ``ROLLOUTBUS_METRICS_TOKEN`` (without it their ``/metrics`` answers
   anyone; they only log a WARNING);
9. compose: a port published on every host interface (no host address, ``0.0.0.0`` or ``::``, with the
   file's defaults) belongs to a service that asks for credentials there: a Kafka listener with SASL
   (or TLS client certificates), a ClickHouse server whose passwords cannot be empty, a rolloutbus
   server with its token / passwords (rule 8). Anything else is published on 127.0.0.1
   (``"${KAFKA_BIND:-127.0.0.1}:29092:29092"``) until the operator opens it on purpose;
10. the ClickHouse that deploy/ runs (compose's server, the local store, the operator's
   ClickHouseInstallation) has the read-only ``analyst`` account, its password from a secret
   (deploy/validate/analyst.py).

Run: ``python deploy/validate/commands.py [--kustomize CMD] [--compose FILE ...]`` (deploy/validate.sh
passes the Kustomize command it found). Needs the project's packages importable (the repository root
is put on ``sys.path``) and PyYAML.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import ipaddress
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Iterator
from urllib.parse import urlparse

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import analyst  # noqa: E402 - deploy/validate/analyst.py, on the path just above

PACKAGES = ("foundation", "schemas", "producers", "streams", "trainer", "rolloutbus")
COMPOSE_FILES = [ROOT / "deploy" / "docker-compose.yml", ROOT / "deploy" / "compose.local.yml"]
PREFIX = "ROLLOUTBUS_"
WORKLOADS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}
LONG_RUNNING = {"Deployment", "StatefulSet", "DaemonSet"}

# subcommand → the settings class its entry reads (module, class)
SETTINGS = {
    "gateway": ("producers.settings", "GatewaySettings"),
    "proxy": ("producers.settings", "ProxySettings"),
    "run-agent": ("producers.settings", "RunnerSettings"),
    "process": ("streams.settings", "StreamSettings"),
    "train": ("trainer.settings", "TrainerSettings"),
    "serve": ("trainer.settings", "ServeSettings"),
    "optimize-prompt": ("trainer.settings", "ApoSettings"),
    "store": ("rolloutbus.store.settings", "StoreSettings"),
    "dashboard": ("rolloutbus.dashboard.settings", "DashboardSettings"),
}
# Field-name prefixes a subcommand's flags drop (--port sets gateway_port, --group sets train_group, ...).
FLAG_FIELD_PREFIXES = ("gateway", "proxy", "runner", "streams", "train", "serve", "apo", "store", "dashboard")

# subcommand → (host field, port field, file whose GET routes it serves). The port a Service or probe
# reaches must be the one these fields resolve to, on an address other than loopback.
LISTENERS = {
    "gateway": ("gateway_host", "gateway_port", "producers/gateway.py"),
    "proxy": ("proxy_host", "proxy_port", "producers/proxy.py"),
    "serve": ("serve_host", "serve_port", "trainer/serve.py"),
    "process": ("streams_metrics_host", "streams_metrics_port", "foundation/health.py"),
    "train": ("train_metrics_host", "train_metrics_port", "foundation/health.py"),
}
# Processes that write spans through a SpanTransport: its spool is <data dir>/spool
# (producers.transport.SpanTransport.from_settings).
SPOOLERS = {"gateway", "proxy", "run-agent"}
# The resource followers (producers/runner.py ResourceFollower, trainer/resources.py) read rb.resources by
# assignment under a random group id `rolloutbus-resources-<8 hex>`; librdkafka looks up its coordinator.
FOLLOWER_GROUP = "rolloutbus-resources-00000000"


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


# --------------------------------------------------------------------------- what the code knows


@lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    from rolloutbus.cli import build_parser

    return build_parser()


def parse(argv: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    """``argv`` parsed by the real ``rolloutbus`` parser: (namespace, None) or (None, its one-line error)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns = _parser().parse_args(argv)
    except SystemExit as exc:
        return None, err.getvalue().strip() or f"exit {exc.code}"
    if getattr(ns, "unavailable", None):
        return None, str(ns.unavailable)
    return ns, None


def _package_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from (p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


@lru_cache(maxsize=1)
def settings_classes() -> list[type]:
    """Every subclass of CommonSettings the project defines (their modules imported to find them)."""
    import importlib

    from foundation.config import CommonSettings

    for path in _package_files():
        if re.search(r"^class \w+\(\w*Settings\)", path.read_text(errors="replace"), re.M):
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    found, todo = [], [CommonSettings]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@lru_cache(maxsize=1)
def known_variables() -> frozenset[str]:
    """ROLLOUTBUS_* names that mean something: settings fields and aliases, and literals the code reads."""
    from pydantic import AliasChoices, AliasPath

    names: set[str] = set()
    for cls in settings_classes():
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, info in cls.model_fields.items():
            names.add((prefix + name).upper())
            for alias in (info.alias, info.validation_alias):
                choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
                for choice in choices:
                    if isinstance(choice, str):
                        names.add(choice.upper())
                    elif isinstance(choice, AliasPath) and isinstance(choice.path[0], str):
                        names.add(choice.path[0].upper())
    for path in _package_files():
        names.update(re.findall(r"""["'](ROLLOUTBUS_[A-Z0-9_]+)["']""", path.read_text(errors="replace")))
    return frozenset(names)


def _settings_class(command: str) -> type:
    import importlib

    from foundation.config import CommonSettings

    module, name = SETTINGS.get(command, ("foundation.config", "CommonSettings"))
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, CommonSettings)
    return cls  # type: ignore[no-any-return]


def settings_for(command: str, ns: argparse.Namespace, env: dict[str, str]) -> Any:
    """The settings the process would read: its flags over its environment over the defaults.

    Built without the validators (``model_construct``: a CA file named here need not exist on this
    machine); values are only coerced to their fields' types.
    """
    from pydantic import TypeAdapter

    cls = _settings_class(command)
    prefix = str(cls.model_config.get("env_prefix", ""))
    values: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        if (prefix + name).upper() in env:
            values[name] = env[(prefix + name).upper()]
    for dest, value in vars(ns).items():
        if value is None or dest in ("command", "func", "module", "verbose"):
            continue
        for candidate in (dest, *(f"{p}_{dest}" for p in FLAG_FIELD_PREFIXES)):
            if candidate in cls.model_fields:
                values[candidate] = value
                break
    for name, value in list(values.items()):
        try:
            values[name] = TypeAdapter(cls.model_fields[name].annotation).validate_python(value)
        except Exception:  # noqa: BLE001 - left as given: a bad value is the settings' own check
            pass
    return cls.model_construct(**values)


def listener(command: str, s: Any) -> tuple[str, int] | None:
    """(host, port) the process serves HTTP on, or None (no server, or turned off with port 0)."""
    if command not in LISTENERS:
        return None
    host_field, port_field, _ = LISTENERS[command]
    if not hasattr(s, port_field):  # this build of the process has no such setting: it serves nothing
        return None
    port = int(getattr(s, port_field))
    return (str(getattr(s, host_field)), port) if port else None


@lru_cache(maxsize=None)
def get_routes(command: str) -> frozenset[str]:
    """The GET paths the process answers (read from the module that routes them)."""
    path = ROOT / LISTENERS[command][2]
    text = path.read_text() if path.exists() else ""
    return frozenset(re.findall(r'add_get\(\s*"(/[^"]*)"', text) + re.findall(r'path == "(/[^"]*)"', text))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def kafka_needs(command: str, s: Any) -> list[tuple[str, str, str]]:
    """(resource type, name, operation) the process needs on Kafka, derived from the code's own names."""
    from foundation.config import Topics

    t = Topics(s.topic_prefix)
    follow = [("topic", t.resources, "Read"), ("group", FOLLOWER_GROUP, "Describe")]
    if command in ("gateway", "proxy"):
        return [("topic", t.spans, "Write")]
    if command == "run-agent":
        return [("topic", t.tasks, "Read"), ("group", s.runner_group, "Read"), ("topic", t.spans, "Write"),
                ("topic", t.dlq, "Write"), *follow]
    if command == "process":
        from streams.app import done_topic_name
        from streams.spans_stage import span_group, state_topic_name

        app_id = s.application_id
        worker = _faust_worker(app_id, t.prefix)
        owned = [done_topic_name(t.prefix), state_topic_name(app_id), *worker.table_changelogs(),
                 worker.app._leader_assignor._leader_topic_name]
        needs = [("topic", name, "Describe") for name in t.all()]  # `process` checks the design's topics exist
        needs += [("topic", t.spans, "Read"), ("topic", t.batches, "Write"), ("topic", t.dlq, "Read"),
                  ("topic", t.dlq, "Write"), ("topic", t.resources, "Read"), ("topic", t.metrics, "Read")]
        needs += [("topic", name, op) for name in owned for op in ("Read", "Write", "Create")]
        # faust's group is its app id; the span stage's, and its restore reader's (streams/spans_stage.py).
        needs += [("group", g, "Read") for g in (worker.app.conf.id, span_group(app_id), f"{span_group(app_id)}-restore")]
        return needs
    if command == "train":
        needs = [("topic", t.batches, "Read"), ("group", s.resolved_group(), "Read"), ("topic", t.resources, "Write"),
                 ("topic", t.metrics, "Write"), ("topic", t.dlq, "Write"), *follow]
        if s.validation_tasks is not None:  # the validation set goes out as mode-test tasks (trainer/loop.py)
            needs.append(("topic", t.tasks, "Write"))
        return needs
    if command == "serve":
        return follow if s.serve_follow else []
    if command == "optimize-prompt":
        return [("topic", t.resources, "Write"), ("topic", t.tasks, "Write"), *follow]
    if command == "tasks":
        return [("topic", t.tasks, "Write")]
    return []


@lru_cache(maxsize=None)
def _faust_worker(app_id: str, prefix: str) -> Any:
    """The stream worker's faust app, built offline, to ask it the names of the topics it creates."""
    from streams.app import Config, Worker

    cfg = Config(app_id=app_id, broker="kafka://127.0.0.1:9", topic_prefix=prefix, partitions=1,
                 datadir=tempfile.mkdtemp(prefix="rolloutbus-validate-"))
    return Worker(cfg, None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- containers of compose and k8s


def _k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command and args (``$$`` escapes; unknown names stay)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _compose_expand(text: str) -> str:
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


def load_compose(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=_ComposeLoader) or {}  # noqa: S506 - a SafeLoader subclass


def _compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): _compose_expand(str(v)) for k, v in env.items()}


def _is_rolloutbus_image(image: Any) -> bool:
    return "rolloutbus" in str(image).lower()


def compose_containers(doc: dict[str, Any], name: str, base: dict[str, Any] | None = None) -> list[Container]:
    """Services of a compose file that run the rolloutbus image with a command (``base``: the file it
    is layered on, where an override's services take their image from)."""
    out = []
    for svc, s in (doc.get("services") or {}).items():
        image = s.get("image") or ((base or {}).get("services", {}).get(svc) or {}).get("image")
        if not _is_rolloutbus_image(image) or not s.get("command"):
            continue
        cmd = s["command"]
        argv = shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]
        out.append(Container(f"{name}: service {svc}", [_compose_expand(a) for a in argv], _compose_env(s), "compose", spec=s))
    return out


def _pod_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = obj.get("spec", {})
    if obj.get("kind") in WORKLOADS:
        yield "", spec.get("template", {})
    if obj.get("kind") == "RayJob":
        cluster = spec.get("rayClusterSpec", {})
        yield " head", cluster.get("headGroupSpec", {}).get("template", {})
        for group in cluster.get("workerGroupSpecs", []):
            yield f" worker group {group.get('groupName')}", group.get("template", {})


def _k8s_env(c: dict[str, Any], objs: list[dict[str, Any]]) -> dict[str, str]:
    maps = {o["metadata"]["name"]: o.get("data") or {} for o in objs if o.get("kind") == "ConfigMap"}
    env: dict[str, str] = {}
    for src in c.get("envFrom") or []:
        ref = src.get("configMapRef")
        if ref:
            env.update({src.get("prefix", "") + k: str(v) for k, v in maps.get(ref["name"], {}).items()})
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = _k8s_expand(str(e["value"]), env)
        elif (e.get("valueFrom") or {}).get("configMapKeyRef"):
            ref = e["valueFrom"]["configMapKeyRef"]
            env[e["name"]] = str(maps.get(ref["name"], {}).get(ref["key"], ""))
        else:
            env[e["name"]] = f"<{next(iter(e.get('valueFrom') or {'unset': 0}))}>"
    return env


def k8s_containers(objs: list[dict[str, Any]], name: str) -> list[Container]:
    """Every container running the rolloutbus image with args, and each RayJob's entrypoint."""
    out = []
    for o in objs:
        for where, template in _pod_templates(o):
            for c in template.get("spec", {}).get("containers", []):
                if not _is_rolloutbus_image(c.get("image")) or not (c.get("args") or c.get("command")):
                    continue
                env = _k8s_env(c, objs)
                argv = [_k8s_expand(str(a), env) for a in (c.get("command") or [])[1:] + (c.get("args") or [])]
                out.append(Container(f"{name}: {o['kind']}/{o['metadata']['name']}{where} container {c['name']}",
                                     argv, env, o["kind"], o, template, c))
        if o.get("kind") == "RayJob":
            head = o["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
            c = head["spec"]["containers"][0]
            env = _k8s_env(c, objs)
            words = shlex.split(str(o["spec"].get("entrypoint", "")))
            argv = [_k8s_expand(w, env) for w in words[1:]] if words[:1] == ["rolloutbus"] else ["<not rolloutbus>", *words]
            out.append(Container(f"{name}: RayJob/{o['metadata']['name']} entrypoint", argv, env, "RayJob", o, head, c))
    return out


# --------------------------------------------------------------------------- the checks


def check_command(c: Container) -> tuple[argparse.Namespace | None, list[str]]:
    """Rules 1 and 2 for one container: its command parses; its ROLLOUTBUS_* names exist."""
    problems = [f"{c.where}: {name} is not a setting of any rolloutbus process (no settings field, alias or "
                f"os.environ read has that name)" for name in sorted(c.env) if name.startswith(PREFIX) and name not in known_variables()]
    ns, error = parse(c.argv)
    if error:
        problems.append(f"{c.where}: `rolloutbus {shlex.join(c.argv)}` does not parse: {error}")
    return ns, problems


def check_env_names(where: str, names: list[str]) -> list[str]:
    return [f"{where}: {n} is not a setting of any rolloutbus process" for n in sorted(names)
            if n.startswith(PREFIX) and n not in known_variables()]


def _volumes(template: dict[str, Any], obj: dict[str, Any]) -> dict[str, str]:
    """volume name → what backs it: 'pvc:<claim>', 'template', 'emptyDir', 'secret', ..."""
    out = {t["metadata"]["name"]: "template" for t in obj.get("spec", {}).get("volumeClaimTemplates", []) or []}
    for v in template.get("spec", {}).get("volumes", []) or []:
        kind = next((k for k in v if k != "name"), "?")
        out[v["name"]] = f"pvc:{v['persistentVolumeClaim']['claimName']}" if kind == "persistentVolumeClaim" else kind
    return out


def _under(path: str, mount: str) -> bool:
    p, m = PurePosixPath(path), PurePosixPath(mount)
    return p == m or m in p.parents


def _data_dir(ns: argparse.Namespace, env: dict[str, str]) -> str | None:
    return getattr(ns, "data_dir", None) or env.get("ROLLOUTBUS_DATA_DIR")


def check_k8s_spool(c: Container, ns: argparse.Namespace, objs: list[dict[str, Any]]) -> list[str]:
    """Rule 5 (k8s): <data dir>/spool of a span producer sits on a PVC (a template, or RWX when shared)."""
    data_dir = _data_dir(ns, c.env)
    if not data_dir:
        return [f"{c.where}: {ns.command} spools spans under <data dir>/spool: set ROLLOUTBUS_DATA_DIR to a persistent volume"]
    spool = str(PurePosixPath(data_dir) / "spool")
    volumes = _volumes(c.template, c.obj)
    mounts = [m for m in c.spec.get("volumeMounts", []) or [] if _under(spool, m["mountPath"])]
    if not mounts:
        return [f"{c.where}: its spool {spool} is on the container's writable layer (lost on restart): mount a "
                f"PersistentVolumeClaim there (StatefulSet volumeClaimTemplates)"]
    mount_name = max(mounts, key=lambda m: len(m["mountPath"]))["name"]
    backing = volumes.get(mount_name, "?")
    if backing == "template":
        return []
    if backing.startswith("pvc:"):
        claim = next((o for o in objs if o.get("kind") == "PersistentVolumeClaim" and o["metadata"]["name"] == backing[4:]), None)
        replicas = c.obj.get("spec", {}).get("replicas", 1)
        shared = replicas > 1 or any(o.get("kind") == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"] == c.obj["metadata"]["name"] for o in objs)
        if shared and (claim is None or "ReadWriteMany" not in claim["spec"].get("accessModes", [])):
            return [f"{c.where}: its spool is on claim {backing[4:]}, which several pods share: use volumeClaimTemplates (one volume per pod)"]
        return []
    return [f"{c.where}: its spool {spool} is on volume {mount_name!r} ({backing}), gone with the pod: use a PersistentVolumeClaim"]


def check_compose_spool(c: Container, ns: argparse.Namespace, doc: dict[str, Any]) -> list[str]:
    """Rule 5 (compose): <data dir>/spool is on a named volume or a bind mount."""
    data_dir = _data_dir(ns, c.env)
    if not data_dir:
        return [f"{c.where}: set ROLLOUTBUS_DATA_DIR and put <data dir>/spool on a volume"]
    spool = str(PurePosixPath(data_dir) / "spool")
    for v in c.spec.get("volumes", []) or []:
        if isinstance(v, str):
            parts = _compose_expand(v).split(":")
            source, target = (parts[0], parts[1]) if len(parts) > 1 else ("", parts[0])
        else:
            source, target = str(v.get("source", "")), str(v.get("target", ""))
        if source and _under(spool, target):
            return []
    return [f"{c.where}: its spool {spool} is on the container's writable layer (lost with the container): mount a named volume there"]


def check_kafka_user(c: Container, ns: argparse.Namespace, s: Any, objs: list[dict[str, Any]]) -> list[str]:
    """Rule 3: the container's KafkaUser exists, its Secret is that user's, its ACLs cover the process."""
    from foundation.kafka_admin import acl_allows, kafka_user_acls

    needs = kafka_needs(ns.command, s)
    if not needs or not str(c.env.get("ROLLOUTBUS_KAFKA_SECURITY_PROTOCOL", "")).upper().startswith("SASL"):
        return []
    user = c.env.get("ROLLOUTBUS_KAFKA_SASL_USERNAME")
    if not user:
        return [f"{c.where}: connects with SASL but sets no ROLLOUTBUS_KAFKA_SASL_USERNAME (its KafkaUser)"]
    users = {o["metadata"]["name"]: o for o in objs if o.get("kind") == "KafkaUser"}
    if user not in users:
        return [f"{c.where}: Kafka user {user!r} has no KafkaUser (have {sorted(users)})"]
    problems = []
    secret = next((e["valueFrom"]["secretKeyRef"] for e in c.spec.get("env", []) or []
                   if e["name"] == "ROLLOUTBUS_KAFKA_SASL_PASSWORD" and (e.get("valueFrom") or {}).get("secretKeyRef")), None)
    if secret is None or secret.get("name") != user:
        problems.append(f"{c.where}: ROLLOUTBUS_KAFKA_SASL_PASSWORD must come from Secret {user!r} (Strimzi's, of KafkaUser {user}), "
                        f"not {secret.get('name') if secret else 'nowhere'}")
    acls = kafka_user_acls(users[user])
    for kind, name, op in needs:
        if not acl_allows(acls, kind, name, op):
            problems.append(f"{c.where}: `rolloutbus {ns.command}` needs {op} on {kind} {name}, which KafkaUser {user}'s ACLs do not allow")
    return problems


def _port_of(c: dict[str, Any], ref: Any) -> int | None:
    """A container port by name or number (None: the container declares no such port)."""
    for p in c.get("ports", []) or []:
        if ref in (p.get("name"), p.get("containerPort")):
            return int(p["containerPort"])
    return int(ref) if isinstance(ref, int) else None


def _served(c: Container, ns: argparse.Namespace, s: Any, port: int | None, what: str) -> list[str]:
    served = listener(ns.command, s)
    if served is None:
        return [f"{what}: `rolloutbus {ns.command}` serves no HTTP port (or has it turned off)"]
    host, number = served
    problems = []
    if port != number:
        problems.append(f"{what}: reaches port {port}, but `rolloutbus {ns.command}` serves {number}")
    if _loopback(host):
        problems.append(f"{what}: `rolloutbus {ns.command}` binds {host}, which nothing outside the pod reaches: "
                        f"set {LISTENERS[ns.command][0]} to 0.0.0.0")
    return problems


def check_probes(c: Container, ns: argparse.Namespace, s: Any) -> list[str]:
    """Rule 4, probes: HTTP readiness and liveness on a served port and a real GET route."""
    problems = []
    for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe = c.spec.get(probe_name)
        if probe is None:
            if probe_name != "startupProbe" and ns.command in LISTENERS and c.kind in LONG_RUNNING:
                problems.append(f"{c.where}: no {probe_name} (use an HTTP probe on one of {sorted(get_routes(ns.command))})")
            continue
        if "httpGet" not in probe:
            problems.append(f"{c.where}: {probe_name} is not an HTTP probe; `rolloutbus {ns.command}` answers "
                            f"{sorted(get_routes(ns.command)) if ns.command in LISTENERS else 'no HTTP'}")
            continue
        get = probe["httpGet"]
        what = f"{c.where}: {probe_name}"
        problems += _served(c, ns, s, _port_of(c.spec, get.get("port")), what)
        if ns.command in LISTENERS and get.get("path", "/") not in get_routes(ns.command):
            problems.append(f"{what}: path {get.get('path')} is not a GET route of `rolloutbus {ns.command}` ({sorted(get_routes(ns.command))})")
    return problems


def check_services(containers: list[tuple[Container, argparse.Namespace, Any]], objs: list[dict[str, Any]], name: str) -> list[str]:
    """Rule 4, Services: each port reaches a port the selected rolloutbus process serves."""
    problems = []
    for svc in (o for o in objs if o.get("kind") == "Service"):
        selector = svc.get("spec", {}).get("selector") or {}
        chosen = [(c, ns, s) for c, ns, s in containers if _selects(svc, c)]
        for c, ns, s in chosen:
            for p in svc["spec"].get("ports", []):
                target = p.get("targetPort", p["port"])
                port = _port_of(c.spec, target)
                what = f"{name}: Service/{svc['metadata']['name']} port {p.get('name', p['port'])}"
                if port is None:
                    problems.append(f"{what}: targetPort {target!r} is no port of {c.where.split(': ', 1)[1]}")
                    continue
                problems += _served(c, ns, s, port, what)
    return problems


def check_upstream(c: Container, ns: argparse.Namespace, s: Any, services: dict[str, set[int]], what: str) -> list[str]:
    """Rule 6: the proxy forwards to a Service / compose service that exists (or to a host outside)."""
    if ns.command != "proxy":
        return []
    url = getattr(ns, "upstream", None) or s.proxy_upstream
    if not url:
        return [f"{c.where}: the proxy has no upstream (--upstream / ROLLOUTBUS_PROXY_UPSTREAM)"]
    parsed = urlparse(str(url))
    host = parsed.hostname or ""
    first = host.split(".")[0]
    if "." in host and ".svc" not in host:
        return []  # a host outside the cluster / compose project: not ours to check
    if first not in services:
        return [f"{c.where}: the proxy forwards to {url}, but there is no {what} {first!r} (its policy server)"]
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if services[first] and port not in services[first]:
        return [f"{c.where}: the proxy forwards to port {port} of {what} {first!r}, which offers {sorted(services[first])}"]
    return []


def check_proxy_url(c: Container, ns: argparse.Namespace, proxies: dict[str, set[int]], what: str) -> list[str]:
    """Rule 7: a runner's agents reach the proxy through ROLLOUTBUS_LLM_PROXY_URL, never a bare /v1."""
    if ns.command != "run-agent":
        return []
    problems = []
    for var in ("OPENAI_BASE_URL", "OPENAI_API_BASE"):
        url = c.env.get(var)
        if url and (urlparse(url).hostname or "").split(".")[0] in proxies:
            problems.append(f"{c.where}: {var}={url} points at the LLM proxy, which serves only "
                            "/rollout/<rollout id>/attempt/<attempt id>/v1/... (a bare /v1 is a 404): set ROLLOUTBUS_LLM_PROXY_URL "
                            "to the proxy's base URL and let the agent build each attempt's URL (producers.proxy.proxy_url)")
    url = c.env.get("ROLLOUTBUS_LLM_PROXY_URL")
    if not url:
        return problems + [f"{c.where}: sets no ROLLOUTBUS_LLM_PROXY_URL, the LLM proxy's base URL its agents call through"]
    parsed = urlparse(url)
    host = (parsed.hostname or "").split(".")[0]
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if host not in proxies:
        problems.append(f"{c.where}: ROLLOUTBUS_LLM_PROXY_URL={url} names no {what} that runs `rolloutbus proxy` ({sorted(proxies)})")
    elif proxies[host] and port not in proxies[host]:
        problems.append(f"{c.where}: ROLLOUTBUS_LLM_PROXY_URL={url}: {what} {host!r} offers {sorted(proxies[host])}, not {port}")
    elif parsed.path.rstrip("/"):
        problems.append(f"{c.where}: ROLLOUTBUS_LLM_PROXY_URL={url} must be the proxy's base URL (no path): agents append /rollout/...")
    return problems


# command: (its listen-host field, its credential field, the variable to set) — the process refuses to
# listen on a non-loopback address without that credential unless --insecure (foundation/exposure.py).
EXPOSED = {
    "gateway": ("gateway_host", "gateway_token", "ROLLOUTBUS_GATEWAY_TOKEN"),
    "proxy": ("proxy_host", "proxy_token", "ROLLOUTBUS_PROXY_TOKEN"),
    "serve": ("serve_host", "serve_token", "ROLLOUTBUS_SERVE_TOKEN"),
    "dashboard": ("dashboard_host", "dashboard_token", "ROLLOUTBUS_DASHBOARD_TOKEN"),
    "store": ("store_host", "store_users", "ROLLOUTBUS_STORE_USERS"),
}


METRICS_TOKEN = "ROLLOUTBUS_METRICS_TOKEN"
# Commands whose health server (foundation/health.py) serves /metrics: with METRICS_TOKEN it answers only
# that bearer token; without it, bound beyond loopback, it answers anyone (the process only logs a WARNING).
METRICS_SERVERS = ("process", "train")


def _metrics_token(c: Container, s: Any) -> bool:
    return bool(c.env.get(METRICS_TOKEN) or getattr(s, "metrics_token", None))


def has_credential(c: Container, ns: argparse.Namespace, s: Any, port: int | None = None) -> bool:
    """Whether the process asks every client for a credential (on ``port``, when its listener is that one)."""
    if ns.command in EXPOSED:
        credential = getattr(s, EXPOSED[ns.command][1], None)
        if ns.command == "store":
            try:
                return bool(credential) and bool(s.has_credentials())
            except Exception:  # noqa: BLE001 - users that do not parse are the store's own error
                return False
        return bool(credential)
    if ns.command in METRICS_SERVERS:
        served = listener(ns.command, s)
        return served is not None and (port is None or port == served[1]) and _metrics_token(c, s)
    return False


def check_exposure(c: Container, ns: argparse.Namespace, s: Any) -> list[str]:
    """Rule 8: a server on a non-loopback address has its credential (or says --insecure): else it would
    not start, or (metrics) would answer anyone."""
    if ns.command in METRICS_SERVERS:
        served = listener(ns.command, s)
        if served is None or _loopback(served[0]) or _metrics_token(c, s):
            return []
        return [f"{c.where}: `{ns.command}` serves /metrics on {served[0]}:{served[1]} without {METRICS_TOKEN}: anyone "
                "who reaches that address reads it (set the variable from a Secret, e.g. rolloutbus-http key "
                "metrics-token, and scrape with its bearer token; or bind 127.0.0.1)"]
    if ns.command not in EXPOSED:
        return []
    host_field, credential, variable = EXPOSED[ns.command]
    host = str(getattr(s, host_field, "127.0.0.1"))
    if _loopback(host) or getattr(s, credential, None) or getattr(s, "insecure", False):
        return []
    return [f"{c.where}: `{ns.command}` listens on {host} without {variable}: it refuses to start "
            "(set the variable from a Secret, or pass --insecure on purpose)"]


# --------------------------------------------------------------------------- rule 9: published ports

EVERY_INTERFACE = {"", "0.0.0.0", "::", "*"}


def published_ports(service: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(host address, host port, container port) of each published port, with the file's defaults;
    host address "" means every interface (what compose and podman do when none is given)."""
    out = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            ip, host, target = (_compose_expand(str(p.get(k, ""))) for k in ("host_ip", "published", "target"))
        else:
            text, ip = _compose_expand(str(p)).split("/")[0], ""
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


def _kafka_listener(env: dict[str, str], port: int) -> tuple[str, str] | None:
    """(listener name, security protocol) of the broker's listener on ``port``, or None."""
    protocols = dict(x.strip().split(":", 1) for x in env.get("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "").split(",") if ":" in x)
    for item in env.get("KAFKA_LISTENERS", "").split(","):
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)://[^,]*:(\d+)\s*$", item)
        if m and int(m.group(2)) == port:
            return m.group(1), protocols.get(m.group(1), m.group(1)).upper()
    return None


def _unguarded(spec: dict[str, Any], port: int, rb: tuple[Container, argparse.Namespace, Any] | None) -> str | None:
    """Why the service's ``port`` lets anyone in (None: it asks for credentials)."""
    env = _compose_env(spec)
    if rb is not None:
        c, ns, s = rb
        if has_credential(c, ns, s, port):
            return None
        if ns.command in EXPOSED:
            return f"`rolloutbus {ns.command}` has no {EXPOSED[ns.command][2]} (or a user without a password)"
        if ns.command in METRICS_SERVERS:
            return f"`rolloutbus {ns.command}` serves /metrics without {METRICS_TOKEN}"
        return f"`rolloutbus {ns.command}` asks no credentials"
    if "KAFKA_LISTENERS" in env:
        found = _kafka_listener(env, port)
        if found is None:
            return f"no Kafka listener is on port {port}"
        name, protocol = found
        client_auth = env.get(f"KAFKA_LISTENER_NAME_{name.upper()}_SSL_CLIENT_AUTH", env.get("KAFKA_SSL_CLIENT_AUTH", ""))
        if protocol.startswith("SASL_") or (protocol == "SSL" and client_auth == "required"):
            return None
        return f"its Kafka listener {name} is {protocol}: anyone may produce and consume (use SASL_SSL or SASL_PLAINTEXT)"
    if "clickhouse-server" in str(spec.get("image", "")):
        passwords = {k: v for k, v in env.items() if "PASSWORD" in k}
        if "CLICKHOUSE_PASSWORD" in passwords and all(passwords.values()) and env.get("CLICKHOUSE_SKIP_USER_SETUP") != "1":
            return None
        return "a ClickHouse user there may have no password (interpolate each from a required variable, ${VAR:?...})"
    return "nothing there asks for credentials"


def check_published_ports(doc: dict[str, Any], name: str, parsed: list[tuple[Container, argparse.Namespace, Any]],
                          base: dict[str, Any] | None = None) -> list[str]:
    """Rule 9: what compose publishes on every host interface asks for credentials. In an override, the
    services whose ports or command it changes are checked as merged with ``base``."""
    by_service = {c.where.rsplit(" ", 1)[1]: (c, ns, s) for c, ns, s in parsed}
    problems = []
    for svc, spec in (doc.get("services") or {}).items():
        if base is not None:
            if "ports" not in spec and "command" not in spec:
                continue
            under = (base.get("services") or {}).get(svc) or {}
            spec = {**under, **spec, "environment": {**_compose_env(under), **_compose_env(spec)}}
        for ip, host, target in published_ports(spec):
            if ip not in EVERY_INTERFACE:
                continue
            why = _unguarded(spec, target, by_service.get(svc))
            if why:
                problems.append(
                    f"{name}: service {svc} publishes port {target} on every host interface "
                    f"({ip or '*'}:{host or 'any'}), but {why}: publish it on 127.0.0.1 "
                    f"(\"${{..._BIND:-127.0.0.1}}:{host or target}:{target}\") and open it only with credentials in place")
    return problems


def check_k8s(objs: list[dict[str, Any]], name: str) -> list[str]:
    """Every rule for one rendered kustomization."""
    problems: list[str] = []
    for o in objs:
        if o.get("kind") == "ConfigMap":
            problems += check_env_names(f"{name}: ConfigMap/{o['metadata']['name']}", list((o.get("data") or {}).keys()))
    parsed = []
    for c in k8s_containers(objs, name):
        ns, found = check_command(c)
        problems += found
        if ns is None:
            continue
        s = settings_for(ns.command, ns, c.env)
        parsed.append((c, ns, s))
        problems += check_kafka_user(c, ns, s, objs)
        problems += check_exposure(c, ns, s)
        if c.kind != "RayJob":
            problems += check_probes(c, ns, s)
            if ns.command in SPOOLERS:
                problems += check_k8s_spool(c, ns, objs)
    problems += check_services(parsed, objs, name)
    problems += analyst.check_k8s(objs, name)
    services = {o["metadata"]["name"]: {int(p["port"]) for p in o["spec"].get("ports", [])} for o in objs if o.get("kind") == "Service"}
    proxies = {svc["metadata"]["name"]: services[svc["metadata"]["name"]] for svc in objs if svc.get("kind") == "Service"
               and any(ns.command == "proxy" and _selects(svc, c) for c, ns, _ in parsed)}
    for c, ns, s in parsed:
        problems += check_upstream(c, ns, s, services, "Service")
        problems += check_proxy_url(c, ns, proxies, "Service")
    return problems


def _selects(svc: dict[str, Any], c: Container) -> bool:
    selector = svc.get("spec", {}).get("selector") or {}
    labels = c.template.get("metadata", {}).get("labels") or {}
    return c.kind in WORKLOADS and bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_compose(path: Path, base: dict[str, Any] | None = None) -> list[str]:
    """Rules 1, 2, 5, 6, 8, 9 and 10 for a compose file (an override: its commands, variable names, published
    ports and ClickHouse users only)."""
    doc = load_compose(path)
    name = path.name
    problems: list[str] = []
    for svc, s in (doc.get("services") or {}).items():
        problems += check_env_names(f"{name}: service {svc}", list(_compose_env(s)))
    parsed = []
    for c in compose_containers(doc, name, base):
        ns, found = check_command(c)
        problems += [p for p in found if "is not a setting" not in p]  # names: reported per service above
        if ns is not None:
            parsed.append((c, ns, settings_for(ns.command, ns, c.env)))
    problems += check_published_ports(doc, name, parsed, base)
    problems += analyst.check_compose(doc, name, path.parent, base)
    if base is not None:
        return problems
    proxies = {c.where.rsplit(" ", 1)[1]: {listener("proxy", s)[1]} for c, ns, s in parsed  # type: ignore[index]
               if ns.command == "proxy" and listener("proxy", s)}
    for c, ns, s in parsed:
        problems += check_exposure(c, ns, s)
        if ns.command in SPOOLERS:
            problems += check_compose_spool(c, ns, doc)
        problems += check_upstream(c, ns, s, {k: set() for k in doc.get("services") or {}}, "compose service")
        problems += check_proxy_url(c, ns, proxies, "compose service")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kustomize", default="kubectl kustomize", help="command that renders a kustomization directory")
    parser.add_argument("--compose", action="append", type=Path, help="compose files (default: docker-compose.yml, then compose.local.yml layered on it)")
    parser.add_argument("--no-k8s", action="store_true", help="check the compose files only")
    args = parser.parse_args(argv)
    import k8s

    problems: list[str] = []
    files = args.compose or [p for p in COMPOSE_FILES if p.exists()]
    base = None
    for i, path in enumerate(files):
        problems += check_compose(path, base)
        if i == 0:
            base = load_compose(path)
    count = 0
    if not args.no_k8s:
        for directory in k8s.kustomizations():
            rel = str(directory.relative_to(k8s.K8S))
            try:
                objs = k8s.render(directory, shlex.split(args.kustomize))
            except ValueError as exc:
                problems.append(f"{rel}: {exc}")
                continue
            count += len(k8s_containers(objs, rel))
            problems += check_k8s(objs, rel)
    for p in problems:
        print(f"commands: {p}", file=sys.stderr)
    if not problems:
        print(f"commands: {len(files)} compose files and {count} k8s containers: every command parses with the rolloutbus CLI, "
              "every ROLLOUTBUS_* variable is a setting, Kafka users' ACLs cover their processes, ports and probes are served, spools persist, "
              "open addresses ask for credentials, the analyst account is read-only with a secret password")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
