"""A free port for a local service is drawn below the kernel's ephemeral range, and is free when drawn."""

from __future__ import annotations

import random
import socket

from rolloutbus.localproc import ephemeral_low, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_binds() -> None:
    for _ in range(20):
        port = free_port()
        assert 10000 <= port < ephemeral_low()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_handed_out() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        busy = taken.getsockname()[1]

        class Rigged(random.Random):
            draws = [busy, busy + 1 if busy + 1 < ephemeral_low() else busy - 1]

            def randrange(self, *_: int) -> int:  # type: ignore[override]
                return self.draws.pop(0) if self.draws else super().randrange(10000, ephemeral_low())

        assert free_port(rng=Rigged()) != busy
