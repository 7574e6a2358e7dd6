"""A small Compose driver for podman: reads deploy/docker-compose.yml plus override files and runs them.

Why not podman-compose or ``docker compose`` against podman's API socket: podman 4.3 here has no systemd,
so podman's own health checks never run (its timers are systemd units), and ``depends_on: condition:
service_healthy`` would wait forever. This driver runs each health check itself (``podman exec`` of the
service's ``healthcheck.test``) while it brings the services up, and starts every service whose
dependencies are met at once (three KRaft brokers only become healthy together).

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

import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import HostError, podman  # noqa: E402

Say = Callable[[str], None]


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

    # ------------------------------------------------------------------ podman arguments

    def _mounts(self, s: Service) -> list[str]:
        args: list[str] = []
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
                args += ["-v", dst]  # anonymous
                continue
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
            args += ["-v", f"{src}:{dst}{':ro' if ro else ''}"]
        return args

    def _ports(self, s: Service, n: int) -> list[str]:
        args: list[str] = []
        for p in s.spec.get("ports") or []:
            if isinstance(p, dict):
                host, target, ip = p.get("published"), p["target"], p.get("host_ip")
            else:
                parts = str(p).split(":")
                ip = parts[0] if len(parts) == 3 else None
                host = parts[-2] if len(parts) >= 2 else None
                target = parts[-1]
            if host is None:
                args += ["-p", str(target)]
                continue
            host = str(host)
            if "-" in host:  # a range: one port per replica
                lo, hi = (int(x) for x in host.split("-"))
                if lo + n - 1 > hi:
                    raise ComposeError(f"service {s.name}: replica {n} has no port left in {host}")
                host = str(lo + n - 1)
            elif s.replicas > 1:
                raise ComposeError(f"service {s.name} has {s.replicas} replicas but publishes the single host port {host}: "
                                   f"give a range (e.g. {host}-{int(host) + s.replicas - 1}:{target})")
            args += ["-p", f"{ip + ':' if ip else ''}{host}:{target}"]
        return args

    def run_args(self, s: Service, n: int) -> list[str]:
        spec = s.spec
        name = self.container(s.name, n)
        args = ["run", "-d", "--name", name, "--network", self.network, "--network-alias", s.name,
                "--label", f"com.docker.compose.project={self.name}",
                "--label", f"com.docker.compose.service={s.name}",
                "--label", f"com.docker.compose.container-number={n}"]
        if spec.get("hostname"):
            args += ["--hostname", str(spec["hostname"])]
            if spec["hostname"] != s.name:
                args += ["--network-alias", str(spec["hostname"])]
        else:
            args += ["--hostname", name]
        restart = spec.get("restart")
        if restart and restart != "no":
            args += ["--restart", str(restart)]
        for k, v in s.environment.items():
            args += ["-e", f"{k}={v}"]
        args += self._ports(s, n) + self._mounts(s)
        if spec.get("stop_grace_period") is not None:
            args += ["--stop-timeout", str(int(duration(spec["stop_grace_period"], 10)))]
        if spec.get("shm_size"):
            args += ["--shm-size", str(spec["shm_size"])]
        for limit, v in (spec.get("ulimits") or {}).items():
            args += ["--ulimit", f"{limit}={v['soft']}:{v['hard']}" if isinstance(v, dict) else f"{limit}={v}"]
        if spec.get("user") is not None:
            args += ["--user", str(spec["user"])]
        if spec.get("working_dir"):
            args += ["--workdir", str(spec["working_dir"])]
        if spec.get("entrypoint") is not None:
            ep = spec["entrypoint"]
            args += ["--entrypoint", json.dumps(shlex.split(ep) if isinstance(ep, str) else [str(e) for e in ep])]
        return [*args, s.image, *s.command()]


# ------------------------------------------------------------------------------------------ running


def _inspect(names: list[str]) -> dict[str, dict[str, Any]]:
    if not names:
        return {}
    proc = podman("container", "inspect", *names, check=False)
    out: dict[str, dict[str, Any]] = {}
    if proc.stdout.strip():
        for c in json.loads(proc.stdout):
            out[c["Name"].lstrip("/")] = c
    return out


@dataclass
class Stack:
    """Bring a Project up and down with podman; ``say`` gets one line per step."""

    project: Project
    say: Say = print
    healthy: set[str] = field(default_factory=set)

    # -------------------------------------------------------------- state

    def state(self, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """name -> {status, exit_code, running, started_at} of this project's containers."""
        if names is None:
            proc = podman("ps", "-a", "--filter", f"label=com.docker.compose.project={self.project.name}",
                          "--format", "{{.Names}}")
            names = proc.stdout.split()
        return {n: {"status": c["State"]["Status"], "exit_code": c["State"]["ExitCode"],
                    "running": c["State"]["Running"], "started_at": c["State"].get("StartedAt"),
                    "restarts": c.get("RestartCount", 0)}
                for n, c in _inspect(names).items()}

    def check_health(self, container: str, hc: dict[str, Any]) -> bool:
        test = hc["test"]
        if isinstance(test, str):
            cmd = ["/bin/sh", "-c", test]
        elif test[0] == "CMD-SHELL":
            cmd = ["/bin/sh", "-c", " ".join(test[1:])]
        elif test[0] == "CMD":
            cmd = [str(t) for t in test[1:]]
        else:
            cmd = [str(t) for t in test]
        timeout = duration(hc.get("timeout"), 30)
        try:
            proc = podman("exec", container, *cmd, check=False, timeout=timeout + 5)
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0

    # -------------------------------------------------------------- up

    def ensure_network_and_volumes(self) -> None:
        if podman("network", "exists", self.project.network, check=False).returncode != 0:
            podman("network", "create", "--label", f"com.docker.compose.project={self.project.name}", self.project.network)
        for v in self.project.volumes:
            name = self.project.volume(v)
            if podman("volume", "exists", name, check=False).returncode != 0:
                podman("volume", "create", "--label", f"com.docker.compose.project={self.project.name}", name)

    def start_service(self, s: Service) -> None:
        existing = self.state(self.project.containers(s.name))
        for n in range(1, s.replicas + 1):
            name = self.project.container(s.name, n)
            st = existing.get(name)
            if st and st["running"]:
                continue
            if st:  # created or exited earlier (e.g. a one-shot that already ran): start it again
                if s.spec.get("restart", "no") == "no" and st["status"] == "exited" and st["exit_code"] == 0:
                    continue
                podman("start", name)
            else:
                podman(*self.project.run_args(s, n))
        self.say(f"started {s.name}" + (f" ×{s.replicas}" if s.replicas > 1 else ""))

    def _condition_met(self, dep: str, condition: str, deadline: dict[str, float]) -> bool:
        s = self.project.services[dep]
        names = self.project.containers(dep)
        st = self.state(names)
        if len(st) < len(names):
            return False
        if condition == "service_completed_successfully":
            for n in names:
                if st[n]["status"] == "exited" and st[n]["exit_code"] != 0:
                    raise ComposeError(f"{n} exited with {st[n]['exit_code']}:\n{self.logs(n, 30)}")
            return all(st[n]["status"] == "exited" for n in names)
        if condition == "service_healthy":
            hc = s.healthcheck
            if hc is None:
                raise ComposeError(f"{dep} is waited for as healthy but has no healthcheck")
            ok = True
            for n in names:
                if n in self.healthy:
                    continue
                if st[n]["restarts"] >= 3:
                    raise ComposeError(f"{n} restarted {st[n]['restarts']} times before it was healthy:\n{self.logs(n, 30)}")
                if not st[n]["running"]:
                    if st[n]["status"] == "exited" and s.spec.get("restart", "no") == "no":
                        raise ComposeError(f"{n} exited ({st[n]['exit_code']}) before it was healthy:\n{self.logs(n, 30)}")
                    ok = False
                    continue
                if self.check_health(n, hc):
                    self.healthy.add(n)
                    self.say(f"healthy {n}")
                else:
                    ok = False
            if not ok:
                limit = deadline.setdefault(dep, time.monotonic() + max(
                    120.0, duration(hc.get("start_period"), 0) + duration(hc.get("interval"), 30) * int(hc.get("retries", 3))))
                if time.monotonic() > limit:
                    bad = [n for n in names if n not in self.healthy]
                    raise ComposeError(f"{', '.join(bad)} not healthy in time:\n" + "\n".join(self.logs(n, 20) for n in bad))
            return ok
        return all(st[n]["running"] or st[n]["status"] == "exited" for n in names)

    def up(self, services: Iterable[str] | None = None, timeout: float = 900) -> float:
        """Start ``services`` (default all) and what they depend on, in dependency order. Returns seconds."""
        t0 = time.monotonic()
        self.healthy.clear()
        wanted = set(services or self.project.services)
        todo = list(wanted)
        while todo:  # add dependencies
            for dep in self.project.services[todo.pop()].depends_on:
                if dep not in wanted:
                    wanted.add(dep)
                    todo.append(dep)
        for s in wanted:
            self.project.services[s].image  # noqa: B018 - fails early, naming the service
            if podman("image", "exists", self.project.services[s].image, check=False).returncode != 0:
                raise ComposeError(f"image {self.project.services[s].image} of {s} does not exist: build it first "
                                   "(python deploy/containers/stack.py images)")
        self.ensure_network_and_volumes()
        pending = sorted(wanted)
        deadline: dict[str, float] = {}
        while pending:
            ready = [s for s in pending
                     if all(self._condition_met(d, c.get("condition", "service_started"), deadline)
                            for d, c in self.project.services[s].depends_on.items())]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda s: self.start_service(self.project.services[s]), ready))
            pending = [s for s in pending if s not in ready]
            if pending and not ready:
                if time.monotonic() - t0 > timeout:
                    raise ComposeError(f"up: still waiting after {timeout:.0f}s for: {', '.join(pending)}")
                time.sleep(1.0)
        return time.monotonic() - t0

    def wait_healthy(self, services: Iterable[str], timeout: float = 300) -> None:
        """Wait until every replica of ``services`` that has a health check passes it."""
        deadline: dict[str, float] = {}
        end = time.monotonic() + timeout
        pending = [s for s in services if self.project.services[s].healthcheck]
        while pending:
            pending = [s for s in pending if not self._condition_met(s, "service_healthy", deadline)]
            if pending:
                if time.monotonic() > end:
                    raise ComposeError(f"not healthy after {timeout:.0f}s: {', '.join(pending)}")
                time.sleep(1.0)

    # -------------------------------------------------------------- down and friends

    def down(self, volumes: bool = False, timeout: int | None = None) -> dict[str, float]:
        """Stop (SIGTERM, then SIGKILL after the service's stop_grace_period) and remove every container.

        Returns the seconds each container took to stop; those over 10 s are named (a process that ignores
        SIGTERM until its grace period ends)."""
        names = list(self.state())
        took: dict[str, float] = {}
        # As docker compose does: dependents first (runners ... workers, trainer), what they depend on last
        # (init, the store, the brokers), so every process stops with Kafka and ClickHouse still there.
        level: dict[str, int] = {}

        def depth(svc: str) -> int:
            if svc not in level:
                level[svc] = 0
                level[svc] = 1 + max((depth(d) for d in self.project.services[svc].depends_on), default=-1)
            return level[svc]

        by_service = {}
        for n in names:
            svc = next((s for s in self.project.services if n.startswith(f"{self.project.name}-{s}-")
                        and n[len(f"{self.project.name}-{s}-"):].isdigit()), None)
            by_service[n] = depth(svc) if svc else 0

        def stop(n: str) -> None:
            t0 = time.monotonic()
            podman("stop", *(["-t", str(timeout)] if timeout is not None else []), n, check=False, timeout=200)
            took[n] = round(time.monotonic() - t0, 1)

        if names:
            for lvl in sorted(set(by_service.values()), reverse=True):
                with concurrent.futures.ThreadPoolExecutor(16) as pool:
                    list(pool.map(stop, [n for n in names if by_service[n] == lvl]))
            podman("rm", "-f", "-v", *names, check=False)
            slow = {n: t for n, t in sorted(took.items(), key=lambda kv: -kv[1]) if t > 10}
            if slow:
                self.say(f"slow to stop on SIGTERM: {slow}")
        podman("network", "rm", "-f", self.project.network, check=False)
        if volumes:
            for v in self.project.volumes:
                podman("volume", "rm", "-f", self.project.volume(v), check=False)
        self.say(f"down: {len(names)} containers removed" + (", volumes removed" if volumes else ""))
        return took

    def kill(self, container: str, signal: str = "KILL") -> None:
        podman("kill", "--signal", signal, container)

    def start(self, container: str) -> None:
        podman("start", container)

    def stop(self, container: str, timeout: int = 10) -> None:
        podman("stop", "-t", str(timeout), container)

    def logs(self, container: str, tail: int = 50) -> str:
        proc = podman("logs", "--tail", str(tail), container, check=False)
        text = (proc.stdout or "") + (proc.stderr or "")
        return f"--- {container} (last {tail} lines)\n{text.rstrip()}"

    def exec(self, container: str, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return podman("exec", container, *cmd, check=False, timeout=timeout)

    def ps(self) -> list[tuple[str, str]]:
        return sorted((n, f"{st['status']}" + (f" ({st['exit_code']})" if st["status"] == "exited" else "")
                       + (f" healthy" if n in self.healthy else ""))
                      for n, st in self.state().items())


__all__ = ["ComposeError", "Project", "Service", "Stack", "duration", "interpolate", "merge"]
