"""A small supervisor for the demo's processes: start with a log file each, stop all in reverse order.

Every process runs in its own process group so a Ctrl-C in the terminal reaches the demo only, and
the demo stops the others in order (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from foundation.errors import RolloutbusError


class ProcessDied(RolloutbusError):
    """A process the demo started exited on its own."""


@dataclass
class Managed:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Supervisor:
    log_dir: Path
    env: dict[str, str]
    procs: list[Managed] = field(default_factory=list)

    def start(self, name: str, args: list[str]) -> Managed:
        """Start ``rolloutbus ARGS`` (the same interpreter) with its output in ``log_dir/NAME.log``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "rolloutbus.cli", *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            )
        managed = Managed(name, proc, log)
        self.procs.append(managed)
        return managed

    def check(self) -> None:
        """Raise when a process exited on its own, with the tail of its log."""
        for m in self.procs:
            code = m.proc.poll()
            if code is not None:
                tail = m.log.read_text(errors="replace").strip().splitlines()[-8:]
                raise ProcessDied(f"{m.name} exited with {code}; last lines of {m.log}:\n  " + "\n  ".join(tail))

    def returncode(self, name: str) -> int | None:
        """The exit code of the process called ``name`` if it has exited, else None."""
        for m in self.procs:
            if m.name == name:
                return m.proc.poll()
        return None

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each running process has used so far with all its descendants, the running ones
        (a policy server's vLLM engine core, torchrun's ranks) and the reaped ones (Linux)."""
        tick = os.sysconf("SC_CLK_TCK")
        return {m.name: tree_cpu_ticks(m.proc.pid) / tick for m in self.procs if Path(f"/proc/{m.proc.pid}").exists()}

    def stop(self, name: str, grace: float = 20.0) -> int | None:
        for m in list(self.procs):
            if m.name == name:
                self.procs.remove(m)
                return _terminate(m, grace)
        return None

    def stop_all(self, grace: float = 20.0) -> None:
        for m in reversed(list(self.procs)):
            _terminate(m, grace)
        self.procs.clear()


def _stat_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of ``pid`` (its reaped children included); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(f) for f in fields[11:15])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def tree_cpu_ticks(pid: int) -> int:
    """Clock ticks of CPU ``pid`` and its descendants have used: each running one's own and its reaped children's."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _stat_ticks(p)
        todo.extend(_children(p))
    return total


def _terminate(m: Managed, grace: float) -> int | None:
    if m.proc.poll() is not None:
        return m.proc.returncode
    try:
        os.killpg(m.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return m.proc.poll()
    deadline = time.monotonic() + grace
    while m.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if m.proc.poll() is None:
        try:
            os.killpg(m.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        m.proc.wait()
    return m.proc.returncode
