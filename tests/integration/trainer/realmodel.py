"""What the real-model tests share: the imported SmolLM2 (cached across runs) and our processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[3]
MODELS = Path(os.environ.get("ROLLOUTBUS_TEST_MODELS_DIR", Path.home() / ".cache" / "rolloutbus" / "test-models"))


def import_smollm2() -> Path:
    from trainer.model_import import import_model

    return import_model("smollm2-135m-instruct", MODELS)


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], env: dict[str, str], log: Path, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """``rolloutbus ARGS`` with its output in ``log``; added to ``procs`` (stopped by :func:`stop_all`)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args} exited: {log.read_text()[-3000:]}"
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer within {timeout:.0f}s: {log.read_text()[-2000:]}")


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
