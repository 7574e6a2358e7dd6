"""The containers of one compose file or kustomization as the code reads them: each command parsed by the
real ``rolloutbus`` parser, and the settings its process would build from its flags and environment.

Computed on first use: the schema steps (the tool venv, without the project's packages) never ask.
"""

from __future__ import annotations

import argparse
from functools import cached_property
from typing import Any, Iterator, NamedTuple

import facts
from model import Container


class Process(NamedTuple):
    """A container whose command parses: the namespace the CLI gives it, the settings it would read."""

    container: Container
    ns: argparse.Namespace
    settings: Any


class Processes:
    """The rolloutbus containers of one file, parsed once for every rule that looks at them."""

    def __init__(self, containers: list[Container]) -> None:
        self.containers = containers

    @cached_property
    def parsed(self) -> list[tuple[Container, argparse.Namespace | None, str | None]]:
        """Each container with its namespace, or with the parser's one-line error."""
        return [(c, *facts.parse(c.argv)) for c in self.containers]

    @cached_property
    def ok(self) -> list[Process]:
        """The containers whose command parses, with their settings."""
        return [Process(c, ns, facts.settings_for(ns.command, ns, c.env)) for c, ns, _ in self.parsed if ns is not None]

    def __iter__(self) -> Iterator[Process]:
        return iter(self.ok)
