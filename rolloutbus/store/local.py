"""The store process on this machine (``rolloutbus store``), started and stopped by pid.

The data-dir lock that makes one process the engine's owner is :mod:`foundation.chdb_lock`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from foundation.chdb_lock import holder, lock_path, lock_store
from foundation.errors import ServiceError, StoreError
from rolloutbus.localproc import LocalProcess


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
class LocalStore(LocalProcess):
    """The ``rolloutbus store`` process for ``data_dir``, serving on ``host:port``."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8123

    subdir: ClassVar[str] = "store"
    pid_name: ClassVar[str] = "store.pid"
    log_name: ClassVar[str] = "store.log"
    what: ClassVar[str] = "the store"
    error: ClassVar[type[ServiceError]] = StoreError

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return self.url

    def ready(self) -> bool:
        return ping(self.host, self.port)

    def command(self) -> Sequence[str]:
        return [sys.executable, "-m", "rolloutbus.cli", "--data-dir", str(self.data_dir), "store",
                "--host", self.host, "--port", str(self.port)]


__all__ = ["LocalStore", "lock_store", "lock_path", "holder", "ping"]
