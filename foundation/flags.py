"""argparse pieces every ``rolloutbus`` subcommand shares: a parser whose errors are one line, and
number types with a range, for the flags that no settings field backs.

Flags that fall back to a ``ROLLOUTBUS_*`` variable are checked by their settings field (see
:func:`foundation.config.load_settings`), so the rule lives in one place; :class:`Bounded` is for
the rest (``demo --runners``, ``run-agent --max-tasks``, ...). Its bounds are attributes, so a test
can read them off the parser.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn

_ARG_ERROR = re.compile(r"^argument (\S+): (.*)$", re.S)
_OUR_VALUE = re.compile(r"^bad value (.*?): (.*)$", re.S)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser that reports a bad command line in one line on stderr and exits 2.

    ``rolloutbus process: bad --credit: invalid choice: 'x' (choose from ...)`` instead of the usage
    block: the line is what a supervisor's log shows. Subparsers inherit the class.
    """

    def error(self, message: str) -> NoReturn:
        m = _ARG_ERROR.match(message)
        if m:
            flag = m.group(1).split("/")[-1]
            ours = _OUR_VALUE.match(m.group(2))
            message = f"bad value {ours.group(1)} ({flag}): {ours.group(2)}" if ours else f"bad {flag}: {m.group(2)}"
        else:  # a missing or unknown argument: point at the usage instead of printing it
            message = f"{message} (see {self.prog} --help)"
        self.exit(2, f"{self.prog}: {' '.join(message.split())}\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)


class Bounded:
    """An argparse ``type=``: ``kind`` (int or float) within ``ge``/``gt``/``le``/``lt``."""

    def __init__(self, kind: type[int] | type[float], *, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, lt: float | None = None) -> None:
        self.kind, self.ge, self.gt, self.le, self.lt = kind, ge, gt, le, lt
        self.__name__ = kind.__name__  # argparse names the type in its own messages

    @property
    def bounds(self) -> dict[str, float]:
        return {k: v for k, v in (("ge", self.ge), ("gt", self.gt), ("le", self.le), ("lt", self.lt)) if v is not None}

    def rule(self) -> str:
        words = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}
        return "must be " + " and ".join(f"{words[k]} {v}" for k, v in self.bounds.items())

    def __call__(self, text: str) -> Any:
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad value {text!r}: must be {'a whole number' if self.kind is int else 'a number'}") from None
        if value != value:  # NaN passes every comparison below
            raise argparse.ArgumentTypeError(f"bad value {text!r}: must be a number")
        if ((self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt)
                or (self.le is not None and value > self.le) or (self.lt is not None and value >= self.lt)):
            raise argparse.ArgumentTypeError(f"bad value {text!r}: {self.rule()}")
        return value

    def __repr__(self) -> str:
        return f"Bounded({self.kind.__name__}, {self.bounds})"


def describe_flags(parser: argparse.ArgumentParser, settings: str, dests: Any = None) -> None:
    """The flags' help gets each one's variable and default from the settings model ``settings`` (``module:Class``)
    when the help is shown (``--help``), not before: a command starts without importing the models.
    :func:`foundation.config.describe_now` does it; ``dests``: flag dest → settings field."""
    shown = parser.format_help

    def format_help() -> str:
        import importlib

        from foundation.config import describe_now

        module, name = settings.split(":")
        describe_now(parser, getattr(importlib.import_module(module), name), dests)
        parser.format_help = shown  # type: ignore[method-assign]
        return shown()

    parser.format_help = format_help  # type: ignore[method-assign]


__all__ = ["OneLineParser", "Bounded", "describe_flags"]
