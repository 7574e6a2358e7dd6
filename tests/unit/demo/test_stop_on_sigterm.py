"""SIGTERM to the demo or to a script in Trainer.fit is Ctrl-C: a KeyboardInterrupt that unwinds the ``with`` blocks
stopping what they started; a handler of the user's own is kept, and fit puts the default back when it returns."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rolloutbus.localproc import restore_sigterm, stop_on_sigterm


def test_sigterm_becomes_a_keyboard_interrupt_then_the_default_comes_back() -> None:
    # from Python's default (what a script starts with; a test run's process may hold another: put back after)
    outer = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        previous = stop_on_sigterm()
        try:
            with pytest.raises(KeyboardInterrupt, match="signal 15"):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler runs at the next bytecode; never reached
        finally:
            restore_sigterm(previous)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, outer)


def test_a_handler_of_the_users_own_is_kept() -> None:
    seen: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    try:
        previous = stop_on_sigterm()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert seen == [signal.SIGTERM]
        restore_sigterm(previous)
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
