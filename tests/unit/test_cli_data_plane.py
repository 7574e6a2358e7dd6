"""What ``rolloutbus`` sets up for its data-plane processes before they run."""

from __future__ import annotations

import argparse
import importlib
import os

import pytest

from rolloutbus import cli


@pytest.mark.parametrize("command, runs_single_threaded_blas", [("store", True), ("gateway", True), ("train", False)])
def test_blas_threads_are_one_for_the_data_plane_only(monkeypatch: pytest.MonkeyPatch, command: str,
                                                       runs_single_threaded_blas: bool) -> None:
    """The data plane does no linear algebra; OpenBLAS's spinning thread pool (numpy comes in with the
    ClickHouse client) would only cost it CPU. The trainer keeps the machine's default."""
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    seen: dict[str, str | None] = {}

    def run(args: argparse.Namespace) -> int:
        seen["blas"] = os.environ.get("OPENBLAS_NUM_THREADS")
        return 0

    monkeypatch.setattr(importlib.import_module(cli.COMPONENTS[command][0]), "run", run)
    assert cli.main([command]) == 0
    assert seen["blas"] == ("1" if runs_single_threaded_blas else None)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
