"""A supervised process's CPU counts its running descendants (a policy server's vLLM engine core is one)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rolloutbus.runs.procs import _stat_ticks, tree_cpu_ticks

BURN_THEN_SLEEP = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\nprint('done', flush=True)\ntime.sleep(60)"


def test_a_running_child_s_cpu_is_counted_with_its_parent(tmp_path: Path) -> None:
    ready = tmp_path / "child.out"
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time\n"
                               f"subprocess.Popen([sys.executable, '-c', {BURN_THEN_SLEEP!r}], stdout=open({str(ready)!r}, 'w'))\n"
                               "time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while "done" not in (ready.read_text() if ready.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.1)
        tick = os.sysconf("SC_CLK_TCK")
        assert _stat_ticks(parent.pid) / tick < 0.3  # the parent alone: the child is running, not reaped
        assert tree_cpu_ticks(parent.pid) / tick >= 0.5  # with its child's 0.6 s of work
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
