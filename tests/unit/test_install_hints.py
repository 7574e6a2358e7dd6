"""The one line a command prints for a missing extra names an extra pyproject declares, and a command that works.

rolloutbus is not on PyPI: ``pip install 'rolloutbus[gpu]'`` finds nothing, so no message may say it.
"""

from __future__ import annotations

import re
from pathlib import Path

from foundation.extras import checkout, extras, install_hint
from rolloutbus.cli import COMMAND_EXTRAS, missing_extra

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("foundation", "schemas", "producers", "streams", "trainer", "rolloutbus", "bench")


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts]


def test_every_extra_the_code_names_is_declared() -> None:
    declared = extras()
    assert {"all", "gpu", "rocksdb", "trainer", "store"} <= declared
    named = set(COMMAND_EXTRAS.values())
    for path in _sources():
        for group in re.findall(r"""install_hint\(\s*["']([\w,]+)["']""", path.read_text()):
            named |= set(group.split(","))
    assert named and named <= declared, sorted(named - declared)


def test_no_message_sends_users_to_pypi_for_rolloutbus() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}" for p in _sources() for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"pip install ['\"]?rolloutbus\[", line)]
    assert found == []


def test_the_hint_names_this_checkout_or_says_to_use_one(tmp_path: Path) -> None:
    assert checkout() == ROOT
    assert install_hint("trainer,gpu") == f"pip install -e '{ROOT}[trainer,gpu]'"
    assert install_hint("store", tmp_path) == "pip install -e '.[store]' in a rolloutbus checkout (it is not on PyPI)"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    assert checkout(tmp_path) is None and extras(tmp_path) == set()
    line = missing_extra("store", ModuleNotFoundError("No module named 'chdb'", name="chdb"))
    assert line == f"`rolloutbus store` needs the 'store' extra, and chdb is not installed: pip install -e '{ROOT}[store]'"


def test_all_spells_out_every_cpu_extra() -> None:
    """``all`` (what `make setup` and the Dockerfile install) holds every package of the CPU extras: a package added
    to one of them alone (peft to `trainer`, once) would be missing from a fresh machine's venv."""
    import re
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~;\[ ]", r)[0].lower() for r in reqs}

    # GPU-only and the optional state store stay apart; the trackers' clients (MLflow's and W&B's, some 100 MB with
    # their dependencies) too, outside the image's default, and `make setup` installs them beside `all`
    missing = {extra: sorted(names(reqs) - names(extras["all"])) for extra, reqs in extras.items()
               if extra not in ("all", "test", "gpu", "rocksdb", "trackers")}
    assert missing == {k: [] for k in missing}
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "-e '.[all,test,trackers]'" in makefile
