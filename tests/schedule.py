"""The order `make test`'s parallel pass hands test files out in: the slowest first (longest processing time first).

pytest-xdist's ``--dist loadfile`` gives each free worker the next file of its queue. By default it sorts that queue by
the number of tests in a file, so the files of many quick unit tests went first and the one-test files that take
minutes (the demo, the trainer's end-to-end tests) last: the pass ended with those running while the other workers
had nothing left (the last 7 % of the tests took 13 of its 30 minutes, 2026-12-03). `make test` turns that sort off
(``--no-loadscope-reorder``) and each worker orders its collection with :func:`slowest_files_first`, from the seconds
each file took in a recorded run (:data:`RECORDED`); files not recorded keep their place after the recorded ones.

Refresh the record after tests were added or made slower (the order is only a hint: a stale one makes the pass
longer, never wrong):

    make test PYTEST_ARGS="--record-durations tests/durations.json"
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

RECORDED = Path(__file__).with_name("durations.json")
ENV = "ROLLOUTBUS_TEST_DURATIONS"  # another record to order by (the tests of this module use their own)
MIN_RECORDED_S = 5.0  # files quicker than this are left out of the record: their order does not matter

T = TypeVar("T")


def file_of(nodeid: str) -> str:
    """The test file of a node id (``tests/unit/x_test.py::test_y[1]`` → ``tests/unit/x_test.py``)."""
    return nodeid.split("::", 1)[0]


def slowest_files_first(nodeids: Sequence[str], seconds: Mapping[str, float]) -> list[int]:
    """The positions of ``nodeids`` reordered: whole files, the most ``seconds`` first; files without a figure after
    them, each file and each test within it in its collected order. Pure."""
    by_file: dict[str, list[int]] = {}
    for i, nodeid in enumerate(nodeids):
        by_file.setdefault(file_of(nodeid), []).append(i)
    order = sorted(by_file, key=lambda f: -seconds.get(f, 0.0))  # stable: ties keep the collected order
    return [i for f in order for i in by_file[f]]


def reorder(items: list[T], seconds: Mapping[str, float]) -> None:
    """pytest's ``items`` (each with its ``nodeid``) in place, in :func:`slowest_files_first`'s order."""
    items[:] = [items[i] for i in slowest_files_first([item.nodeid for item in items], seconds)]  # type: ignore[attr-defined]


def read(path: Path | None = None) -> dict[str, float]:
    """The recorded seconds per file (``path``, else ``$ROLLOUTBUS_TEST_DURATIONS``, else :data:`RECORDED`); empty where
    there is no record."""
    path = path or Path(os.environ.get(ENV) or RECORDED)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in data.items()}


def total_by_file(reports: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Seconds per file from (node id, seconds) of every phase (setup, call, teardown) of every test. Pure."""
    totals: dict[str, float] = {}
    for nodeid, seconds in reports:
        totals[file_of(nodeid)] = totals.get(file_of(nodeid), 0.0) + seconds
    return totals


def merged(old: Mapping[str, float], new: Mapping[str, float]) -> dict[str, float]:
    """The record after a run: this run's figure for every file it ran (two passes of ``make test`` write to one
    record, each with its own files), the old one for the others; files under :data:`MIN_RECORDED_S` dropped. Pure."""
    both = {**old, **new}
    return {f: round(s, 1) for f, s in sorted(both.items()) if s >= MIN_RECORDED_S}


def record(path: Path, reports: Iterable[tuple[str, float]]) -> None:
    """Write this run's seconds per file into the record at ``path`` (:func:`merged`)."""
    path.write_text(json.dumps(merged(read(path), total_by_file(reports)), indent=0) + "\n")


__all__ = ["ENV", "MIN_RECORDED_S", "RECORDED", "file_of", "merged", "read", "record", "reorder", "slowest_files_first",
           "total_by_file"]
