"""Starting and stopping one of our HTTP servers as its own process, for the tests that talk to it as a client.

``free_port`` and ``stop`` are the benchmarks' own (``bench/common.py``)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import requests

from bench.common import free_port
from bench.common import stop_process as stop

__all__ = ["free_port", "stop", "wait_http"]


def wait_http(url: str, proc: subprocess.Popen[Any], log: Path | None = None, timeout: float = 60, **kwargs: Any) -> None:
    """Until ``url`` answers at all (any status); fails with the process's log when it exits or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited while starting ({url}): {log.read_text(errors='replace')[-3000:] if log else ''}"
        try:
            requests.get(url, timeout=2, **kwargs)
            return
        except requests.RequestException:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered: {log.read_text(errors='replace')[-3000:] if log else ''}")
