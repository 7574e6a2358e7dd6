"""A compose Project's containers, run by testcontainers over podman's Docker-compatible API.

compose.py reads the files into a Project; this module runs it, inside ``engine()`` (podman's API on a
socket of its own, testcontainers pointed at it). Each replica is a testcontainers ``DockerContainer`` on
a testcontainers ``Network`` (``<project>_default``, the service name as alias). What ``depends_on``
waits for is a testcontainers wait strategy, because podman runs no health checks here (its timers are
systemd units, and this machine has no systemd):

- a health check that GETs ``http://127.0.0.1:PORT/PATH`` on a port the service publishes:
  ``HttpWaitStrategy`` on that published port (what a user outside reaches);
- a Kafka broker (its check runs Kafka's tools): ``LogMessageWaitStrategy`` for the line the broker logs
  once it serves, then the compose file's check, once, with ``ExecWaitStrategy`` (a JVM per try);
- any other health check: the compose file's command, with ``ExecWaitStrategy``;
- ``service_completed_successfully``: the one-shot's exit code, from the API's wait.

Each service starts in a thread of its own as soon as what it depends on is up (three KRaft brokers are
healthy only together); a service is up once its replicas pass their wait strategies, so ``up`` returns
with every health check passed.
Containers, the network and the volumes carry the ``com.docker.compose.project`` label, by which
``down`` finds them from any process. Testcontainers' reaper (Ryuk) is off: its image comes from a
registry this machine cannot reach; ``down`` (and the test's fixture, failed or not) removes what ``up``
made.
"""

from __future__ import annotations

import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors
from testcontainers.core.config import ConnectionMode, testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.docker_client import DockerClient
from testcontainers.core.network import Network
from testcontainers.core.wait_strategies import (CompositeWaitStrategy, ExecWaitStrategy, HttpWaitStrategy,
                                                 LogMessageWaitStrategy, WaitStrategy)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compose import ComposeError, Project, Replica, Service, duration  # noqa: E402
from host import api_socket  # noqa: E402

Say = Callable[[str], None]
PROJECT = "com.docker.compose.project"
SERVICE = "com.docker.compose.service"
KAFKA_READY = r"Kafka Server started"  # KafkaRaftServer, once the broker is unfenced and serves
_HTTP_CHECK = re.compile(r"http://(?:127\.0\.0\.1|localhost):(\d+)(/[^\s'\"]*)?")

Plan = list[tuple[Any, ...]]


@contextmanager
def engine() -> Iterator[None]:
    """podman's Docker API for the block, with testcontainers (and docker-py) pointed at it."""
    saved = (os.environ.get("DOCKER_HOST"), testcontainers_config.ryuk_disabled,
             testcontainers_config.connection_mode_override, testcontainers_config.tc_host_override)
    with api_socket() as url:
        os.environ["DOCKER_HOST"] = url
        testcontainers_config.ryuk_disabled = True  # testcontainers/ryuk cannot be pulled here
        # podman publishes on this host; /.dockerenv would make testcontainers look for a gateway address.
        testcontainers_config.connection_mode_override = ConnectionMode.docker_host
        testcontainers_config.tc_host_override = "127.0.0.1"
        try:
            yield
        finally:
            if saved[0] is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = saved[0]
            (testcontainers_config.ryuk_disabled, testcontainers_config.connection_mode_override,
             testcontainers_config.tc_host_override) = saved[1:]


# ------------------------------------------------------------------------------------------ waiting


def health_command(hc: dict[str, Any]) -> list[str]:
    """A compose ``healthcheck.test`` as the argv that runs it."""
    test = hc["test"]
    if isinstance(test, str):
        return ["/bin/sh", "-c", test]
    if test[0] == "CMD-SHELL":
        return ["/bin/sh", "-c", " ".join(test[1:])]
    return [str(t) for t in (test[1:] if test[0] == "CMD" else test)]


def wait_plan(s: Service, r: Replica) -> Plan:
    """How ``up`` knows a replica of ``s`` is healthy: ("http", port, path), ("log", regex), ("exec", argv)."""
    hc = s.healthcheck
    if hc is None:
        return []
    cmd = health_command(hc)
    http = _HTTP_CHECK.search(" ".join(cmd))
    if http and r.ports.get(f"{http.group(1)}/tcp") is not None:
        return [("http", int(http.group(1)), http.group(2) or "/")]
    if any("/opt/kafka/bin/" in c for c in cmd):
        return [("log", KAFKA_READY), ("exec", cmd)]
    return [("exec", cmd)]


def startup_timeout(s: Service) -> float:
    """As long as the compose check would take to declare the service unhealthy (2 minutes at least)."""
    hc = s.healthcheck or {}
    return max(120.0, duration(hc.get("start_period"), 0) + duration(hc.get("interval"), 30) * int(hc.get("retries", 3)))


