"""Fixtures for the deploy/ checks: the validation tools that deploy/validate.sh installs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
VALIDATE = ROOT / "deploy" / "validate"
sys.path.insert(0, str(VALIDATE))


@pytest.fixture(scope="session")
def tools() -> dict[str, str]:
    """TOOL_PYTHON (venv with check-jsonschema, kubernetes-validate) and KUSTOMIZE, installed if missing."""
    proc = subprocess.run(
        ["bash", str(ROOT / "deploy" / "validate.sh"), "--tools"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr.strip().splitlines()[-1:]
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
