"""The one shape of every command entry: parse the flags, read the settings once, configure logging,
run, and turn an error into one clear line with an exit status.

``rolloutbus COMMAND`` (the applications' router) and each component's ``python -m <package>.<x>_cli``
share it: a component module exposes ``add_arguments(parser)`` and ``run(args) -> int``, and its
``main`` is ``run_command("rolloutbus NAME", add_arguments, run, argv)``.

Exit statuses: 0 done; 1 a service or data error (:class:`~foundation.errors.RolloutbusError`);
2 a flag or setting that cannot work (:class:`~foundation.errors.ConfigError`, argparse errors);
130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic_settings import BaseSettings

from foundation.config import CommonSettings, load_settings, setting_error
from foundation.errors import ConfigError, RolloutbusError
from foundation.flags import OneLineParser

S = TypeVar("S", bound=BaseSettings)
AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], "int | None"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def settings_from_args(cls: type[S], args: argparse.Namespace, flags: Mapping[str, str]) -> S:
    """``cls`` read from ``ROLLOUTBUS_*`` with the given flags on top: explicit flag beats variable beats default.

    ``flags`` maps each argparse destination to its settings field; a flag left at None falls back.
    ``--data-dir`` applies when the parser has it. A bad value names both the flag and the variable.
    """
    overrides: dict[str, Any] = {field: getattr(args, dest) for dest, field in flags.items()
                                 if getattr(args, dest, None) is not None}
    if getattr(args, "data_dir", None) is not None:
        overrides["data_dir"] = args.data_dir
    names = {field: "--" + dest.replace("_", "-") for dest, field in flags.items()}
    return load_settings(cls, overrides, names)


def configure_logging(verbose: bool = False) -> None:
    """INFO (DEBUG with ``-v``) to stderr; HTTP clients' per-request INFO lines only with ``-v``."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=LOG_FORMAT)
    if not verbose:
        # HTTP clients (the openai client's among them) log every request at INFO: one line per LLM call.
        for name in ("httpx", "httpx2", "httpcore", "httpcore2"):
            logging.getLogger(name).setLevel(logging.WARNING)


def guarded(prog: str, run: Run, args: argparse.Namespace) -> int:
    """``run(args)``, with every error the project raises turned into one line on stderr and a status."""
    verbose = bool(getattr(args, "verbose", False))

    def fail(exc: BaseException, line: str, status: int) -> int:
        if verbose:
            traceback.print_exception(exc)
        print(f"{prog}: {' '.join(line.split())}", file=sys.stderr)
        return status

    try:
        return int(run(args) or 0)
    except ConfigError as exc:  # a flag or setting that cannot work (SettingError names flag and variable)
        return fail(exc, str(exc), 2)
    except RolloutbusError as exc:
        return fail(exc, str(exc), 1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # A settings class read without load_settings still gets its one line (no flag to name).
        from pydantic import ValidationError

        classes = _settings_classes(CommonSettings)
        if not (isinstance(exc, ValidationError) and exc.title in classes):
            raise
        return fail(exc, str(setting_error(classes[exc.title], exc, {})), 2)


def _settings_classes(root: type) -> dict[str, Any]:
    """``root`` and every settings class derived from it (those that read ``ROLLOUTBUS_*``), by name."""
    found, todo = {}, [root]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def run_command(prog: str, add_arguments: AddArguments, run: Run, argv: list[str] | None = None,
                description: str | None = None) -> int:
    """A component's own entry (``python -m streams.cli``): the same flags and errors as ``rolloutbus NAME``."""
    parser = OneLineParser(prog=prog, description=description)
    parser.add_argument("--data-dir", default=None, help="local state directory (env ROLLOUTBUS_DATA_DIR, default ~/.rolloutbus)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG; errors show their traceback")
    add_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    return guarded(prog, run, args)


__all__ = ["configure_logging", "guarded", "run_command", "settings_from_args"]