def wait_strategy(plan: Plan, timeout: float) -> WaitStrategy | None:
    """The plan as testcontainers wait strategies, one after the other (None: nothing to wait for)."""
    steps: list[WaitStrategy] = []
    for kind, *args in plan:
        if kind == "http":
            steps.append(HttpWaitStrategy(args[0], args[1]).with_poll_interval(1))
        elif kind == "log":
            steps.append(LogMessageWaitStrategy(args[0]).with_poll_interval(2))
        else:
            steps.append(ExecWaitStrategy(args[0]).with_poll_interval(2))
    return CompositeWaitStrategy(*steps).with_startup_timeout(timeout) if steps else None


# ------------------------------------------------------------------------------------------ the stack


@dataclass
class Stack:
    """Bring a Project up and down (inside ``engine()``); ``say`` gets one line per step."""

    project: Project
    say: Say = print
    docker: Any = field(init=False, repr=False)  # docker-py's client, as testcontainers makes it
    # Set when `up` fails: its threads still bringing services up start no further container.
    _abandon: threading.Event = field(init=False, repr=False, default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.docker = DockerClient().client

    def state(self) -> dict[str, Any]:
        """name -> docker-py Container, for every container of this project."""
        found = self.docker.containers.list(all=True, filters={"label": f"{PROJECT}={self.project.name}"})
        return {c.name: c for c in found}

    # -------------------------------------------------------------- up

    def _network_and_volumes(self) -> Network:
        network = Network(docker_network_kw={"labels": {PROJECT: self.project.name}})
        network.name = self.project.network  # compose's name, not a random one: `down` finds it by name
        if not any(n.name == network.name for n in self.docker.networks.list(names=[network.name])):
            network.create()
        for v in self.project.volumes:
            name = self.project.volume(v)
            try:
                self.docker.volumes.get(name)
            except docker.errors.NotFound:
                self.docker.volumes.create(name, labels={PROJECT: self.project.name})
        return network

    def _container(self, r: Replica, network: Network) -> DockerContainer:
        c = DockerContainer(r.image, command=r.command or None, env=r.environment, name=r.name, network=network,
                            network_aliases=r.aliases, **r.options)
        for target, host in r.ports.items():
            c.ports[target] = host  # type: ignore[assignment] - docker-py also takes (address, port)
        for src, (dst, mode) in r.volumes.items():
            c.with_volume_mapping(src, dst, mode)
        return c

    def _start_service(self, s: Service, network: Network, until_done: bool) -> None:
        """Every replica started and, with a health check, waited for until it passes; ``until_done``: until it
        exits 0. A replica an earlier ``up`` started (running, or a one-shot that succeeded) is kept."""
        for n in range(1, s.replicas + 1):
            r = self.project.replica(s, n)
            try:
                old = self.docker.containers.get(r.name)
            except docker.errors.NotFound:
                old = None
            if old is not None and (old.status == "running" or (
                    old.status == "exited" and s.spec.get("restart", "no") == "no" and old.attrs["State"]["ExitCode"] == 0)):
                continue
            if self._abandon.is_set():
                raise ComposeError(f"{r.name} not started: `up` failed")
            if old is not None:  # stopped or failed earlier: made anew, as `docker compose up` recreates it
                old.remove(force=True, v=True)
            c = self._container(r, network)
            strategy = wait_strategy(wait_plan(s, r), startup_timeout(s))
            try:
                (c.waiting_for(strategy) if strategy else c).start()
            except Exception as exc:
                raise ComposeError(f"{r.name} did not come up: {str(exc)[:2000]}\n{self.logs(r.name, 30)}") from exc
            if strategy is not None:
                self.say(f"healthy {r.name}")
        self.say(f"started {s.name}" + (f" ×{s.replicas}" if s.replicas > 1 else ""))
        for name in self.project.containers(s.name) if until_done else []:
            code = self.docker.containers.get(name).wait()["StatusCode"]
            if code != 0:
                raise ComposeError(f"{name} exited with {code}:\n{self.logs(name, 30)}")

    def up(self, services: Iterable[str] | None = None, timeout: float = 900) -> float:
        """Start ``services`` (default all) and what they depend on; returns the seconds it took.

        A service starts as soon as what it depends on is up; it is up once its replicas pass their wait
        strategies (and, for one that another waits on to complete, once they exit 0)."""
        t0 = time.monotonic()
        wanted = set(services or self.project.services)
        todo = list(wanted)
        while todo:
            for dep in self.project.services[todo.pop()].depends_on:
                if dep not in wanted:
                    wanted.add(dep)
                    todo.append(dep)
        deps = {s: set(self.project.services[s].depends_on) for s in wanted}
        awaited = {(d, c.get("condition", "service_started")) for s in wanted
                   for d, c in self.project.services[s].depends_on.items()}
        for dep, cond in awaited:
            if cond == "service_healthy" and self.project.services[dep].healthcheck is None:
                raise ComposeError(f"{dep} is waited for as healthy but has no healthcheck")
        for s in sorted(wanted):
            try:
                self.docker.images.get(self.project.services[s].image)
            except docker.errors.ImageNotFound:
                raise ComposeError(f"image {self.project.services[s].image} of {s} does not exist: build it first "
                                   "(python deploy/containers/stack.py images)") from None
        network = self._network_and_volumes()
        # Daemon threads: a wait still running when `up` fails must not hold the process at its exit.
        results: queue.Queue[tuple[str, BaseException | None]] = queue.Queue()

        def bring_up(s: str) -> None:
            try:
                self._start_service(self.project.services[s], network, (s, "service_completed_successfully") in awaited)
                results.put((s, None))
            except BaseException as exc:  # noqa: BLE001 - raised by `up` below
                results.put((s, exc))

        running: set[str] = set()
        ready: set[str] = set()
        self._abandon.clear()
        try:
            while len(ready) < len(wanted):
                for s in sorted(wanted - ready - running):
                    if deps[s] <= ready:
                        threading.Thread(target=bring_up, args=(s,), name=f"up-{s}", daemon=True).start()
                        running.add(s)
                if not running:
                    raise ComposeError(f"up: circular depends_on among {', '.join(sorted(wanted - ready))}")
                try:
                    s, exc = results.get(timeout=max(0.0, timeout - (time.monotonic() - t0)))
                except queue.Empty:
                    raise ComposeError(f"up: still waiting after {timeout:.0f}s for: {', '.join(sorted(running))}") from None
                if exc is not None:
                    raise exc
                running.discard(s)
                ready.add(s)
        except BaseException:
            self._abandon.set()  # the services still coming up start no further container
            raise
        return time.monotonic() - t0

    # -------------------------------------------------------------- down and friends

    def down(self, volumes: bool = False, timeout: int | None = None) -> dict[str, float]:
        """Stop (SIGTERM, then SIGKILL after the service's stop_grace_period) and remove every container.

        Returns the seconds each container took to stop; those over 10 s are named (a process that ignores
        SIGTERM until its grace period ends)."""
        containers = self.state()
        took: dict[str, float] = {}
        # As docker compose does: dependents first (runners ... workers, trainer), what they depend on last
        # (init, the store, the brokers), so every process stops with Kafka and ClickHouse still there.
        level: dict[str, int] = {}

        def depth(svc: str) -> int:
            if svc not in level:
                level[svc] = 0
                level[svc] = 1 + max((depth(d) for d in self.project.services[svc].depends_on), default=-1)
            return level[svc]

        def service(c: Any) -> Service | None:
            return self.project.services.get(c.labels.get(SERVICE, ""))

        def stop(c: Any) -> None:
            s = service(c)
            grace = timeout if timeout is not None else duration(s.spec.get("stop_grace_period") if s else None, 10)
            t0 = time.monotonic()
            with suppress(docker.errors.APIError):
                c.stop(timeout=int(grace))
            took[c.name] = round(time.monotonic() - t0, 1)

        by_level: dict[int, list[Any]] = {}
        for c in containers.values():
            by_level.setdefault(depth(service(c).name) if service(c) else 0, []).append(c)
        for lvl in sorted(by_level, reverse=True):
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(stop, by_level[lvl]))
        # Then every container of the project, also one a failed `up`'s thread made while this ran.
        for c in [*containers.values(), *(c for n, c in self.state().items() if n not in containers)]:
            with suppress(docker.errors.NotFound):
                c.remove(force=True, v=True)
        slow = {n: t for n, t in sorted(took.items(), key=lambda kv: -kv[1]) if t > 10}
        if slow:
            self.say(f"slow to stop on SIGTERM: {slow}")
        for n in self.docker.networks.list(names=[self.project.network]):
            if n.name == self.project.network:
                n.remove()
        if volumes:
            for v in self.project.volumes:
                with suppress(docker.errors.NotFound):
                    self.docker.volumes.get(self.project.volume(v)).remove(force=True)
        self.say(f"down: {len(containers)} containers removed" + (", volumes removed" if volumes else ""))
        return took

    def kill(self, container: str, signal: str = "KILL") -> None:
        self.docker.containers.get(container).kill(signal)

    def start(self, container: str) -> None:
        self.docker.containers.get(container).start()

    def stop(self, container: str, timeout: int = 10) -> None:
        self.docker.containers.get(container).stop(timeout=timeout)

    def logs(self, container: str, tail: int = 50) -> str:
        try:
            text = self.docker.containers.get(container).logs(tail=tail).decode(errors="replace")
        except docker.errors.NotFound:
            text = "(no such container)"
        return f"--- {container} (last {tail} lines)\n{text.rstrip()}"

    def exec(self, container: str, *cmd: str) -> Any:
        """``cmd`` run in ``container``: docker-py's ExecResult (exit_code, output: stdout and stderr)."""
        return self.docker.containers.get(container).exec_run(list(cmd))

    def ps(self) -> list[tuple[str, str]]:
        return sorted((n, c.status + (f" ({c.attrs['State']['ExitCode']})" if c.status == "exited" else ""))
                      for n, c in self.state().items())


__all__ = ["Stack", "engine", "health_command", "startup_timeout", "wait_plan", "wait_strategy"]
