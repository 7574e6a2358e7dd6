"""The data plane's guard (``make bench-check``): the end-to-end bench at 100k spans, rolloutbus alone, this checkout
against the commit whose figures are recorded in ``bench/results/bench-check.json``, run alternately on this machine
in one sitting. Prints the verdict; exits 1 when a figure regressed past its tolerance. A bench, not a timed test: run
it on a quiet machine before a change to the data plane (producers/, streams/, schemas/, native/, the store) lands,
and quote its table in the change's note.

    python -m bench.check [--runs 3] [--paced-runs 2] [--record]

Each run is ``python -m bench.bench_e2e --spans 100000 --mixes default --systems rolloutbus --json`` in its own
tree (the recorded commit's, taken with ``git archive``; this checkout's), so each tree runs its own product with the
same load. Two loads, the medians compared:

- **as fast as the gateway takes them** (the bench's own load): µs of CPU per span (gateway + worker + store) and
  FINISHED → queryable p99. The 2-core machine is saturated then, so that p99 is the backlog's, and noisy;
- **paced at 3,300 spans/s** (``--rate 3300``, a load the machine keeps up with): FINISHED → queryable p99, the
  latency figure that moves when the worker or the store slows.

Why against the recorded commit and not against its numbers alone: this machine kind drifts between sittings by
more than any tolerance worth having (the same commit measured 88-121 and 124-145 µs per span two hours apart,
bench/results/e2e-2026-12-02/); alternating the two trees cancels the drift. Where the recorded commit cannot be
read (a shallow clone), the check compares with the recorded numbers and says so.

Tolerances, from the spread of three runs of one commit in one sitting (same folder): CPU per span +20 % over the
reference's median; p99 under saturation +50 %; paced p99 +30 % and at least +0.3 s. The 2.3× regression of issue
58 fails the first by far. ``--record`` runs this checkout alone and writes its medians, commit and machine as the
new reference: do it in the change that moves them on purpose (committed first), and say why.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import ROOT
from bench.report import log

BASELINE = ROOT / "bench" / "results" / "bench-check.json"
SPANS = 100_000
PACED_RATE = 3300.0


@dataclass(frozen=True)
class Limit:
    """A figure, its tolerance over the reference's median, and the words for it."""

    key: str
    label: str
    ratio: float  # allowed: reference × ratio
    floor: float = 0.0  # ... and at least reference + floor

    def allowed(self, reference: float) -> float:
        return max(reference * self.ratio, reference + self.floor)


LIMITS = (
    Limit("us_per_span", "µs CPU per span (gateway + worker + store), as fast as taken", 1.20),
    Limit("p99_s", "FINISHED→queryable p99 s, as fast as taken (saturated)", 1.50),
    Limit("paced_p99_s", f"FINISHED→queryable p99 s, {PACED_RATE:,.0f} spans/s offered", 1.30, 0.3),
)


def verdicts(reference: dict[str, float], now: dict[str, float]) -> list[tuple[Limit, float, float, float, bool]]:
    """(limit, reference, now, allowed, ok) for each figure both sides have. A figure above its allowed value fails.

    ``verdicts({"us_per_span": 140.0}, {"us_per_span": 300.0})`` → one row, allowed 168.0, not ok."""
    rows = []
    for lim in LIMITS:
        if lim.key in reference and lim.key in now:
            allowed = lim.allowed(reference[lim.key])
            rows.append((lim, reference[lim.key], now[lim.key], allowed, now[lim.key] <= allowed))
    return rows


def medians(runs: list[dict[str, Any]], paced: list[dict[str, Any]]) -> dict[str, float]:
    """The medians the check compares, from bench_e2e's result rows (failed runs left out)."""
    ok = [r for r in runs if "us_per_span" in r]
    ok_paced = [r for r in paced if "finished_to_queryable_p99_s" in r]
    out: dict[str, float] = {}
    if ok:
        out["us_per_span"] = statistics.median(r["us_per_span"] for r in ok)
        out["p99_s"] = statistics.median(r["finished_to_queryable_p99_s"] for r in ok)
    if ok_paced:
        out["paced_p99_s"] = statistics.median(r["finished_to_queryable_p99_s"] for r in ok_paced)
    return out


def machine() -> str:
    """This machine in one line: the CPU model and the cores."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model or platform.machine()}, {os.cpu_count()} cores"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def commit() -> str:
    """This checkout's commit (``+`` when it has uncommitted changes)."""
    try:
        return _git("rev-parse", "--short", "HEAD") + ("+" if _git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def reference_tree(rev: str, into: Path) -> Path | None:
    """The recorded commit's files under ``into`` (``git archive``); None when this clone does not have it."""
    try:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def bench_once(tree: Path, rate: float | None) -> dict[str, Any]:
    """One e2e run (100k spans, default mix, rolloutbus alone) of ``tree``'s product by ``tree``'s bench: its
    result row, or ``{"error": ...}``."""
    cmd = [sys.executable, "-m", "bench.bench_e2e", "--spans", str(SPANS), "--mixes", "default", "--systems", "rolloutbus",
           "--json", *(["--rate", str(rate)] if rate else [])]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1200)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line)["results"][0])
    tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return {"error": f"{tree.name}: {tail}"}


