"""The compose files read into a model: deploy/docker-compose.yml plus override files, merged.

Why not ``docker compose`` or podman-compose: neither is installed here, and against podman 4.3 (no
systemd, so podman runs no health checks) ``depends_on: condition: service_healthy`` would wait forever.
This module only reads; lifecycle.py runs the model with testcontainers (one container per replica, the
health checks as testcontainers wait strategies).

What it understands of the Compose Specification: ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
``${VAR:?error}``, ``${VAR?error}``, ``$$`` (from the environment, then ``.env`` beside the first file);
YAML anchors and ``<<`` merge keys; several files merged in order (mappings merged, ``ports`` and
``volumes`` merged by container path, ``environment`` by name, other lists replaced; ``!reset`` and
``!override``); ``image``, ``command``, ``entrypoint``, ``environment``, ``ports`` (a host port range is
handed out one port per replica), ``volumes`` (named and bind), ``depends_on`` with its three conditions,
``healthcheck``, ``restart``, ``deploy.replicas``, ``hostname``, ``user``, ``working_dir``,
``stop_grace_period``, ``shm_size``, ``ulimits``, ``profiles``. Names follow ``docker compose``:
containers ``<project>-<service>-<n>``, network ``<project>_default``, volumes ``<project>_<name>``.
``build`` is left to images.py (images are built by content hash before ``up``).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import HostError  # noqa: E402


class ComposeError(HostError):
    """The compose files are wrong, or a service did not come up; the message says which and why."""


# ------------------------------------------------------------------------------------------ loading


class Reset:
    """``!reset``: the key is removed from what the earlier files said."""


@dataclass
class Override:
    """``!override VALUE``: VALUE replaces what the earlier files said, unmerged."""

    value: Any


class _Loader(yaml.SafeLoader):
    pass


def _reset(loader: yaml.SafeLoader, node: yaml.Node) -> Reset:
    return Reset()


def _override(loader: yaml.SafeLoader, node: yaml.Node) -> Override:
    if isinstance(node, yaml.MappingNode):
        return Override(loader.construct_mapping(node, deep=True))
    if isinstance(node, yaml.SequenceNode):
        return Override(loader.construct_sequence(node, deep=True))
    return Override(loader.construct_scalar(node))


_Loader.add_constructor("!reset", _reset)
_Loader.add_constructor("!override", _override)

_BRACED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?$", re.S)


def _braced(inner: str, env: dict[str, str], where: str) -> str:
    """One ``${...}``: NAME, NAME:-default, NAME-default, NAME:?error, NAME?error, NAME:+alt, NAME+alt."""
    b = _BRACED.match(inner)
    if not b:
        raise ComposeError(f"{where}: invalid interpolation ${{{inner}}}")
    name, op, arg = b.group("name"), b.group("op"), b.group("arg") or ""
    val = env.get(name)
    unset_or_empty = val is None or (op is not None and op.startswith(":") and val == "")
    if op in ("-", ":-"):
        return interpolate(arg, env, where) if unset_or_empty else val  # type: ignore[return-value]
    if op in ("?", ":?"):
        if unset_or_empty:
            raise ComposeError(f"{where}: {interpolate(arg, env, where) or f'{name} is not set'}")
        return val  # type: ignore[return-value]
    if op in ("+", ":+"):
        return "" if unset_or_empty else interpolate(arg, env, where)
    return val or ""


def interpolate(value: Any, env: dict[str, str], where: str = "") -> Any:
    """Compose's variable substitution, on every string inside ``value``."""
    if isinstance(value, str):
        out, i = [], 0
        while i < len(value):
            c = value[i]
            if c != "$" or i + 1 == len(value):
                out.append(c)
                i += 1
                continue
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
            elif nxt == "{":
                depth, j = 1, i + 2
                while j < len(value) and depth:
                    depth += {"{": 1, "}": -1}.get(value[j], 0)
                    j += 1
                if depth:
                    raise ComposeError(f"{where}: unclosed interpolation in {value!r}")
                out.append(_braced(value[i + 2:j - 1], env, where))
                i = j
            else:
                m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", value[i + 1:])
                if m:
                    out.append(env.get(m.group(0), ""))
                    i += 1 + m.end()
                else:
                    out.append(c)
                    i += 1
        return "".join(out)
    if isinstance(value, Override):
        return Override(interpolate(value.value, env, where))
    if isinstance(value, dict):
        return {k: interpolate(v, env, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, where) for v in value]
    return value


