"""Starting and stopping one of our HTTP servers as its own process, for the tests that talk to it as a client,
and how much memory it holds.

``free_port`` and ``stop`` are the benchmarks' own (``bench/common.py``)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import requests

from bench.common import free_port
from bench.common import stop_process as stop

__all__ = ["free_port", "stop", "wait_http", "rss_mib", "assert_memory_bounded", "RSS_GROWTH_MIB", "processes_with",
           "kill_processes_with", "start_until_line"]

# How much more resident memory a server may hold after fuzzing than before: generous (bodies of a few MiB,
# the allocator keeping freed arenas), but a leak per request (thousands of requests) passes it.
RSS_GROWTH_MIB = 256.0


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


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    assert match is not None, f"no VmRSS for process {pid}"
    return int(match.group(1)) / 1024


def assert_memory_bounded(what: str, pid: int, before_mib: float, bound_mib: float = RSS_GROWTH_MIB) -> str:
    """Fails when ``pid`` grew by ``bound_mib`` or more since ``before_mib``; else says how much it holds."""
    after = rss_mib(pid)
    assert after - before_mib < bound_mib, f"{what}: resident memory grew {before_mib:.0f} -> {after:.0f} MiB while fuzzed"
    return f"{what} {before_mib:.0f} -> {after:.0f} MiB"


def processes_with(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (a run's data dir): what a run left behind, whatever its name."""
    import os

    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def kill_processes_with(marker: str) -> None:
    """SIGKILL what :func:`processes_with` finds: after a test that failed, the run's broker, store and trainer
    would otherwise keep running, and loading the machine, for the rest of the session."""
    import os
    import signal

    for pid in processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def start_until_line(cmd: list[str], env: dict[str, str], cwd: Path, prefix: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Start ``cmd`` with its output piped and read until a line starts with ``prefix``; the process and its lines so
    far (an AssertionError with them when it ends first). The caller stops it. The child gets SIGINT's default, as a
    terminal's foreground process has it: a shell that ran this session in the background (``make test &``) ignores
    SIGINT, an ignored signal stays ignored across exec, and Python then never raises KeyboardInterrupt for it."""
    import signal

    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return proc, lines
    proc.wait()
    raise AssertionError(f"{cmd[:4]} ended before printing {prefix!r}:\n" + "".join(lines))
