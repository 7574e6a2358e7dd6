"""Hugging Face TRL in its own virtualenv, for the learning benchmark's baseline (``bench/learning_trl.py``).

TRL cannot share the project venv: its dependencies move click past faust-streaming's pin. So it is
installed once, with the same torch version as the running interpreter's (no local ``+cu...`` suffix),
under ``~/.cache/rolloutbus/bench-trl-1.16.0`` (override the place with ``ROLLOUTBUS_BENCH_TRL_VENV``);
a marker file makes later runs skip it. A venv that already imports trl 1.16.0 but has no marker (one
installed by hand) is accepted and marked. A failed install raises :class:`TRLInstallError` with pip's
last line. The venv is made by :func:`foundation.venvs.ensure_venv`, as the Agent Lightning ones are.

    .venv/bin/python -m bench.trl_venv    # prints the venv's python, installing it first if need be
"""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

from foundation.venvs import CACHE, VenvError, ensure_venv

TRL_VERSION = "1.16.0"
DEFAULT_VENV = CACHE / f"bench-trl-{TRL_VERSION}"


class TRLInstallError(VenvError):
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
    from foundation.config import load_settings
    from rolloutbus.bench_settings import BenchSettings

    venv = (load_settings(BenchSettings).bench_trl_venv or DEFAULT_VENV).expanduser()
    return ensure_venv(venv, pins(), timeout=1800, error=TRLInstallError, present=_has_trl)


if __name__ == "__main__":
    print(ensure_trl_venv())
