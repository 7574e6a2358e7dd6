"""Agent Lightning 1.0.2's own server tests (``tests/server/test_endpoints.py`` of its PyPI sdist, unmodified) against
the gateway: two fresh replicas per test, each request to the next one (al1_suite_conftest.py, in place of its
conftest), run by pytest in its own virtualenv (al_venv.py).

Not applicable, with the reason (:data:`NOT_APPLICABLE`): the tests that patch its in-process proxy's upstream
(``monkeypatch.setattr("agentlightning.server.proxy._send_upstream_with_retries", ...)``: the gateway forwards to
``rolloutbus proxy``, out of its process), and ``test_healthz``, which wants the body to be exactly
``{"status": "ok"}`` where the gateway's carries its span transport's counters beside ``"status": "ok"`` (the
deploy checks read them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from al_venv import ENV, ensure_server_suite_1x, ensure_venv_1x
from producers_testkit import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NOT_APPLICABLE = {
    "test_healthz": "its /healthz body is exactly {'status': 'ok'}; the gateway's carries its transport's counters too",
    "test_proxy_completion_endpoint": "patches its in-process proxy's upstream; the gateway forwards to rolloutbus proxy",
    "test_proxy_error_triplet_preserves_status": "patches its in-process proxy's upstream, as above",
}
SUITE = "tests/server/test_endpoints.py"


def test_agent_lightning_1_0_2_server_suite_passes_against_two_gateway_replicas(test_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    python = ensure_venv_1x()
    cached = ensure_server_suite_1x(python)
    root = tmp_path / "suite"
    for rel in ("tests/__init__.py", "tests/server/__init__.py", SUITE):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(cached / rel, root / rel)
    shutil.copy(Path(__file__).with_name("al1_suite_conftest.py"), root / "tests/server/conftest.py")
    gateway_env = {**test_env, "PYTHONPATH": str(REPO)}
    gateway_env.pop("ROLLOUTBUS_GATEWAY_TOKEN", None)
    deselect = [arg for name in NOT_APPLICABLE for arg in ("--deselect", f"{SUITE}::{name}")]
    t0 = time.monotonic()
    out = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", SUITE, *deselect,
                          "--basetemp", str(tmp_path / "inner"), *([os.environ["RB_SUITE_K"]] if os.environ.get("RB_SUITE_K") else [])], cwd=root, capture_output=True, text=True, timeout=840,
                         env={**ENV, "PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "RB_GATEWAY_PYTHON": sys.executable,
                              "RB_GATEWAY_ENV": json.dumps(gateway_env)})
    tail = (out.stdout + out.stderr)[-6000:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error|errors|deselected)", tail)}
    print("FIGURES " + json.dumps({"test": "agentlightning-1.0.2/server-suite", **counts,
                                   "not_applicable": sorted(NOT_APPLICABLE), "seconds": round(time.monotonic() - t0, 1)}))
    assert out.returncode == 0, tail
    assert counts.get("deselected") == len(NOT_APPLICABLE) and counts.get("passed") == 23, tail
