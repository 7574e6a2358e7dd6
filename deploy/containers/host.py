"""The container engine on this host: podman, set up from the project's files.

Debian's ``podman`` (4.3) and ``runc`` run rootful containers here once ``CONTAINERS_CONF`` names
``deploy/containers/containers.conf`` (runc, cgroupfs, no default ulimits); the system-wide files are
never edited. ``ensure_tools`` installs podman, runc and debootstrap with apt-get when they are missing
(as root; otherwise it says which command to run). ``probe`` answers why containers cannot run, or None.
``api_socket`` serves podman's Docker-compatible API for a while (what testcontainers talks to).

Standard library only: this runs before the project's virtual environment exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CONF = HERE / "containers.conf"
TOOLS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}  # command -> Debian package


class HostError(RuntimeError):
    """Containers cannot run on this host; the message says why and what to do."""


def cache_dir() -> Path:
    """Where images' build contexts, the base rootfs tarball and pip's download cache live."""
    base = os.environ.get("ROLLOUTBUS_CONTAINERS_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "rolloutbus" / "containers"


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every podman call runs with: this project's containers.conf."""
    e = dict(os.environ)
    e.setdefault("CONTAINERS_CONF", str(CONF))
    e.update(extra or {})
    return e


def missing_tools() -> list[str]:
    return [cmd for cmd in TOOLS if not shutil.which(cmd)]


def ensure_tools(say=print) -> None:  # noqa: ANN001 - a print-like callable
    """Install podman, runc and debootstrap with apt-get when missing (root only)."""
    missing = missing_tools()
    if not missing:
        return
    packages = sorted({TOOLS[c] for c in missing})
    if os.geteuid() != 0:
        raise HostError(f"{', '.join(missing)} missing: run `sudo apt-get install -y {' '.join(packages)}`")
    if not shutil.which("apt-get"):
        raise HostError(f"{', '.join(missing)} missing and this host has no apt-get: install {' '.join(packages)}")
    say(f"installing {' '.join(packages)} (apt-get)")
    quiet = {"DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        proc = subprocess.run(cmd, env={**os.environ, **quiet}, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
            raise HostError(f"{' '.join(cmd)} failed: {tail}")
    still = missing_tools()
    if still:
        raise HostError(f"apt-get installed {' '.join(packages)} but {', '.join(still)} is still not on PATH")


def podman(*args: str, check: bool = True, capture: bool = True, timeout: float | None = None,
           input: str | bytes | None = None) -> subprocess.CompletedProcess:  # noqa: A002 - subprocess's name
    """Run one podman command with the project's containers.conf."""
    proc = subprocess.run(["podman", *args], env=env(), capture_output=capture, text=not isinstance(input, bytes),
                          timeout=timeout, input=input)
    if check and proc.returncode != 0:
        err = (proc.stderr or "").strip() if capture else ""
        raise HostError(f"podman {' '.join(args[:3])} ... failed ({proc.returncode}): {err[-800:]}")
    return proc


@contextmanager
def api_socket(timeout: float = 30) -> Iterator[str]:
    """``podman system service`` on a socket of its own while the block runs; yields its ``unix://`` URL.

    The containers it starts outlive it (conmon, not the service, is their parent), so a CLI call may
    start them and exit. Its log: ``<cache>/logs/podman-service.log``."""
    run = Path(tempfile.mkdtemp(prefix="rb-podman-"))  # short: a socket path has at most 107 bytes
    sock = run / "docker.sock"
    log_path = cache_dir() / "logs" / "podman-service.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        proc = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"], env=env(),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + timeout
        while not sock.exists():  # podman creates the socket once it listens
            if proc.poll() is not None or time.monotonic() > end:
                raise HostError(f"`podman system service` did not serve {sock} (log {log_path})")
            time.sleep(0.1)
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(run, ignore_errors=True)


def probe(image: str | None = None) -> str | None:
    """None when podman works here; otherwise one line saying why not.

    With ``image``, also starts a container of it (``true``), which is what actually fails on a host whose
    kernel or cgroups refuse containers.
    """
    missing = missing_tools()
    if "podman" in missing or "runc" in missing:
        return f"{', '.join(missing)} not installed (`make -f deploy/containers/containers.mk containers-host` installs them as root)"
    try:
        info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=60)
    except (HostError, subprocess.TimeoutExpired) as exc:
        return f"`podman info` fails: {exc}"
    if info.stdout.strip() != "runc":
        return f"podman uses runtime {info.stdout.strip()!r}, not runc: CONTAINERS_CONF={env()['CONTAINERS_CONF']} not read"
    if image:
        try:
            podman("run", "--rm", "--network", "none", image, "true", timeout=120)
        except (HostError, subprocess.TimeoutExpired) as exc:
            return f"a container does not start: {exc}"
    return None


__all__ = ["CONF", "HERE", "HostError", "REPO", "api_socket", "cache_dir", "ensure_tools", "env", "missing_tools", "podman", "probe"]
