"""The production topology (deploy/docker-compose.yml) in containers on this host, with podman.

    python deploy/containers/stack.py host            # podman, runc, debootstrap (apt-get when missing); a probe
    python deploy/containers/stack.py images          # build what is missing (cached by content hash)
    python deploy/containers/stack.py up              # images, then every service, waiting on depends_on
    python deploy/containers/stack.py ps | logs SERVICE-N | kill SERVICE-N | start SERVICE-N
    python deploy/containers/stack.py down [-v]       # -v also removes the volumes (Kafka logs, the store)

The files: deploy/docker-compose.yml + deploy/compose.local.yml (+ any ``-f FILE``), read by compose.py
and run by lifecycle.py (testcontainers over the Docker API of a ``podman system service`` that lives as
long as the command; the containers outlive it). CONTAINERS_CONF is deploy/containers/containers.conf.
The secrets the compose file requires (CLICKHOUSE_PASSWORD, ANALYST_PASSWORD, POLICY_TOKEN, PROXY_TOKEN,
GATEWAY_TOKEN), when unset, are generated once per project and kept in
~/.cache/rolloutbus/containers/<project>.env.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import REPO, HostError, cache_dir, ensure_tools, probe  # noqa: E402
from images import build_all  # noqa: E402

if TYPE_CHECKING:
    from compose import Project
    from lifecycle import Stack

# The secrets docker-compose.yml requires; generated once per project unless the environment sets them.
SECRETS = ("CLICKHOUSE_PASSWORD", "ANALYST_PASSWORD", "POLICY_TOKEN", "PROXY_TOKEN", "GATEWAY_TOKEN")
COMPOSE_FILES = [REPO / "deploy" / "docker-compose.yml", REPO / "deploy" / "compose.local.yml"]


def _project_env(project: str) -> dict[str, str]:
    """Per-project secrets kept between runs, created on first use."""
    path = cache_dir() / f"{project}.env"
    values = {}
    if path.is_file():
        values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    missing = [k for k in SECRETS if k not in values]
    if missing:
        values.update({k: secrets.token_urlsafe(18) for k in missing})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        path.chmod(0o600)
    return values


def local_project(project: str = "rolloutbus", extra_files: Iterable[Path] = (), env: dict[str, str] | None = None,
                  build: bool = True, say=print) -> Project:  # noqa: ANN001 - a print-like callable
    """The production file + the local override (+ extra files), images built when missing."""
    from compose import Project  # PyYAML: the project's environment, not needed by `host`/`images`

    environ = {**_project_env(project), **os.environ, **(env or {})}
    if build:
        ensure_tools(say)
        environ.update(build_all(say))
    else:  # down, ps, logs, config: names are enough
        for var in ("KAFKA_IMAGE", "ROLLOUTBUS_SLIM_IMAGE", "ROLLOUTBUS_IMAGE"):
            environ.setdefault(var, "unbuilt")
    return Project.load([*COMPOSE_FILES, *extra_files], env=environ, name=project)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--project", default=os.environ.get("COMPOSE_PROJECT_NAME", "rolloutbus"))
    parser.add_argument("-f", "--file", action="append", default=[], type=Path, help="another override file")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("host")
    sub.add_parser("images")
    up = sub.add_parser("up")
    up.add_argument("services", nargs="*")
    down = sub.add_parser("down")
    down.add_argument("-v", "--volumes", action="store_true")
    sub.add_parser("ps")
    sub.add_parser("config")
    for name in ("logs", "kill", "start", "stop"):
        p = sub.add_parser(name)
        p.add_argument("container", help="<service>-<n>, e.g. kafka-1-1, or a full container name")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "host":
            ensure_tools()
            why = probe()
            print(why or "podman works here (runc, cgroupfs; CONTAINERS_CONF=deploy/containers/containers.conf)")
            return 1 if why else 0
        if args.cmd == "images":
            ensure_tools()
            for k, v in build_all().items():
                print(f"{k}={v}")
            return 0
        project = local_project(args.project, args.file, build=args.cmd == "up")
        if args.cmd == "config":
            import yaml

            print(yaml.safe_dump({n: s.spec for n, s in project.services.items()}, sort_keys=False))
            return 0
        from lifecycle import Stack, engine  # testcontainers: the project's environment

        with engine():
            _run(Stack(project), args.cmd, getattr(args, "services", None), getattr(args, "volumes", False),
                 getattr(args, "container", ""))
    except HostError as exc:  # ComposeError included
        print(f"stack: {exc}", file=sys.stderr)
        return 1
    return 0


def _run(stack: Stack, cmd: str, services: list[str] | None, volumes: bool, container: str) -> None:
    prefix = f"{stack.project.name}-"
    full = container if container.startswith(prefix) else prefix + container
    if cmd == "up":
        print(f"up in {stack.up(services or None):.0f}s")
    elif cmd == "down":
        stack.down(volumes=volumes)
    elif cmd == "ps":
        for name, st in stack.ps():
            print(f"{name:40} {st}")
    elif cmd == "logs":
        print(stack.logs(full, tail=200))
    else:  # kill, start, stop
        getattr(stack, cmd)(full)


if __name__ == "__main__":
    raise SystemExit(main())
