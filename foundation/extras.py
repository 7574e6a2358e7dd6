"""How a user installs one of the project's extras (pyproject's ``[project.optional-dependencies]``).

rolloutbus is not on PyPI, so asking pip for ``rolloutbus[gpu]`` finds nothing: the one line a command prints
for a missing extra names the checkout it runs from (an editable install, as ``make setup`` makes), or says
to install from one. Standard library only.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkout(root: Path = ROOT) -> Path | None:
    """The rolloutbus checkout these modules run from (its pyproject.toml beside them); None for an installed copy."""
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    except (OSError, ValueError, KeyError):
        return None
    return root if project.get("name") == "rolloutbus" else None


def extras(root: Path = ROOT) -> set[str]:
    """The extras the checkout's pyproject.toml declares (empty for an installed copy)."""
    try:
        return set(tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    except (OSError, ValueError, KeyError):
        return set()


def install_hint(names: str, root: Path = ROOT) -> str:
    """The command that installs extras ``names`` (``"trainer,gpu"``): ``pip install -e '<checkout>[names]'``."""
    where = checkout(root)
    if where is not None:
        return f"pip install -e '{where}[{names}]'"
    return f"pip install -e '.[{names}]' in a rolloutbus checkout (it is not on PyPI)"


__all__ = ["checkout", "extras", "install_hint"]
