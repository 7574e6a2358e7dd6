"""Every flag of every ``rolloutbus`` subcommand, fed a value just outside its rule, and every
``ROLLOUTBUS_*`` fallback the same through the environment: exit status 2, one line on stderr that
names the flag (or the variable), no traceback, and nothing started or bound first.

The cases are found by walking the real parser, so a flag added later is covered without editing
this file. A flag's rule is read from where the command takes it: a ``Bounded`` type or ``choices``
on the argparse action, or the settings field the flag falls back to (found from the
``ROLLOUTBUS_*`` variable its help names, else from its dest). A numeric flag with no rule fails
the test. ``EXTRA`` lists the values whose badness cannot be inferred (paths, URLs).

Commands run in-process through ``rolloutbus.cli.main``; anything that would start a process, bind
or connect a socket, or make a Kafka client raises instead, so a value that slips through fails the
test fast instead of reaching for a broker.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import signal
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from rolloutbus import cli
from foundation.config import CommonSettings, setting_bounds
from foundation.flags import Bounded

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2-secret"
BOGUS = "bogus-choice"
MISSING = "/nonexistent/rolloutbus-test-path"

# (flag, value) whose badness no type or bound says: paths that must exist, URLs that must parse.
EXTRA: dict[str, list[str]] = {
    "--reward-rules": [MISSING],
    "--model": [MISSING],
    "--upstream": ["localhost:8000", "http://host:99999/v1"],
    "--data-dir": [str(ROOT / "pyproject.toml")],  # a file, not a directory
    "--state-store": ["redis://x"],
    "--agent-match": ["solver("],
    "--llm-url": ["localhost:8000"],
    "--scrape": ["http://gw:4318/metrics,gw2:4318"],
    "--candidates": [MISSING],
    "--initial": [MISSING],
    "--run-id": ["Bad Id"],
    "--policy-loss": ["no-such-loss"],
}

# Variables every command that reads its settings checks, with a value that breaks their rule.
COMMON_ENV: list[tuple[str, str]] = [
    ("ROLLOUTBUS_KAFKA_PORT", "0"),
    ("ROLLOUTBUS_KAFKA_PORT", "65536"),
    ("ROLLOUTBUS_KAFKA_BOOTSTRAP", "kafka-1:9092,kafka-2:port"),
    ("ROLLOUTBUS_KAFKA_BOOTSTRAP", "kafka-1:70000"),
    ("ROLLOUTBUS_KAFKA_SECURITY_PROTOCOL", "BOGUS"),
    ("ROLLOUTBUS_KAFKA_SASL_MECHANISM", "BOGUS"),
    ("ROLLOUTBUS_KAFKA_SSL_CA_LOCATION", MISSING),
    ("ROLLOUTBUS_CLICKHOUSE_DSN", f"mysql://default:{SECRET}@db:3306/x"),
    ("ROLLOUTBUS_CLICKHOUSE_DSN", f"http://default:{SECRET}@db:notaport/x"),
    ("ROLLOUTBUS_CLICKHOUSE_DATABASE", "1-bad"),
    ("ROLLOUTBUS_TOPIC_PREFIX", "rb/"),
    ("ROLLOUTBUS_DATA_DIR", str(ROOT / "pyproject.toml")),
]


# --------------------------------------------------------------------------- walking the parser


def _leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        parser.format_help()  # the flags' variables and defaults are added to their help when it is shown
        yield path, parser
        return
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaf_parsers(sub, (*path, name))


def _settings_classes() -> list[type[CommonSettings]]:
    # Top-level packages' settings modules and their subpackages' (rolloutbus/store, rolloutbus/dashboard).
    for settings in sorted([*ROOT.glob("*/settings.py"), *ROOT.glob("*/*/settings.py")]):
        if (settings.parent / "__init__.py").is_file():
            importlib.import_module(".".join(settings.relative_to(ROOT).with_suffix("").parts))
    seen: list[type[CommonSettings]] = [CommonSettings]
    for cls in seen:
        seen.extend(c for c in cls.__subclasses__() if c not in seen)
    return seen


CLASSES = _settings_classes()
PARSER = cli.build_parser()
LEAVES = [(path, p) for path, p in _leaf_parsers(PARSER) if p.get_default("unavailable") is None]


def _field(action: argparse.Action) -> tuple[str, type[CommonSettings]] | None:
    """The settings field a flag falls back to: the variable its help names, else its dest.

    A ``Bounded`` flag has no settings field unless its help names one."""
    m = re.search(r"\(env ROLLOUTBUS_([A-Z0-9_]+)", action.help or "") or re.search(r"ROLLOUTBUS_([A-Z0-9_]+)", action.help or "")
    names = [m.group(1).lower()] if m else [] if isinstance(action.type, Bounded) else [action.dest]
    for name in names:
        for cls in CLASSES:
            if name in cls.model_fields:
                return name, cls
    return None


def _outside(kind: Any, bounds: dict[str, float]) -> list[str]:
    """Values just outside ``bounds``: one below the low end, one above the high end."""
    step = 1 if kind is int else 0.01
    out = []
    if "ge" in bounds:
        out.append(bounds["ge"] - step)
    if "gt" in bounds:
        out.append(bounds["gt"])
    if "le" in bounds:
        out.append(bounds["le"] + step)
    if "lt" in bounds:
        out.append(bounds["lt"])
    return [str(kind(v)) for v in out]


def _numeric_kind(action: argparse.Action, field: tuple[str, type[CommonSettings]] | None) -> Any:
    if isinstance(action.type, Bounded):
        return action.type.kind
    if action.type in (int, float):
        return action.type
    if field is not None and action.type is None and action.nargs != 0:
        annotation = repr(field[1].model_fields[field[0]].annotation)
        return int if annotation.startswith("<class 'int'>") else float if annotation.startswith("<class 'float'>") else None
    return None


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    names: tuple[str, ...]  # what the one line must name
    env: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env)
        return f"{env} rolloutbus {' '.join(self.argv)}".strip()


def _base_argv(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """The subcommand with a placeholder for each required positional (values are checked first)."""
    placeholders = [("some.module:Thing" if "agent" in a.dest else "placeholder") for a in parser._actions
                    if not a.option_strings and a.required and not isinstance(a, argparse._SubParsersAction)]
    return [*path, *placeholders]


def _flag_cases() -> tuple[list[Case], list[str]]:
    cases: list[Case] = []
    unruled: list[str] = []
    for path, parser in LEAVES:
        base = _base_argv(path, parser)
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[-1]
            field = _field(action)
            env = f"ROLLOUTBUS_{field[0].upper()}" if field else None
            bad: list[str] = []
            if action.choices is not None:
                bad = [BOGUS]
            elif (kind := _numeric_kind(action, field)) is not None:
                bounds = action.type.bounds if isinstance(action.type, Bounded) else setting_bounds(field[1], field[0]) if field else {}
                bad = ["not-a-number", *_outside(kind, bounds)]
                if not bounds:
                    unruled.append(f"rolloutbus {' '.join(path)} {flag}")
            bad += EXTRA.get(flag, [])
            for value in bad:
                cases.append(Case((*base, flag, value), (flag,)))
                # the same value through the variable the flag falls back to (not for argparse choices:
                # those reach the settings field's own rule, also checked here)
                if env and value != "not-a-number":
                    cases.append(Case(tuple(base), (env,), ((env, value),)))
        # the global flags (rolloutbus --data-dir X COMMAND)
        for action in PARSER._actions:
            for value in EXTRA.get(action.option_strings[-1] if action.option_strings else "", []):
                cases.append(Case((action.option_strings[-1], value, *base), (action.option_strings[-1],)))
    return cases, unruled


FLAG_CASES, UNRULED = _flag_cases()
# Commands that read no ROLLOUTBUS_* settings, so a bad value in the environment is not theirs to refuse. None today:
# a command added here is one whose test below would fail otherwise, named on purpose (no silent skip).
READS_NO_SETTINGS: frozenset[tuple[str, ...]] = frozenset()
ENV_CASES = [Case(tuple(_base_argv(path, p)), (var,), ((var, value),)) for path, p in LEAVES for var, value in COMMON_ENV
             if tuple(path) not in READS_NO_SETTINGS]


# --------------------------------------------------------------------------- running one case


class Started(BaseException):
    """Something was about to start, bind or connect: the value was not checked first."""


_BINDINGS: list[tuple[str, str]] = []  # (module, name) bound to a Kafka client class, in the modules scanned so far
_SCANNED: set[str] = set()


def _kafka_bindings(kafka: set[Any]) -> list[tuple[str, str]]:
    """Where the loaded modules hold a Kafka client class: each module scanned once, when first seen loaded (a scan of
    every module for every case was half of this file's time run alone: 22 s against 10 s)."""
    with warnings.catch_warnings():  # some modules' deprecated objects warn when merely looked at
        warnings.simplefilter("ignore")
        for module_name, mod in list(sys.modules.items()):
            if module_name in _SCANNED:
                continue
            _SCANNED.add(module_name)
            for name, value in list(getattr(mod, "__dict__", {}).items()):
                if any(value is k for k in kafka):
                    _BINDINGS.append((module_name, name))
    return [(m, n) for m, n in _BINDINGS if m in sys.modules]


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, int]]:
    """A clean ROLLOUTBUS_* environment, nothing that can leave the process, and a time limit."""
    import os

    for key in list(os.environ):
        if key.startswith("ROLLOUTBUS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("ROLLOUTBUS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)

    def refuse(what: str) -> Any:
        def _refuse(*args: Any, **kwargs: Any) -> Any:
            raise Started(what)
        return _refuse

    monkeypatch.setattr(socket.socket, "bind", refuse("bound a socket"))
    monkeypatch.setattr(socket.socket, "connect", refuse("connected a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("started a process"))
    import confluent_kafka
    import confluent_kafka.admin

    kafka = {getattr(confluent_kafka, n) for n in ("Producer", "Consumer")} | {confluent_kafka.admin.AdminClient}
    for module, name in _kafka_bindings(kafka):
        monkeypatch.setattr(sys.modules[module], name, refuse(f"made a Kafka {name}"))
    # Count settings reads: a command that reads none has no ROLLOUTBUS_* variable to check.
    reads = {"settings": 0}
    original = CommonSettings.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        reads["settings"] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(CommonSettings, "__init__", counting)

    def timeout(signum: int, frame: FrameType | None) -> None:
        raise Started("was still running after 20 s")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    handlers = list(logging.getLogger().handlers)
    try:
        yield reads
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        logging.getLogger().handlers[:] = handlers


def _run(case: Case, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int | None, str, str | None]:
    for key, value in case.env:
        monkeypatch.setenv(key, value)
    started = None
    try:
        code: int | None = cli.main(list(case.argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2 if exc.code else 0
    except Started as exc:
        code, started = None, str(exc)
    err = capsys.readouterr().err
    return code, err, started


def _assert_one_line(case: Case, code: int | None, err: str, started: str | None) -> None:
    assert started is None, f"`{case}` {started} before rejecting the value"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, f"`{case}` exited {code}; stderr:\n{err}"
    assert "Traceback" not in err, f"`{case}` printed a traceback:\n{err}"
    assert len(lines) == 1, f"`{case}` printed {len(lines)} lines, not one:\n{err}"
    assert lines[0].startswith("rolloutbus "), lines[0]
    for name in case.names:
        assert name in lines[0], f"`{case}`: the line does not name {name}: {lines[0]}"
    assert SECRET not in err, f"`{case}` printed a secret: {lines[0]}"


# --------------------------------------------------------------------------- the tests


def test_the_walk_finds_every_subcommand_and_its_numeric_flags() -> None:
    commands = {path[0] for path, _ in LEAVES}
    assert {"up", "down", "status", "query", "process", "gateway", "proxy", "run-agent", "train", "serve"} <= commands
    flags = {c.argv[c.argv.index(c.names[0])] for c in FLAG_CASES if c.names[0].startswith("--")}
    assert {"--group-size", "--gamma", "--port", "--concurrency", "--groups-per-step", "--credit"} <= flags


def test_every_numeric_flag_has_a_rule() -> None:
    assert not UNRULED, (
        "numeric flags with no range: declare ge/gt/le/lt on the settings field they fall back to, "
        f"or give them type=Bounded(...): {UNRULED}"
    )


@pytest.mark.parametrize("case", FLAG_CASES, ids=str)
def test_a_bad_flag_value_is_one_line_exit_2(case: Case, guarded: dict[str, int], monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line(case, *_run(case, monkeypatch, capsys))


@pytest.mark.parametrize("case", ENV_CASES, ids=str)
def test_a_bad_environment_value_is_one_line_exit_2(case: Case, guarded: dict[str, int], monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, err, started = _run(case, monkeypatch, capsys)
    assert guarded["settings"] > 0 or code == 2, (f"`rolloutbus {' '.join(case.argv)}` read no ROLLOUTBUS_* settings, so "
                                                  f"{case.env[0][0]} went unchecked: name it in READS_NO_SETTINGS if that is meant")
    _assert_one_line(case, code, err, started)


@pytest.mark.parametrize("argv", [["process", "--group-size", "0"], ["process", "--gamma", "5"], ["gateway", "--port", "-5"],
                                  ["run-agent", "rolloutbus.demo.agent:CalcAgent", "--concurrency", "0"]])
def test_the_issue_table(argv: list[str], guarded: dict[str, int], monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    """The four commands of issue 19, with the rule each line states."""
    case = Case(tuple(argv), (argv[-2],))
    code, err, started = _run(case, monkeypatch, capsys)
    _assert_one_line(case, code, err, started)
    rule = {"--group-size": "must be at least 1", "--gamma": "must be at least 0.0 and at most 1.0",
            "--port": "must be at least 1 and at most 65535", "--concurrency": "must be at least 1"}[argv[-2]]
    assert err.strip().endswith(rule), err


def test_verbose_shows_the_traceback(guarded: dict[str, int], monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["-v", "process", "--gamma", "5"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err
    assert err.strip().splitlines()[-1].startswith("rolloutbus process: bad value '5.0' from --gamma (--gamma / ROLLOUTBUS_GAMMA)")


def test_a_secret_variable_is_never_shown(guarded: dict[str, int], monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from pydantic import SecretStr

    from foundation.config import load_settings
    from foundation.errors import SettingError

    class WithSecret(CommonSettings):
        api_token: SecretStr = SecretStr("x")

    monkeypatch.setenv("ROLLOUTBUS_API_TOKEN", "")  # a SecretStr holds any string: break it with a list
    with pytest.raises(SettingError) as info:
        load_settings(WithSecret, {"api_token": [SECRET]})
    assert "(value hidden)" in str(info.value) and SECRET not in str(info.value)
    assert "ROLLOUTBUS_API_TOKEN" in str(info.value)


def test_a_command_that_reads_settings_directly_still_gets_one_line(guarded: dict[str, int], monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The boundary also maps a settings class built without load_settings (a new command that forgot)."""
    import producers.ingest.gateway_cli
    from producers.ingest.settings import GatewaySettings

    monkeypatch.setattr(producers.ingest.gateway_cli, "run", lambda args: GatewaySettings(gateway_port=-1))
    case = Case(("gateway",), ("ROLLOUTBUS_GATEWAY_PORT",))
    _assert_one_line(case, *_run(case, monkeypatch, capsys))