def sitting(trees: dict[str, Path], runs: int, paced_runs: int) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every tree's runs, alternating (A B A B ...) so that a machine drifting in the sitting drifts for both."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {name: {"fast": [], "paced": []} for name in trees}
    for load, n, rate in (("fast", runs, None), ("paced", paced_runs, PACED_RATE)):
        for i in range(n):
            for name, tree in trees.items():
                r = bench_once(tree, rate)
                out[name][load].append(r)
                log(f"{name} {load} {i + 1}/{n}: " + (r["error"] if "error" in r else
                    f"{r['us_per_span']:.1f} µs per span, p99 {r['finished_to_queryable_p99_s']:.2f} s"))
    return out


def table(rows: list[tuple[Limit, float, float, float, bool]], ref: dict[str, list[dict[str, Any]]] | None,
          now: dict[str, list[dict[str, Any]]]) -> str:
    def each(key: str, rs: list[dict[str, Any]]) -> str:
        return ", ".join(f"{r[key]:.2f}" if key.endswith("_s") else f"{r[key]:.1f}" for r in rs if key in r)

    def runs(side: dict[str, list[dict[str, Any]]] | None, key: str) -> str:
        if side is None:
            return "recorded"
        return {"us_per_span": each("us_per_span", side["fast"]), "p99_s": each("finished_to_queryable_p99_s", side["fast"]),
                "paced_p99_s": each("finished_to_queryable_p99_s", side["paced"])}[key]

    lines = ["| figure | reference (median; runs) | this checkout (median; runs) | allowed | verdict |", "| --- | --- | --- | --- | --- |"]
    for lim, rec, cur, allowed, ok in rows:
        lines.append(f"| {lim.label} | {rec:.2f} ({runs(ref, lim.key)}) | {cur:.2f} ({runs(now, lim.key)}) | ≤ {allowed:.2f} | "
                     f"{'ok' if ok else 'REGRESSED'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each tree as fast as the gateway takes them")
    ap.add_argument("--paced-runs", type=int, default=2, help=f"runs of each tree at {PACED_RATE:,.0f} spans/s offered")
    ap.add_argument("--baseline", type=Path, default=BASELINE, help="the recorded reference")
    ap.add_argument("--record", action="store_true", help="run this checkout alone and record it as the reference")
    args = ap.parse_args(argv)
    if args.record:
        if commit().endswith("+"):
            print("bench-check --record: commit first (the reference is a commit the check can read back)", file=sys.stderr)
            return 2
        got = sitting({"this checkout": ROOT}, args.runs, args.paced_runs)["this checkout"]
        bad = [r["error"] for r in got["fast"] + got["paced"] if "error" in r]
        if bad:
            print(f"bench-check: {len(bad)} run(s) failed: {bad[0]}", file=sys.stderr)
            return 1
        figures = medians(got["fast"], got["paced"])
        record = {"commit": commit(), "machine": machine(), "figures": figures, "runs": got,
                  "command": f"python -m bench.check --record --runs {args.runs} --paced-runs {args.paced_runs}"}
        args.baseline.write_text(json.dumps(record, indent=1, default=str) + "\n")
        log(f"recorded {figures} for {record['commit']} in {args.baseline}")
        print(table(verdicts(figures, figures), got, got))
        return 0
    if not args.baseline.exists():
        print(f"bench-check: no reference at {args.baseline}: run with --record once", file=sys.stderr)
        return 2
    base = json.loads(args.baseline.read_text())
    scratch = Path(tempfile.mkdtemp(prefix="rb-bench-check-"))
    try:
        ref_tree = reference_tree(base["commit"], scratch / base["commit"])
        trees = {"reference": ref_tree, "this checkout": ROOT} if ref_tree is not None else {"this checkout": ROOT}
        got = sitting(trees, args.runs, args.paced_runs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    bad = [r["error"] for side in got.values() for r in side["fast"] + side["paced"] if "error" in r]
    if bad:
        print(f"bench-check: {len(bad)} run(s) failed: {bad[0]}", file=sys.stderr)
        return 1
    now = medians(got["this checkout"]["fast"], got["this checkout"]["paced"])
    if ref_tree is not None:
        ref_side: dict[str, list[dict[str, Any]]] | None = got["reference"]
        reference = medians(got["reference"]["fast"], got["reference"]["paced"])
        print(f"bench-check: {commit()} against {base['commit']}, alternately on this machine ({machine()}); "
              f"{base['commit']} recorded {', '.join(f'{k} {v:.2f}' for k, v in base['figures'].items())} on {base['machine']}")
    else:
        ref_side, reference = None, base["figures"]
        print(f"bench-check: {commit()} against the numbers recorded for {base['commit']} on {base['machine']} "
              f"({base['commit']} is not in this clone, so it was not run beside: machine drift is not cancelled)")
    rows = verdicts(reference, now)
    print(table(rows, ref_side, got["this checkout"]))
    failed = [r for r in rows if not r[4]]
    print("verdict: " + ("ok" if not failed else "REGRESSED: " + "; ".join(r[0].label for r in failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