def _env_mapping(value: Any) -> dict[str, str | None]:
    if value is None or isinstance(value, Reset):
        return {}
    if isinstance(value, dict):
        return {str(k): None if v is None else _scalar(v) for k, v in value.items()}
    out: dict[str, str | None] = {}
    for item in value:
        k, sep, v = str(item).partition("=")
        out[k] = v if sep else None
    return out


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _deps_mapping(value: Any) -> dict[str, dict[str, Any]]:
    if isinstance(value, list):
        return {str(d): {"condition": "service_started"} for d in value}
    return {str(k): dict(v or {"condition": "service_started"}) for k, v in (value or {}).items()}


def _target(kind: str, item: Any) -> str:
    """What identifies a ports/volumes entry when files are merged: the container side."""
    if isinstance(item, dict):
        return str(item.get("target"))
    s = str(item)
    if kind == "ports":
        return s.rsplit(":", 1)[-1]
    parts = s.split(":")
    return parts[1] if len(parts) > 1 else parts[0]


_BY_TARGET = ("ports", "volumes", "expose")
_AS_MAPPING = {"environment": _env_mapping, "labels": _env_mapping, "depends_on": _deps_mapping}


def merge(base: Any, over: Any, key: str = "") -> Any:
    """Merge ``over`` (a later file) into ``base`` following the Compose Specification."""
    if isinstance(over, Override):
        return over.value
    if isinstance(over, Reset):
        return Reset()
    if key in _AS_MAPPING and base is not None and not isinstance(base, Reset):
        norm = _AS_MAPPING[key]
        out = dict(norm(base))
        for k, v in norm(over).items():
            out[k] = merge(out.get(k), v, "") if isinstance(v, dict) else v
        return out
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(base.get(k), v, k)
        return out
    if key in _BY_TARGET and isinstance(base, list) and isinstance(over, list):
        out_list = [b for b in base if _target(key, b) not in {_target(key, o) for o in over}]
        return out_list + list(over)
    return over


def _strip_resets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_resets(v) for k, v in value.items() if not isinstance(v, Reset)}
    if isinstance(value, list):
        return [_strip_resets(v) for v in value if not isinstance(v, Reset)]
    if isinstance(value, Override):
        return _strip_resets(value.value)
    return value


def read_dotenv(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip().strip("'\"")
    return out


def duration(value: Any, default: float) -> float:
    """``10s``, ``1m30s``, ``500ms``, ``2h`` or a number of seconds."""
    if value is None:
        return default
    if isinstance(value, (int, float)):
        return float(value)
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|us|s|m|h)", str(value)):
        total += float(m.group(1)) * {"ms": 1e-3, "us": 1e-6, "s": 1, "m": 60, "h": 3600}[m.group(2)]
        pos = m.end()
    if pos != len(str(value)):
        raise ComposeError(f"not a duration: {value!r}")
    return total


# ------------------------------------------------------------------------------------------ the model


