"""The gateway's ``/metrics`` and ``/healthz`` as an operator exposes them.

Listening beyond loopback (with its token, as it must), the gateway's ``/metrics`` needs the token as
every other route does; on loopback only this machine reaches it and it stays open (the local
Prometheus scrapes it so). ``/healthz`` answers with its counters and reveals no configuration: no
broker address, no path, no token; ``/livez`` (Kubernetes' liveness probe) answers ``ok`` to anyone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.integration.serverprocs import free_port, stop, wait_http

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[1].parent
TOKEN = "gw-metrics-tok-5e0a"


def _start(env: dict[str, str], host: str, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "producers.ingest.gateway_cli", "--host", host, "--port", str(port)],
                                env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", proc, log)
    except AssertionError:
        proc.kill()
        raise
    return base, proc


@pytest.mark.parametrize("host,guarded", [("0.0.0.0", True), ("127.0.0.1", False)])
def test_gateway_metrics_need_the_token_beyond_loopback(test_env: dict[str, str], tmp_path: Path, host: str, guarded: bool) -> None:
    env = {**test_env, "ROLLOUTBUS_GATEWAY_TOKEN": TOKEN, "ROLLOUTBUS_DATA_DIR": str(tmp_path / "gw")}
    base, proc = _start(env, host, tmp_path / "gateway.log")
    try:
        bare = requests.get(f"{base}/metrics", timeout=5)
        assert (bare.status_code, "rolloutbus_gateway_requests" in bare.text) == ((401, False) if guarded else (200, True)), bare.text
        assert TOKEN not in bare.text
        wrong = requests.get(f"{base}/metrics", headers={"Authorization": "Bearer nope"}, timeout=5)
        assert wrong.status_code == (401 if guarded else 200)
        good = requests.get(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        assert good.status_code == 200 and "rolloutbus_gateway_spans_accepted_total" in good.text

        health = requests.get(f"{base}/healthz", timeout=5)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        bootstrap = test_env["ROLLOUTBUS_KAFKA_BOOTSTRAP"]
        for secret_or_config in (TOKEN, bootstrap, bootstrap.rsplit(":", 1)[-1], str(tmp_path), test_env["ROLLOUTBUS_TOPIC_PREFIX"]):
            assert secret_or_config not in health.text, (secret_or_config, health.text)
        # The kubelet's liveness probe sends no token: /livez answers it, and says nothing else.
        live = requests.get(f"{base}/livez", timeout=5)
        assert (live.status_code, live.text) == (200, "ok\n")
        agl = requests.get(f"{base}/v1/agl/health", timeout=5)
        assert agl.status_code == 200 and agl.json() == {"status": "ok"}
    finally:
        stop(proc)
