"""What the project's own files install (``make setup``, ``make test``'s prerequisites): a test that finds one of them
missing skips outside CI, with the one line that says how to install it, and fails in CI (``CI=true``, which
``.ci/run`` sets), so that a green ``make test`` never hides a part that did not run.

    from tests.installs import installed, missing

    langgraph = installed("langgraph", "pip install -e '.[test]'")
    if not shutil.which("chromium"):
        missing("Debian's chromium", "make browser-deps")

Only for what the project installs itself: a GPU, the ``gpu`` extra (vLLM on GPUs) or a broker given from outside are not,
and stay plain skips.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

CI_VALUES = ("1", "true", "yes")


def strict() -> bool:
    """Whether a missing install fails the test: in CI (``CI`` set to true, 1 or yes)."""
    return os.environ.get("CI", "").strip().lower() in CI_VALUES


def missing(what: str, how: str) -> NoReturn:
    """``what`` is not here: skip with ``how`` to install it, or in CI fail saying so."""
    line = f"not installed here: {what} (install: {how})"
    if strict():
        pytest.fail(f"{line} (CI=true: the project's own files install it, so its tests may not skip)", pytrace=False)
    pytest.skip(line, allow_module_level=True)  # also where a module needs it at import


def installed(module: str, how: str) -> ModuleType:
    """``import module``, as :func:`pytest.importorskip` does, but strict in CI (see :func:`missing`)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing(f"the Python package {module!r} ({exc})", how)


__all__ = ["installed", "missing", "strict"]
