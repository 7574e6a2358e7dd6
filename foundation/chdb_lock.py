"""The embedded engine's data-dir lock: one process owns a chDB data directory.

The engine's data directory may be open in one process only (a second chDB gets
``Error initializing EmbeddedServer`` or worse). ``lock_store`` takes an exclusive ``flock`` on
``<path>.lock`` beside it, held for the life of the process: ``rolloutbus store`` and every process
that opens a ``chdb://`` DSN take it, so a second one refuses with a clear message naming the owner.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from foundation.errors import StoreError

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


__all__ = ["holder", "lock_path", "lock_store"]
