"""Agent Lightning 0.3.0 in its own virtualenv, for the compatibility tests; made by the benches' own maker
(:func:`foundation.venvs.ensure_venv`, which the tests may import), cached apart from the bench's venvs.

0.3.0 is what pip resolves on Python 3.11 and the line whose tracers export OTLP. Its OpenTelemetry
range is open (>=1.35), but 1.45 breaks it, so the venv pins 1.44. Installed once under
``~/.cache/rolloutbus/test-agentlightning-0.3.0`` (a marker file makes later runs skip it; override the
place with ``ROLLOUTBUS_TEST_AL_VENV``). A failed install raises :class:`ALInstallError` — the tests
fail with its message, they never skip.

:func:`ensure_venv_1x` does the same for Agent Lightning 1.x (its event URL clients), which needs
Python >= 3.12: ``ROLLOUTBUS_TEST_AL_PYTHON`` if set, else ``python3.13``/``python3.12`` on the PATH, else
one under ``~/.pyenv/versions`` (:func:`foundation.venvs.find_python`); cached under
``~/.cache/rolloutbus/test-agentlightning-1.0.2`` (``ROLLOUTBUS_TEST_AL1_VENV``).
"""

from __future__ import annotations

import os
from pathlib import Path

from foundation import venvs

AL_VERSION = venvs.AL03_VERSION
PINS = venvs.AL03_PINS
DEFAULT_VENV = venvs.CACHE / f"test-agentlightning-{AL_VERSION}"
AL1_VERSION = venvs.AL1_VERSION
DEFAULT_VENV_1X = venvs.CACHE / f"test-agentlightning-{AL1_VERSION}"
DRIVER = Path(__file__).resolve().parent / "al_driver.py"
# Its litellm import otherwise tries the network for a price table, with retries.
ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "AGENTOPS_API_KEY": ""}


class ALInstallError(venvs.VenvError):
    """agentlightning could not be installed into its virtualenv."""


def ensure_venv() -> Path:
    """The venv's python, installing agentlightning (and the OTel pin) on first use."""
    return venvs.ensure_venv(Path(os.environ.get("ROLLOUTBUS_TEST_AL_VENV", DEFAULT_VENV)), PINS, error=ALInstallError)


def ensure_venv_1x() -> Path:
    """The python of a venv with agentlightning 1.x (its ``AgentLightningSyncClient``), installed on first use."""
    return venvs.ensure_venv(
        Path(os.environ.get("ROLLOUTBUS_TEST_AL1_VENV", DEFAULT_VENV_1X)), venvs.AL1_PINS, error=ALInstallError,
        base=lambda: venvs.find_python("ROLLOUTBUS_TEST_AL_PYTHON", f"agentlightning {AL1_VERSION}", ALInstallError))
