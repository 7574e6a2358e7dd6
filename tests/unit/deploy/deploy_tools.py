"""Helpers for the deploy/ tests: run code in the validation tools' venv."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VALIDATE = ROOT / "deploy" / "validate"


def run_tool(tools: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in the tool venv with deploy/validate importable."""
    return subprocess.run(
        [tools["TOOL_PYTHON"], "-c", f"import sys; sys.path.insert(0, {str(VALIDATE)!r})\n{code}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "KUSTOMIZE": tools["KUSTOMIZE"]},
    )


def kustomize(tools: dict[str, str]) -> list[str]:
    return shlex.split(tools["KUSTOMIZE"])
