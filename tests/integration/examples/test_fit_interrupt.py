"""Ctrl-C during ``Trainer.fit`` stops everything fit started: no process of the run is left, the broker's
port is closed."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.installs import installed

from tests.conftest import free_port_run
from tests.integration.serverprocs import kill_processes_with, processes_with, start_until_line

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420),
              pytest.mark.skipif(bool(os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")), reason="fit runs on the local stack only")]
SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "sql_langgraph" / "train_sql_agent.py"


def test_ctrl_c_stops_everything_fit_started(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    installed("langgraph", "pip install -e '.[test]' (the SQL example's agent)")
    data, kafka_port = tmp_path / "data", free_port_run((0, 1))  # broker, controller
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=str(data), ROLLOUTBUS_KAFKA_PORT=str(kafka_port), PYTHONUNBUFFERED="1",
               ROLLOUTBUS_STORE_PORT=str(free_port_run()))
    env.pop("ROLLOUTBUS_CLICKHOUSE_DSN", None)
    request.addfinalizer(lambda: kill_processes_with(f"ROLLOUTBUS_DATA_DIR={data}"))  # after the asserts: what a failed run left
    proc, lines = start_until_line([sys.executable, str(SCRIPT), "--model", "tiny", "--minutes", "10", "--runners", "2",
                                    "--train", "4", "--validation", "2", "--max-tokens", "4", "--out", str(tmp_path / "out")],
                                   env, tmp_path, "started    stream processor")
    try:
        time.sleep(5)
        assert len(processes_with(f"ROLLOUTBUS_DATA_DIR={data}")) >= 6  # broker, store, process, serve, proxy, train, runners
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends the foreground process
        rest, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, "".join(lines) + rest
    assert "KeyboardInterrupt" in rest, rest[-2000:]
    left = processes_with(f"ROLLOUTBUS_DATA_DIR={data}")
    assert not left, f"fit left processes running: {left}"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", kafka_port)) != 0, "fit left its broker running"
