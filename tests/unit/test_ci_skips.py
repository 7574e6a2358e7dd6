"""In CI a test may skip only for what the machine kind lacks (``CI_MAY_SKIP`` in tests/conftest.py: a GPU); any
other skip fails the session and is listed at its end. Outside CI skips stay skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = '''
import pytest
def test_gpu(): pytest.skip("needs CUDA")
def test_other(): pytest.skip("not installed here: a thing")
'''


def _run(ci: str) -> subprocess.CompletedProcess[str]:
    probe = ROOT / "tests" / "unit" / f"_skip_probe_{uuid.uuid4().hex[:8]}"
    probe.mkdir()
    try:
        (probe / "test_probe.py").write_text(PROBE)
        env = {**os.environ, "CI": ci}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(probe)


def test_a_skip_ci_does_not_allow_fails_the_session_and_is_named() -> None:
    r = _run("true")
    assert r.returncode == 1, r.stdout
    assert "1 test(s) skipped in CI for a reason CI_MAY_SKIP" in r.stdout and "test_other: not installed here: a thing" in r.stdout
    assert "test_gpu" not in r.stdout.split("does not allow:")[1].split("short test summary")[0]


def test_outside_ci_skips_stay_skips() -> None:
    r = _run("")
    assert r.returncode == 0 and "2 skipped" in r.stdout, r.stdout
