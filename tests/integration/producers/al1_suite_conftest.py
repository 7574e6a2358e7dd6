"""Agent Lightning 1.0.2's ``tests/server/conftest.py``, for its own server tests run against the gateway: copied
(as that file) beside its ``test_endpoints.py`` by test_agentlightning1_server_suite.py and run in its venv.

Its fixtures make an in-process app per test and clear its module-level store around each one. Here each test
gets an empty store too, on two gateway replicas (``rolloutbus gateway``, this repo's Python) on a topic prefix of
their own: emptied through the API between tests, or a fresh pair where a call cannot empty it (its terminal log).
``client`` sends each request to the next replica in turn, so every read-after-write crosses replicas. ``RB_GATEWAY_ENV`` (JSON) is the environment a gateway starts with, ``RB_GATEWAY_PYTHON`` its
interpreter.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

AGL_KEY = "test-secret-key"
MODEL_NAME = "test-model"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replicas:
    """The calls of its ``TestClient`` that the tests make, each to the next replica."""

    def __init__(self, bases: list[str]) -> None:
        self.clients = [httpx.Client(base_url=b, timeout=30) for b in bases]
        self._next = itertools.cycle(self.clients)

    def __getattr__(self, method: str) -> Any:
        if method not in ("get", "post", "patch", "delete", "put"):
            raise AttributeError(method)
        return lambda *a, **kw: getattr(next(self._next), method)(*a, **kw)

    def close(self) -> None:
        for c in self.clients:
            c.close()


class Pair:
    """Two fresh gateway replicas on a topic prefix of their own (a fresh store), and their logs."""

    def __init__(self, logs: Path) -> None:
        env = {**json.loads(os.environ["RB_GATEWAY_ENV"]), "ROLLOUTBUS_TOPIC_PREFIX": f"al{uuid.uuid4().hex[:8]}.",
               "ROLLOUTBUS_GATEWAY_TOKEN": AGL_KEY}
        self.procs, bases = [], []
        for n in range(2):
            port = _free_port()
            log = open(logs / f"gateway-{n}.log", "w")
            self.procs.append(subprocess.Popen(
                [os.environ["RB_GATEWAY_PYTHON"], "-m", "producers.ingest.gateway_cli", "--port", str(port)],
                env={**env, "ROLLOUTBUS_DATA_DIR": str(logs / f"gw-{n}")}, stdout=log, stderr=subprocess.STDOUT))
            bases.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 90
        for base, proc in zip(bases, self.procs):
            while True:
                try:
                    if httpx.get(f"{base}/livez", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gateway at {base} did not start: {(logs / 'gateway-0.log').read_text()[-2000:]}")
                time.sleep(0.1)
        self.client = Replicas(bases)

    def emptied(self) -> bool:
        """Its store emptied through the API (rollouts deleted, models removed, the proxy resumed), as its fixture
        empties its in-process one; False when its terminal log has entries (no call removes them: a fresh pair)."""
        c, h = self.client, {"Authorization": f"Bearer {AGL_KEY}"}
        every = [("state_in", s) for s in ("queuing", "running", "succeeded", "failed")]
        for r in c.get("/api/rollouts", params=every, headers=h).raise_for_status().json():
            c.delete(f"/api/rollouts/{r['rollout_id']}", headers=h).raise_for_status()
        c.delete("/api/models", headers=h).raise_for_status()
        c.post("/proxy/resume", headers=h).raise_for_status()
        return c.get("/api/rollouts/terminal", headers=h).raise_for_status().json()["total_terminal"] == 0

    def close(self) -> None:
        self.client.close()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="session")
def _pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Pair]]:
    pairs: list[Pair] = []
    yield pairs
    for p in pairs:
        p.close()


@pytest.fixture
def client(_pairs: list[Pair], tmp_path_factory: pytest.TempPathFactory) -> Replicas:
    """An empty store on two replicas: the session's pair emptied through the API, or a fresh pair (the first test,
    and one after a test left entries in the terminal log)."""
    if not _pairs or not _pairs[-1].emptied():
        if _pairs:
            _pairs.pop().close()
        _pairs.append(Pair(tmp_path_factory.mktemp("gateways")))
    return _pairs[-1].client


@pytest.fixture
def auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {AGL_KEY}"}
