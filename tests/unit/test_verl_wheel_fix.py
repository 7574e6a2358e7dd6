"""The fix of verl's wheel (deploy/python/verl_wheel_fix.py) is checked against the verl installed: an upgrade of the
pin in deploy/python/verl-core.txt fails here until someone looks at the new wheel again; and this project's
``tests`` is the one Python finds, not the one verl's wheel ships."""

from __future__ import annotations

import importlib.util
from importlib.metadata import version
from pathlib import Path

import tests
from tests.installs import installed

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_verl_is_the_one_the_fix_was_checked_on() -> None:
    installed("verl", "make verl-core (make setup installs it)")
    spec = importlib.util.spec_from_file_location("verl_wheel_fix", ROOT / "deploy" / "python" / "verl_wheel_fix.py")
    assert spec is not None and spec.loader is not None
    fix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fix)
    pinned = next(line.split("==")[1] for line in (ROOT / "deploy/python/verl-core.txt").read_text().splitlines()
                  if line.startswith("verl=="))
    assert version("verl") == pinned == fix.CHECKED
    # pytest may list the folder more than once in the namespace path; what counts is that no other folder is there
    assert {Path(p).resolve() for p in tests.__path__} == {ROOT / "tests"}
    assert importlib.util.find_spec("tests.installs").origin == str(ROOT / "tests" / "installs.py")
