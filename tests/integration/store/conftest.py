"""A real ``rolloutbus store`` process on a free port and a scratch data dir, per test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Store:
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def store_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("ROLLOUTBUS_STORE_USERS", None)
    env.update(extra)
    return env


def start_store(data_dir: Path, port: int | None = None, **env: str) -> Store:
    from rolloutbus.store.local import ping

    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / f"store-{port}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", "--data-dir", str(data_dir), "store", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=store_env(**env), cwd=REPO)
    deadline = time.monotonic() + 60
    while not ping("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the store did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return Store(proc, port, data_dir, log)


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[Callable[..., Store]]:
    started: list[Store] = []

    def make(data_dir: Path | None = None, **env: str) -> Store:
        store = start_store(data_dir or tmp_path / "data", **env)
        started.append(store)
        return store

    yield make
    for store in started:
        if store.proc.poll() is None:
            store.proc.terminate()
            try:
                store.proc.wait(20)
            except subprocess.TimeoutExpired:
                store.proc.kill()
                store.proc.wait(10)


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()