@dataclass
class Service:
    name: str
    spec: dict[str, Any]

    @property
    def image(self) -> str:
        img = self.spec.get("image")
        if not img:
            raise ComposeError(f"service {self.name} names no image")
        return str(img)

    @property
    def replicas(self) -> int:
        deploy = self.spec.get("deploy") or {}
        n = deploy.get("replicas", self.spec.get("scale", 1))
        return int(n)

    @property
    def depends_on(self) -> dict[str, dict[str, Any]]:
        return _deps_mapping(self.spec.get("depends_on"))

    @property
    def environment(self) -> dict[str, str]:
        return {k: v for k, v in _env_mapping(self.spec.get("environment")).items() if v is not None}

    @property
    def healthcheck(self) -> dict[str, Any] | None:
        hc = self.spec.get("healthcheck")
        if not hc or hc.get("disable") or hc.get("test") in (None, ["NONE"]):
            return None
        return hc

    def command(self) -> list[str]:
        cmd = self.spec.get("command")
        if cmd is None:
            return []
        return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


@dataclass
class Project:
    """The merged compose files of one project."""

    name: str
    directory: Path
    services: dict[str, Service]
    volumes: list[str]
    env: dict[str, str] = field(repr=False, default_factory=dict)

    @classmethod
    def load(cls, files: Iterable[Path], env: dict[str, str] | None = None, name: str | None = None,
             profiles: Iterable[str] = ()) -> Project:
        files = [Path(f).resolve() for f in files]
        directory = files[0].parent
        environ = {**read_dotenv(directory / ".env"), **(os.environ if env is None else env)}
        active = set(profiles) | set(filter(None, environ.get("COMPOSE_PROFILES", "").split(",")))
        merged: dict[str, Any] = {}
        for f in files:
            try:
                doc = yaml.load(f.read_text(), Loader=_Loader) or {}
            except yaml.YAMLError as exc:
                raise ComposeError(f"{f}: not valid YAML: {exc}") from exc
            doc = {k: v for k, v in doc.items() if not str(k).startswith("x-")}
            merged = merge(merged, interpolate(doc, environ, f.name))
        merged = _strip_resets(merged)
        services = {}
        for sname, spec in (merged.get("services") or {}).items():
            spec = spec or {}
            prof = spec.get("profiles")
            if prof and not (set(prof) & active):
                continue
            services[sname] = Service(sname, spec)
        for s in services.values():
            for dep in s.depends_on:
                if dep not in services:
                    raise ComposeError(f"service {s.name} depends on {dep}, which is not defined (or not in an active profile)")
        project = name or environ.get("COMPOSE_PROJECT_NAME") or merged.get("name") or directory.name
        return cls(str(project), directory, services, list((merged.get("volumes") or {}).keys()), environ)

    # ------------------------------------------------------------------ names

    @property
    def network(self) -> str:
        return f"{self.name}_default"

    def container(self, service: str, n: int = 1) -> str:
        return f"{self.name}-{service}-{n}"

    def containers(self, service: str) -> list[str]:
        return [self.container(service, i) for i in range(1, self.services[service].replicas + 1)]

    def volume(self, name: str) -> str:
        return f"{self.name}_{name}"

    # ------------------------------------------------------------------ one replica's container

    def _mounts(self, s: Service) -> dict[str, tuple[str, str]]:
        """source (a host path or this project's volume name) -> (target, mode)."""
        out: dict[str, tuple[str, str]] = {}
        for v in s.spec.get("volumes") or []:
            if isinstance(v, dict):
                src, dst, ro = v.get("source"), v["target"], bool(v.get("read_only"))
                kind = v.get("type", "volume")
            else:
                parts = str(v).split(":")
                if len(parts) == 1:
                    src, dst, mode = None, parts[0], ""
                else:
                    src, dst, mode = parts[0], parts[1], (parts[2] if len(parts) > 2 else "")
                ro = "ro" in mode.split(",")
                kind = "bind" if src and (src.startswith(("/", ".", "~"))) else "volume"
            if src is None:
                raise ComposeError(f"service {s.name}: anonymous volume {dst}: name it under top-level volumes:")
            if kind == "bind":
                path = Path(os.path.expanduser(src))
                path = path if path.is_absolute() else (self.directory / path).resolve()
                if not path.exists():
                    raise ComposeError(f"service {s.name}: bind mount source {path} does not exist")
                src = str(path)
            else:
                if src not in self.volumes:
                    raise ComposeError(f"service {s.name} mounts volume {src}, not declared under top-level volumes:")
                src = self.volume(src)
            out[src] = (dst, "ro" if ro else "rw")
        return out

    def _ports(self, s: Service, n: int) -> dict[str, int | tuple[str, int] | None]:
        """container port -> host port (or (host address, port); None: any free port)."""
        out: dict[str, int | tuple[str, int] | None] = {}
        for p in s.spec.get("ports") or []:
            if isinstance(p, dict):
                host, target, ip = p.get("published"), p["target"], p.get("host_ip")
            else:
                parts = str(p).split(":")
                ip = parts[0] if len(parts) == 3 else None
                host = parts[-2] if len(parts) >= 2 else None
                target = parts[-1]
            target = str(target) if "/" in str(target) else f"{target}/tcp"
            if host is None:
                out[target] = None
                continue
            host = str(host)
            if "-" in host:  # a range: one port per replica
                lo, hi = (int(x) for x in host.split("-"))
                if lo + n - 1 > hi:
                    raise ComposeError(f"service {s.name}: replica {n} has no port left in {host}")
                host = str(lo + n - 1)
            elif s.replicas > 1:
                raise ComposeError(f"service {s.name} has {s.replicas} replicas but publishes the single host port {host}: "
                                   f"give a range (e.g. {host}-{int(host) + s.replicas - 1}:{target.split('/')[0]})")
            out[target] = (ip, int(host)) if ip else int(host)
        return out

    def replica(self, s: Service, n: int) -> Replica:
        """What replica ``n`` of ``s`` is created with (names and labels as ``docker compose`` gives them)."""
        spec = s.spec
        name = self.container(s.name, n)
        aliases = [s.name]
        if spec.get("hostname") and spec["hostname"] != s.name:
            aliases.append(str(spec["hostname"]))
        options: dict[str, Any] = {
            "hostname": str(spec.get("hostname") or name),
            "labels": {"com.docker.compose.project": self.name, "com.docker.compose.service": s.name,
                       "com.docker.compose.container-number": str(n)},
        }
        restart = spec.get("restart")
        if restart and restart != "no":
            options["restart_policy"] = {"Name": str(restart)}
        if spec.get("shm_size"):
            options["shm_size"] = str(spec["shm_size"])
        if spec.get("ulimits"):
            options["ulimits"] = [{"Name": limit, "Soft": int(v["soft"]), "Hard": int(v["hard"])} if isinstance(v, dict)
                                  else {"Name": limit, "Soft": int(v), "Hard": int(v)}
                                  for limit, v in spec["ulimits"].items()]
        if spec.get("user") is not None:
            options["user"] = str(spec["user"])
        if spec.get("working_dir"):
            options["working_dir"] = str(spec["working_dir"])
        if spec.get("entrypoint") is not None:
            ep = spec["entrypoint"]
            options["entrypoint"] = shlex.split(ep) if isinstance(ep, str) else [str(e) for e in ep]
        return Replica(name=name, service=s.name, image=s.image, command=s.command(), environment=s.environment,
                       ports=self._ports(s, n), volumes=self._mounts(s), aliases=aliases, options=options,
                       stop_grace_s=duration(spec.get("stop_grace_period"), 10))


@dataclass
class Replica:
    """One container of a service, as the Docker API creates it (``options``: docker-py's keyword names)."""

    name: str
    service: str
    image: str
    command: list[str]
    environment: dict[str, str]
    ports: dict[str, int | tuple[str, int] | None]
    volumes: dict[str, tuple[str, str]]
    aliases: list[str]
    options: dict[str, Any]
    stop_grace_s: float


__all__ = ["ComposeError", "Project", "Replica", "Service", "duration", "interpolate", "merge"]
