"""In CI a test may skip only for what the machine kind lacks (``CI_MAY_SKIP`` in tests/conftest.py: a GPU); any
other skip — a test's, or a whole module's at import — fails the session and is listed at its end, also under xdist
(as `make test` runs). Outside CI skips stay skips."""

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
MODULE_SKIP = '''
import pytest
pytest.skip("no such library here", allow_module_level=True)
def test_never_collected(): pass
'''


def _run(ci: str, *args: str) -> subprocess.CompletedProcess[str]:
    probe = ROOT / "tests" / "unit" / f"_skip_probe_{uuid.uuid4().hex[:8]}"
    probe.mkdir()
    try:
        (probe / "test_probe.py").write_text(PROBE)
        (probe / "test_probe_module.py").write_text(MODULE_SKIP)
        env = {**os.environ, "CI": ci}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(probe)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(probe)


def test_a_skip_ci_does_not_allow_fails_the_session_and_is_named() -> None:
    for args in ((), ("-n", "2")):  # one process, and xdist's workers as make test runs them
        r = _run("true", *args)
        assert r.returncode == 1, r.stdout
        assert "2 test(s) skipped in CI for a reason CI_MAY_SKIP" in r.stdout, r.stdout
        listed = r.stdout.split("does not allow:")[1].split("short test summary")[0]
        assert "test_other: not installed here: a thing" in listed and "test_probe_module.py: no such library here" in listed
        assert "test_gpu" not in listed


def test_outside_ci_skips_stay_skips() -> None:
    r = _run("")
    assert r.returncode == 0 and "3 skipped" in r.stdout, r.stdout
