"""What a bench prints: a nearest-rank quantile, the ``measure  result  target`` table, the one JSON line of
``--json``, progress on stderr. Standard library only: Agent Lightning's interpreter imports it too
(``agentlightning_store.py --driver``)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any


def pct(samples: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``samples``; NaN when empty."""
    if not samples:
        return float("nan")
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def print_table(title: str, rows: list[tuple[str, str, str]], notes: Sequence[str] = ()) -> None:
    """``measure  result  target`` rows, then notes."""
    w = max([len("measure")] + [len(r[0]) for r in rows])
    v = max([len("result")] + [len(r[1]) for r in rows])
    print(title)
    print(f"{'measure'.ljust(w)}  {'result'.rjust(v)}  target")
    print(f"{'-' * w}  {'-' * v}  ------")
    for name, value, target in rows:
        print(f"{name.ljust(w)}  {value.rjust(v)}  {target}")
    for n in notes:
        print(f"  note: {n}")


def emit_json(bench: str, metrics: dict[str, Any], notes: list[str], **extra: Any) -> None:
    """The ``--json`` output every bench of ours prints: one object on stdout."""
    print(json.dumps({"bench": bench, "metrics": metrics, "notes": notes, "time": time.time(), **extra}, default=str))


def log(msg: str) -> None:
    """Progress on stderr (stdout is the table or the JSON)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


__all__ = ["pct", "print_table", "emit_json", "log"]
