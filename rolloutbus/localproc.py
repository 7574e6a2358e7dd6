"""A service process on this machine that outlives the command that started it: pid file, log file,
start (detached, then waited on until it answers), stop (SIGTERM, then SIGKILL) and kill; and a free
port for one more local service (the demo's and the benches' processes).

``rolloutbus up`` starts the local broker (:mod:`rolloutbus.local_kafka`) and the local store
(:mod:`rolloutbus.store.local`) through it; ``rolloutbus down`` stops them by their pid files.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from foundation.errors import ServiceError


def ephemeral_low() -> int:
    """The lowest port the kernel hands out as a connection's own (``ip_local_port_range``; 32768 where unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A TCP port free on ``host`` now, for a local process to listen on: drawn below the kernel's ephemeral range, so
    that no outgoing connection (a Kafka client's, another process's) takes it as its own before the process binds it
    (seen: a policy server started seconds later failing with "address already in use"); the kernel's pick where there
    is no room below."""
    rng = rng or random.SystemRandom()

    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
            return True

    top = ephemeral_low()
    for _ in range(200 if top > 10001 else 0):
        port = rng.randrange(10000, top)
        if free(port):
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop_on_sigterm() -> Any:
    """From now on SIGTERM (``timeout``, a service manager, a CI job cancelled) ends this process as Ctrl-C does: a
    KeyboardInterrupt, so its ``with``/``finally`` blocks stop every process it started. Python's default for SIGTERM
    is to die at once, which left the broker, the store and the policy engine running with no parent. Returns the
    handler it replaced (to put back); a handler of the caller's own, or a call off the main thread, is left as is."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
    return previous


def restore_sigterm(previous: Any) -> None:
    """Put back the handler :func:`stop_on_sigterm` replaced."""
    if threading.current_thread() is threading.main_thread() and previous is not None:
        signal.signal(signal.SIGTERM, previous)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


class LocalProcess:
    """One local service under ``data_dir/<subdir>``. Subclasses say what it is and when it is ready."""

    subdir: ClassVar[str]
    pid_name: ClassVar[str]
    log_name: ClassVar[str]
    what: ClassVar[str]  # in messages: "the broker", "the store"
    error: ClassVar[type[ServiceError]] = ServiceError

    data_dir: Path

    @property
    def home(self) -> Path:
        return self.data_dir / self.subdir

    @property
    def pid_file(self) -> Path:
        return self.home / self.pid_name

    @property
    def log_file(self) -> Path:
        return self.home / self.log_name

    @property
    def address(self) -> str:
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether the service answers now."""
        raise NotImplementedError

    def command(self) -> Sequence[str]:
        """The command line that runs the service (called after :meth:`prepare`)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Work before the first start (fetch, format); the home directory exists."""

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    def start(self, timeout: float = 60.0, env: dict[str, str] | None = None) -> bool:
        """Start the service unless it runs. Returns True when this call started it."""
        if self.pid() is not None:
            self.wait_ready(timeout)
            return False
        self.home.mkdir(parents=True, exist_ok=True)
        self.prepare()
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                list(self.command()), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives the `rolloutbus up` that started it
                env=env,
            )
        self.pid_file.write_text(str(proc.pid))
        try:
            self.wait_ready(timeout, proc)
        except ServiceError:
            self.stop()
            raise
        return True

    def wait_ready(self, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                tail = self.log_file.read_text(errors="replace").strip().splitlines()[-1:] if self.log_file.exists() else []
                raise self.error(f"{self.what} exited with {proc.returncode}: {' '.join(tail) or 'see ' + str(self.log_file)}")
            if self.ready():
                return
            time.sleep(0.2)
        raise self.error(f"{self.what} did not answer on {self.address} within {timeout:.0f}s; see {self.log_file}")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the process this data dir's pid file names. Returns True when one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
            while alive(pid):
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> None:
        """SIGKILL the process (fault tests)."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            while alive(pid):
                time.sleep(0.05)


__all__ = ["LocalProcess", "alive", "free_port"]
