"""`rolloutbus demo --help` states the defaults the code applies, per task."""

from __future__ import annotations

import argparse

from rolloutbus.demo import add_arguments
from rolloutbus.demo.driver import DemoConfig


def _help(flag: str) -> str:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return next(a.help for a in p._actions if flag in a.option_strings)  # type: ignore[return-value]


def _cfg(*argv: str) -> DemoConfig:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return DemoConfig.from_args(p.parse_args(list(argv)))


def test_help_gives_each_tasks_default_as_the_config_applies_it() -> None:
    calc, sql = _cfg(), _cfg("--task", "sql")
    quick, sql_quick = _cfg("--quick"), _cfg("--task", "sql", "--quick")
    assert f"default {calc.minutes:g}; --task sql {sql.minutes:g}; --quick: {quick.minutes:g}, with --task sql {sql_quick.minutes:g}" \
        in _help("--minutes")
    assert f"default {calc.kl_beta:g}; --task sql {sql.kl_beta:g}" in _help("--kl-beta")
    assert f"default {calc.group_size}; --task sql {sql.group_size}; --quick {quick.group_size}" in _help("--group-size")
    assert f"default {calc.groups_per_step}; --task sql {sql.groups_per_step}; --quick {quick.groups_per_step}" in _help("--groups-per-step")
    assert (calc.lr, sql.lr) == (5e-4, 1e-4) and "default 5e-4; --task sql 1e-4" in _help("--lr")
    assert f"default {calc.held_out}" in _help("--held-out") and f"--quick {quick.held_out}, with --task sql {sql_quick.held_out}" in _help("--held-out")
    apo = _cfg("--task", "sql", "--algorithm", "apo")
    assert f"default {calc.runners}; --task sql --algorithm apo {apo.runners}; --quick {quick.runners}" in _help("--runners")
    assert sql.runners == calc.runners and sql_quick.runners == quick.runners
    assert f"default {calc.sft_epochs}; --quick {quick.sft_epochs}" in _help("--sft-epochs")
    assert f"default {sql.validation}; --quick {sql_quick.validation}" in _help("--validation")


def test_the_trainers_backlog_policy_reaches_the_demo_from_its_flag_or_its_variable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """--backlog (the learning bench's knob for a trainer behind generation): the flag, else ROLLOUTBUS_BACKLOG, else
    the trainer's own default; a bad variable is one line naming the flag and the variable."""
    import pytest

    from foundation.errors import SettingError

    assert _cfg().backlog == "oldest" and _cfg("--backlog", "newest").backlog == "newest"
    monkeypatch.setenv("ROLLOUTBUS_BACKLOG", "sample")
    assert _cfg().backlog == "sample" and _cfg("--backlog", "oldest").backlog == "oldest"
    monkeypatch.setenv("ROLLOUTBUS_BACKLOG", "latest")
    with pytest.raises(SettingError, match="--backlog.*ROLLOUTBUS_BACKLOG"):
        _cfg()
