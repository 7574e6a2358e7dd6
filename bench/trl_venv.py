"""Hugging Face TRL in its own virtualenv, for the learning benchmark's baseline (``bench/learning_trl.py``).

TRL cannot share the project venv: its dependencies move click past faust-streaming's pin. So it is
installed once, with the same torch version as the running interpreter's (no local ``+cu...`` suffix),
under ``~/.cache/rolloutbus/bench-trl-1.16.0`` (override the place with ``ROLLOUTBUS_BENCH_TRL_VENV``);
a marker file makes later runs skip it. A venv that already imports trl 1.16.0 but has no marker (one
installed by hand) is accepted and marked. A failed install raises :class:`TRLInstallError` with pip's
last line.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

TRL_VERSION = "1.16.0"
DEFAULT_VENV = Path.home() / ".cache" / "rolloutbus" / f"bench-trl-{TRL_VERSION}"


class TRLInstallError(RuntimeError):
    """trl could not be installed into its virtualenv."""


def torch_version() -> str:
    """The running interpreter's torch version, without the local suffix (``2.15.0+cu132`` → ``2.15.0``)."""
    try:
        return importlib.metadata.version("torch").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError as exc:
        raise TRLInstallError("torch is not installed in this interpreter; run from the project venv (.venv/bin/python)") from exc


def pins() -> list[str]:
    return [f"trl=={TRL_VERSION}", f"torch=={torch_version()}"]


def _has_trl(python: Path) -> bool:
    try:
        out = subprocess.run([str(python), "-c", "import trl; print(trl.__version__)"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == TRL_VERSION


def ensure_trl_venv() -> Path:
    """The venv's python, installing trl (and this interpreter's torch version) on first use."""
    venv = Path(os.environ.get("ROLLOUTBUS_BENCH_TRL_VENV", DEFAULT_VENV)).expanduser()
    python = venv / "bin" / "python"
    marker = venv / f".installed-trl-{TRL_VERSION}"
    if marker.exists() and python.exists():
        return python
    if python.exists() and _has_trl(python):
        marker.write_text(f"{TRL_VERSION}\n")
        return python
    wanted = pins()
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, text=True, timeout=120)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *wanted], check=True, capture_output=True, text=True, timeout=1800)
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise TRLInstallError(f"installing {' '.join(wanted)} into {venv} failed: {last[-1] if last else exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise TRLInstallError(f"installing trl=={TRL_VERSION} took over {exc.timeout:.0f}s; check PyPI access") from exc
    marker.write_text(f"{TRL_VERSION}\n")
    return python


if __name__ == "__main__":
    print(ensure_trl_venv())
