"""verl's wheel ships its own test suite as a top-level package named ``tests``: installed into site-packages, it hides
this project's ``tests/`` (``from tests.installs import ...`` then fails everywhere). This removes the files verl's
RECORD lists under ``tests/`` and the folders they leave empty; nothing else. ``make verl-core`` runs it after the
install.

Checked on verl 0.9.1 only: on another version it stops, so an upgrade looks again (does the wheel still ship
``tests``?) and updates :data:`CHECKED`.
"""

from __future__ import annotations

import sys
from importlib.metadata import distribution
from pathlib import Path

CHECKED = "0.9.1"


def main() -> int:
    verl = distribution("verl")
    if verl.version != CHECKED:
        print(f"verl_wheel_fix: checked on verl {CHECKED}, this is {verl.version}: see whether its wheel still installs a "
              f"top-level `tests` package, then update CHECKED in {__file__}", file=sys.stderr)
        return 1
    files = [Path(str(f.locate())) for f in verl.files or [] if f.parts and f.parts[0] == "tests"]
    for path in files:
        path.unlink(missing_ok=True)
    for folder in sorted({p.parent for p in files}, key=lambda p: len(p.parts), reverse=True):
        for cache in folder.glob("__pycache__"):
            for f in cache.iterdir():
                f.unlink()
            cache.rmdir()
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    print(f"verl_wheel_fix: removed verl's {len(files)} `tests` files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
