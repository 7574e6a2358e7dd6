"""``foundation.filelock.locked``: one process at a time across processes (what makes a shared virtualenv or an
imported model safe when the test session's workers, or two commands, ask for it at once)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from foundation.filelock import locked

HOLD = """
import sys, time
from pathlib import Path
from foundation.filelock import locked
with locked(Path(sys.argv[1])):
    Path(sys.argv[2]).write_text("held")
    time.sleep(1.5)
"""


def test_a_second_process_waits_for_the_first(tmp_path: Path) -> None:
    lock, flag = tmp_path / "x.lock", tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), str(flag)])
    try:
        deadline = time.monotonic() + 30
        while not flag.exists():
            assert time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.05)
        t0 = time.monotonic()
        with locked(lock):
            waited = time.monotonic() - t0  # held until the other let go
    finally:
        holder.wait(30)
    assert waited > 0.5, waited


def test_the_lock_is_free_again_after_the_block(tmp_path: Path) -> None:
    with locked(tmp_path / "deep" / "y.lock"):
        pass
    t0 = time.monotonic()
    with locked(tmp_path / "deep" / "y.lock"):
        assert time.monotonic() - t0 < 0.5
