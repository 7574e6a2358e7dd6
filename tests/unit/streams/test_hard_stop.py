"""The worker's hard stop: the process ends its shutdown timeout after the first stop signal."""

from __future__ import annotations

import signal
import threading
import time

from streams.app import HardStop


def test_the_exit_comes_the_timeout_after_the_first_signal_not_a_later_one() -> None:
    exited: list[float] = []
    done = threading.Event()

    def exit_(code: int) -> None:
        exited.append(time.monotonic())
        done.set()

    stop = HardStop(0.6, exit_=exit_)
    time.sleep(0.3)
    assert not exited  # nothing before a signal
    t0 = time.monotonic()
    stop.on_signal(signal.SIGTERM, None)
    armed = stop.armed_at
    assert armed is not None and armed >= t0
    time.sleep(0.3)
    stop.arm()  # faust's own stop, later: the deadline stays the signal's
    assert stop.armed_at == armed
    assert done.wait(10)
    assert exited[0] - t0 >= 0.6
    time.sleep(0.3)
    assert len(exited) == 1
