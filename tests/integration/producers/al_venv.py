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
import subprocess
import tarfile
from pathlib import Path

from foundation import venvs

AL_VERSION = venvs.AL03_VERSION
PINS = venvs.AL03_PINS
DEFAULT_VENV = venvs.CACHE / f"test-agentlightning-{AL_VERSION}"
AL1_VERSION = venvs.AL1_VERSION
DEFAULT_VENV_1X = venvs.CACHE / f"test-agentlightning-{AL1_VERSION}"
DEFAULT_SUITE_1X = venvs.CACHE / f"agentlightning-{AL1_VERSION}-server-tests"
SUITE_FILES = ("tests/__init__.py", "tests/server/__init__.py", "tests/server/test_endpoints.py")
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


def ensure_server_suite_1x(python: Path) -> Path:
    """Agent Lightning 1.x's own server tests (:data:`SUITE_FILES`, from its PyPI sdist, fetched with the venv's pip
    once) and pytest in its venv; → the folder holding ``tests/``. Cached under
    ``~/.cache/rolloutbus/agentlightning-1.0.2-server-tests`` (``ROLLOUTBUS_TEST_AL1_SUITE``)."""
    root = Path(os.environ.get("ROLLOUTBUS_TEST_AL1_SUITE", DEFAULT_SUITE_1X))
    pytest_marker = python.parent.parent / ".installed-pytest"
    try:
        if not pytest_marker.exists():
            subprocess.run([str(python), "-m", "pip", "install", "-q", "pytest==8.*"], check=True, capture_output=True,
                           text=True, timeout=300)
            pytest_marker.write_text("pytest\n")
        if not all((root / f).exists() for f in SUITE_FILES):
            root.mkdir(parents=True, exist_ok=True)
            subprocess.run([str(python), "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps", "-d", str(root),
                            f"agentlightning=={AL1_VERSION}"], check=True, capture_output=True, text=True, timeout=300)
            top = f"agentlightning-{AL1_VERSION}/"
            with tarfile.open(root / f"agentlightning-{AL1_VERSION}.tar.gz") as tar:
                for name in SUITE_FILES:
                    member = tar.getmember(top + name)
                    target = root / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise ALInstallError(f"fetching Agent Lightning {AL1_VERSION}'s server tests failed: {last[-1] if last else exc}") from exc
    return root
