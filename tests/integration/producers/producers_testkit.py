"""Reading a topic back from the real broker, and starting gateway processes, for the producer tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
from confluent_kafka import Consumer

from schemas.codec import decode_raw


def consume_all(conf: dict[str, Any], topic: str, expect: int, timeout: float = 30.0) -> list[tuple[bytes, str, dict[str, Any], int]]:
    """Every record on ``topic`` as (key, record name, Avro dict, partition), stopping at ``expect``
    records or when the topic stays quiet for a while after ``timeout``."""
    c = Consumer({**conf, "group.id": f"check-{uuid.uuid4().hex}", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[tuple[bytes, str, dict[str, Any], int]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                if len(out) >= expect:
                    break
                continue
            if msg.error():
                continue
            name, rec = decode_raw(msg.value())
            out.append((msg.key(), name, rec, msg.partition()))
        # A short grace read: anything beyond ``expect`` (duplicates) must show up too.
        grace = time.monotonic() + 1.0
        while time.monotonic() < grace:
            msg = c.poll(0.2)
            if msg is not None and not msg.error():
                name, rec = decode_raw(msg.value())
                out.append((msg.key(), name, rec, msg.partition()))
    finally:
        c.close()
    return out


REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(env: dict[str, str], data_dir: Path, token: str | None = None) -> tuple[str, subprocess.Popen[str]]:
    """A ``rolloutbus gateway`` process with its own data dir (its spool), as one replica; → (base URL,
    process). Its output goes to ``<data_dir>/gateway.log`` (a pipe no one reads would block a gateway that logs a
    lot, and lose a failing run's log). Raises RuntimeError with that log when it does not come up."""
    port = free_port()
    genv = {**env, "PYTHONPATH": str(REPO), "ROLLOUTBUS_DATA_DIR": str(data_dir)}
    genv.pop("ROLLOUTBUS_GATEWAY_TOKEN", None)
    if token is not None:
        genv["ROLLOUTBUS_GATEWAY_TOKEN"] = token
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "gateway.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "producers.ingest.gateway_cli", "--port", str(port)], env=genv,
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                return base, proc
        except requests.ConnectionError:
            time.sleep(0.2)
    proc.kill()
    proc.wait(10)
    raise RuntimeError(f"gateway did not start: {log.read_text(errors='replace')[-4000:]}")


def clickhouse_server_env(test_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """``test_env`` with a ``rolloutbus store`` server's DSN: one ClickHouse for the stream worker (writes) and the
    gateway (reads, read-only — an embedded ``chdb://`` store is one process's). A fixture's body: yields, then stops it."""
    from tests.faults.faultkit import store

    proc, dsn = store(test_env, tmp_path / "store", tmp_path / "store.log")
    yield {**test_env, "ROLLOUTBUS_CLICKHOUSE_DSN": dsn}
    proc.terminate()
    proc.wait(30)
