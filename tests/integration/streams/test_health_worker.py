"""``rolloutbus process`` probes on the real broker and the real ClickHouse engine: /readyz is 503 until the
worker holds its partitions, 200 once it processes spans, and 503 again while ClickHouse does not answer."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.streams.helpers import ROOT, WorkerProc, batches, encoded, produce, rollout, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe(port: int, path: str) -> tuple[int, str] | None:
    """(status, body), or None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


def first_answer(port: int, proc: WorkerProc, timeout: float = 60) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe(port, "/readyz")
        if got is not None:
            return got
        assert proc.poll() is None, proc.output()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"nothing answered on {port}: {proc.output()[-3000:]}")


def wait_for(port: int, want: int, proc: WorkerProc, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = probe(port, "/readyz")
        if got is not None and got[0] == want:
            return got[1]
        assert proc.poll() is None, proc.output()[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"/readyz never answered {want} (last {got}): {proc.output()[-3000:]}")


def metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{")]
    assert values, f"{name} not in /metrics"
    return sum(values)


def test_readyz_is_503_until_connected_and_200_once_spans_are_processed(kafka_conf: dict[str, Any], topics: Any,
                                                                         test_env: dict[str, str]) -> None:
    port = free_port()
    started = time.time()
    proc = start_worker(test_env, "--group-size", "2", "--metrics-port", str(port))
    try:
        status, reason = first_answer(port, proc)
        assert status == 503 and reason.strip().split(":")[0] in ("starting", "kafka"), reason
        assert probe(port, "/healthz") == (200, "ok\n")

        produce(kafka_conf, topics.spans, [kv for r in ("r1", "r2") for kv in encoded(*rollout(r, "task-1", 1.0 if r == "r1" else 0.0))])
        assert len(batches(kafka_conf, topics.batches, 1, proc)) == 1
        assert wait_for(port, 200, proc) == "ready\n"

        status, text = probe(port, "/metrics") or (0, "")
        assert status == 200
        assert metric(text, "rolloutbus_streams_last_progress_timestamp_seconds") >= started
        assert metric(text, "rolloutbus_streams_spans_total") == 8  # the worker's own counters, on the same port
        assert metric(text, "rolloutbus_streams_groups_emitted_total") == 1
    finally:
        code, out = stop_worker(proc)
    assert code == 0, out[-3000:]


def _start_store(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    from rolloutbus.store.local import ping

    data_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTBUS_")}
    proc = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", "--data-dir", str(data_dir), "store", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not ping("127.0.0.1", port):
        assert proc.poll() is None and time.monotonic() < deadline, "the store did not start"
        time.sleep(0.1)
    return proc


def test_readyz_is_503_while_clickhouse_does_not_answer(kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str],
                                                         tmp_path: Path) -> None:
    """ClickHouse over HTTP (the local store, as a server would be): gone → 503 naming it, back → 200."""
    store_port, port = free_port(), free_port()
    store = _start_store(tmp_path / "store", store_port)
    env = {**test_env, "ROLLOUTBUS_CLICKHOUSE_DSN": f"http://127.0.0.1:{store_port}"}
    proc = start_worker(env, "--group-size", "2", "--metrics-port", str(port))
    try:
        produce(kafka_conf, topics.spans, [kv for r in ("r1", "r2") for kv in encoded(*rollout(r, "task-1", 1.0))])
        assert len(batches(kafka_conf, topics.batches, 1, proc)) == 1
        wait_for(port, 200, proc)

        store.send_signal(signal.SIGTERM)
        store.wait(30)
        reason = wait_for(port, 503, proc, timeout=45)  # the next ping (every 10 s with no rows to write)
        assert reason.startswith("clickhouse: not answering"), reason
        assert probe(port, "/healthz") == (200, "ok\n")  # alive all the same: no restart for this

        store = _start_store(tmp_path / "store", store_port)
        wait_for(port, 200, proc, timeout=45)
    finally:
        stop_worker(proc)
        if store.poll() is None:
            store.terminate()
            store.wait(30)
