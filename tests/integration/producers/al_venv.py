"""Agent Lightning 0.3.0 in its own virtualenv, for the compatibility tests; cached like the bench's.

0.3.0 is what pip resolves on Python 3.11 and the line whose tracers export OTLP. Its OpenTelemetry
range is open (>=1.35), but 1.45 breaks it, so the venv pins 1.44. Installed once under
``~/.cache/rolloutbus/test-agentlightning-0.3.0`` (a marker file makes later runs skip it; override the
place with ``ROLLOUTBUS_TEST_AL_VENV``). A failed install raises :class:`ALInstallError` — the tests
fail with its message, they never skip.

:func:`ensure_venv_1x` does the same for Agent Lightning 1.x (its event URL clients), which needs
Python >= 3.12: ``ROLLOUTBUS_TEST_AL_PYTHON`` if set, else ``python3.13``/``python3.12`` on the PATH, else
one under ``~/.pyenv/versions`` (as the bench finds one); cached under
``~/.cache/rolloutbus/test-agentlightning-1.0.2`` (``ROLLOUTBUS_TEST_AL1_VENV``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

AL_VERSION = "0.3.0"
PINS = [f"agentlightning=={AL_VERSION}", "opentelemetry-api==1.44.*", "opentelemetry-sdk==1.44.*",
        "opentelemetry-exporter-otlp-proto-http==1.44.*"]
DEFAULT_VENV = Path.home() / ".cache" / "rolloutbus" / f"test-agentlightning-{AL_VERSION}"
AL1_VERSION = "1.0.2"
DEFAULT_VENV_1X = Path.home() / ".cache" / "rolloutbus" / f"test-agentlightning-{AL1_VERSION}"
DRIVER = Path(__file__).resolve().parent / "al_driver.py"
# Its litellm import otherwise tries the network for a price table, with retries.
ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "AGENTOPS_API_KEY": ""}


class ALInstallError(RuntimeError):
    """agentlightning could not be installed into its virtualenv."""


def ensure_venv() -> Path:
    """The venv's python, installing agentlightning (and the OTel pin) on first use."""
    venv = Path(os.environ.get("ROLLOUTBUS_TEST_AL_VENV", DEFAULT_VENV))
    python = venv / "bin" / "python"
    marker = venv / f".installed-agentlightning-{AL_VERSION}"
    if marker.exists() and python.exists():
        return python
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, text=True, timeout=120)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PINS], check=True, capture_output=True, text=True, timeout=900)
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise ALInstallError(f"installing {' '.join(PINS)} into {venv} failed: {last[-1] if last else exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ALInstallError(f"installing agentlightning=={AL_VERSION} took over {exc.timeout:.0f}s; check PyPI access") from exc
    marker.write_text(f"{AL_VERSION}\n")
    return python


def _python_312() -> str:
    explicit = os.environ.get("ROLLOUTBUS_TEST_AL_PYTHON")
    candidates = [explicit] if explicit else [shutil.which(n) for n in ("python3.13", "python3.12")]
    if not explicit:
        candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[2-9]*/bin/python3")), reverse=True)
    for exe in candidates:
        if not exe:
            continue
        try:
            out = subprocess.run([exe, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                                 capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip() == "True":
            return exe
    raise ALInstallError(f"agentlightning {AL1_VERSION} needs Python >= 3.12 and none was found "
                         f"({'ROLLOUTBUS_TEST_AL_PYTHON=' + explicit if explicit else 'PATH and ~/.pyenv'}); "
                         "install one or set ROLLOUTBUS_TEST_AL_PYTHON=/path/to/python3.12")


def ensure_venv_1x() -> Path:
    """The python of a venv with agentlightning 1.x (its ``AgentLightningSyncClient``), installed on first use."""
    venv = Path(os.environ.get("ROLLOUTBUS_TEST_AL1_VENV", DEFAULT_VENV_1X))
    python = venv / "bin" / "python"
    marker = venv / f".installed-agentlightning-{AL1_VERSION}"
    if marker.exists() and python.exists():
        return python
    try:
        if not python.exists():
            subprocess.run([_python_312(), "-m", "venv", str(venv)], check=True, capture_output=True, text=True, timeout=120)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"agentlightning=={AL1_VERSION}"],
                       check=True, capture_output=True, text=True, timeout=900)
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise ALInstallError(f"installing agentlightning=={AL1_VERSION} into {venv} failed: {last[-1] if last else exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ALInstallError(f"installing agentlightning=={AL1_VERSION} took over {exc.timeout:.0f}s; check PyPI access") from exc
    marker.write_text(f"{AL1_VERSION}\n")
    return python
