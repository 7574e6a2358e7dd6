"""SIGTERM to ``rolloutbus demo`` (``timeout``, a service manager, a cancelled CI job) stops everything the demo
started, as Ctrl-C does: no process of the run is left and the broker's port is closed."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port_run
from tests.integration.serverprocs import kill_processes_with, processes_with, start_until_line

pytestmark = [pytest.mark.integration, pytest.mark.timeout(360),
              pytest.mark.skipif(bool(os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")), reason="the demo runs on the local stack only")]


def test_sigterm_stops_everything_the_demo_started(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    data, kafka_port = tmp_path / "data", free_port_run((0, 1))  # broker, controller
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=str(data), ROLLOUTBUS_KAFKA_PORT=str(kafka_port), PYTHONUNBUFFERED="1",
               ROLLOUTBUS_STORE_PORT=str(free_port_run()))
    env.pop("ROLLOUTBUS_CLICKHOUSE_DSN", None)
    request.addfinalizer(lambda: kill_processes_with(f"ROLLOUTBUS_DATA_DIR={data}"))  # after the asserts: what a failed run left
    proc, lines = start_until_line([sys.executable, "-m", "rolloutbus.cli", "demo", "--quick", "--no-dashboard", "--out",
                                    str(tmp_path / "out")], env, tmp_path, "started    stream processor")
    try:
        time.sleep(3)
        assert len(processes_with(f"ROLLOUTBUS_DATA_DIR={data}")) >= 6  # broker, store, process, serve, proxy, train, runners
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(lines) + rest
    assert "rolloutbus demo: interrupted" in rest, rest[-2000:]
    deadline = time.monotonic() + 10
    while (left := processes_with(f"ROLLOUTBUS_DATA_DIR={data}")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"the demo left processes running: {left}"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", kafka_port)) != 0, "the demo left its broker running"
