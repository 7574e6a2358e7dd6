"""One process at a time across processes: ``with locked(path):`` holds an exclusive lock on ``path`` (created),
released when the block ends or the process exits. For what several processes may make at once in one place (a
virtualenv, an imported model) on one machine: the first makes it, the others wait and then find it made.
Standard library only (POSIX ``flock``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = ["locked"]
