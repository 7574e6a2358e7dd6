"""Secure by default, as an operator meets it: ``rolloutbus store``, ``serve`` and ``dashboard`` asked to
listen on 0.0.0.0 without credentials exit 2 with one line naming the variable and ``--insecure``; with
credentials they serve; with ``--insecure`` (or ROLLOUTBUS_INSECURE=true) they serve and log a WARNING."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

COMMANDS = {
    # command: (variable naming the credential, env giving one, extra flags, a GET path answering 200 when up)
    "store": ("ROLLOUTBUS_STORE_USERS", {"ROLLOUTBUS_STORE_USERS": "w:writer:s3cret-pw"}, [], "/ping"),
    "serve": ("ROLLOUTBUS_SERVE_TOKEN", {"ROLLOUTBUS_SERVE_TOKEN": "s3cret-tok"}, ["--model", "tiny", "--no-follow"], "/healthz"),
    "dashboard": ("ROLLOUTBUS_DASHBOARD_TOKEN", {"ROLLOUTBUS_DASHBOARD_TOKEN": "s3cret-tok"}, ["--no-kafka-lag"], "/healthz"),
    "gateway": ("ROLLOUTBUS_GATEWAY_TOKEN", {"ROLLOUTBUS_GATEWAY_TOKEN": "s3cret-tok"}, [], "/healthz"),
    "proxy": ("ROLLOUTBUS_PROXY_TOKEN", {"ROLLOUTBUS_PROXY_TOKEN": "s3cret-tok"}, ["--upstream", "http://127.0.0.1:9/v1"], "/healthz"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(tmp: Path, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTBUS_")}
    e.update(PYTHONUNBUFFERED="1", ROLLOUTBUS_DATA_DIR=str(tmp), PYTHONPATH=str(REPO))
    e.update(extra)
    return e


def argv(command: str, port: int, *more: str) -> list[str]:
    return [sys.executable, "-m", "rolloutbus.cli", command, "--host", "0.0.0.0", "--port", str(port),
            *COMMANDS[command][2], *more]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_open_address_without_credentials_is_refused(command: str, tmp_path: Path) -> None:
    variable = COMMANDS[command][0]
    r = subprocess.run(argv(command, free_port()), env=env(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and variable in lines[0] and "--insecure" in lines[0] and "0.0.0.0" in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def serves(command: str, tmp: Path, extra_env: dict[str, str], *flags: str) -> str:
    """Start it on 0.0.0.0, wait for its GET path to answer 200 on loopback, stop it; its output."""
    port = free_port()
    log = tmp / f"{command}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv(command, port, *flags), env=env(tmp, **extra_env), cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{COMMANDS[command][3]}", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return log.read_text()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_starts_with_credentials(command: str, tmp_path: Path) -> None:
    out = serves(command, tmp_path, COMMANDS[command][1])
    assert "INSECURE" not in out and "s3cret" not in out


@pytest.mark.parametrize("command, how", [(c, h) for c in COMMANDS for h in ("flag", "env")])
def test_starts_insecure_with_a_loud_warning(command: str, how: str, tmp_path: Path) -> None:
    out = serves(command, tmp_path, {"ROLLOUTBUS_INSECURE": "true"} if how == "env" else {},
                 *(["--insecure"] if how == "flag" else []))
    warning = [ln for ln in out.splitlines() if "WARNING" in ln and "INSECURE" in ln]
    assert warning and COMMANDS[command][0] in warning[0], out[-2000:]
