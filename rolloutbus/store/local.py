"""The store process on this machine: the data-dir lock, the pid file, start and stop.

The engine's data directory may be open in one process only (a second chDB gets
``Error initializing EmbeddedServer`` or worse). ``lock_store`` takes an exclusive ``flock`` on
``<path>.lock`` beside it, held for the life of the process: ``rolloutbus store`` and every process
that opens a ``chdb://`` DSN take it, so a second one refuses with a clear message naming the owner.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rolloutbus.errors import StoreError

_HELD: dict[str, IO[str]] = {}


def lock_path(store_path: Path) -> Path:
    return Path(str(store_path).rstrip("/") + ".lock")


def lock_store(store_path: Path, owner: str) -> None:
    """Take the data dir's lock for this process (idempotent). Raises StoreError naming the holder."""
    key = str(Path(store_path).resolve())
    if key in _HELD:
        return
    path = lock_path(Path(key))
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # noqa: SIM115 - held open for the process's life
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise StoreError(
            f"the ClickHouse store {key} is in use by {holder}: one process owns it. "
            "Connect to that store over HTTP (ROLLOUTBUS_CLICKHOUSE_DSN=http://127.0.0.1:8123) or stop it (`rolloutbus down`)"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{owner} (pid {os.getpid()})\n")
    f.flush()
    _HELD[key] = f


def holder(store_path: Path) -> str | None:
    """Who holds the lock, or None when it is free."""
    path = lock_path(Path(store_path).resolve())
    if not path.exists():
        return None
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            return f.read().strip() or "another process"
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return None


def _alive(pid: int) -> bool:
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


def ping(host: str, port: int, timeout: float = 1.0) -> bool:
    import http.client

    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.request("GET", "/ping")
        ok = conn.getresponse().read() == b"Ok.\n"
        conn.close()
        return ok
    except OSError:
        return False


@dataclass
class LocalStore:
    """The ``rolloutbus store`` process for ``data_dir``, serving on ``host:port``."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8123

    @property
    def home(self) -> Path:
        return self.data_dir / "store"

    @property
    def pid_file(self) -> Path:
        return self.home / "store.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "store.log"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def start(self, timeout: float = 60.0, env: dict[str, str] | None = None) -> bool:
        """Start the store unless it runs. Returns True when this call started it."""
        if self.pid() is not None:
            self.wait_ready(timeout)
            return False
        self.home.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "rolloutbus.cli", "--data-dir", str(self.data_dir), "store",
               "--host", self.host, "--port", str(self.port)]
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
        self.pid_file.write_text(str(proc.pid))
        try:
            self.wait_ready(timeout, proc)
        except StoreError:
            self.stop()
            raise
        return True

    def wait_ready(self, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                tail = self.log_file.read_text(errors="replace").strip().splitlines()[-1:] if self.log_file.exists() else []
                raise StoreError(f"the store exited with {proc.returncode}: {' '.join(tail) or 'see ' + str(self.log_file)}")
            if ping(self.host, self.port):
                return
            time.sleep(0.2)
        raise StoreError(f"the store did not answer on {self.url} within {timeout:.0f}s; see {self.log_file}")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the store this data dir's pid file names. Returns True when one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True


__all__ = ["LocalStore", "lock_store", "lock_path", "holder", "ping"]
