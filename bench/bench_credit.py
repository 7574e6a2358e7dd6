"""Credit assignment side by side on the calculator demo: what reaches the loss, measured.

``python -m bench.bench_credit`` runs ``rolloutbus demo`` (the calculator: a supervised warm-up, then GRPO) once
per setting and seed, at the same step budget, and reads each run's held-out line (version 0 and the version
kept, greedy, on the same problems: the gain in points and its paired standard error). Settings:

- ``final-only``: ``--credit identical`` with every reward rule at 0 (only the final reward reaches the
  advantages: what the trainer trained on before intermediate rewards reached the loss);
- ``identical+air``: ``--credit identical`` with ``deploy/rewards/air.toml`` (the rules' defaults until
  2026-12-05: a failed calculator call -0.1, an exception -0.2): every step of a rollout gets its total;
- ``discounted+air``: ``--credit discounted --gamma 1`` with the same rules: each step gets the rewards from it on;
- ``per-turn+air``: ``--credit per-turn``: each step only its own reward (the last also the final one);
- ``stale<N>-ppo-clip`` / ``stale<N>-decoupled`` (N 0, 2, 4): the policy server trails the newest version by N
  (``demo --serve-lag N``), so every batch arrives at least N versions old, trained with the PPO clip against the
  behaviour policy or with AReaL's decoupled objective (``--policy-loss decoupled``); each ``decoupled`` row is
  compared with ``ppo-clip`` at the same N, each ``ppo-clip`` row with ``stale0-ppo-clip``, the credit rows with
  ``final-only``.

Runs one after the other (nothing else should run meanwhile); writes ``bench/results/credit-<date>.json`` (every
run's figures and its command) and prints the table (``--render FILE`` prints an earlier run's).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT

SETTINGS: dict[str, list[str]] = {
    "final-only": ["--credit", "identical"],
    "identical+air": ["--credit", "identical"],
    "discounted+air": ["--credit", "discounted", "--gamma", "1"],
    "per-turn+air": ["--credit", "per-turn"],
    # staleness: the policy server trails the newest version by N (demo --serve-lag), so every batch is >= N versions
    # old; the PPO clip against the behaviour policy (ppo-clip) or AReaL's decoupled objective, the demo's credit
    **{f"stale{n}-{loss}": ["--serve-lag", str(n), "--policy-loss", loss] for n in (0, 2, 4) for loss in ("ppo-clip", "decoupled")},
}
# each row is compared with its baseline over the same seeds: the credit rows with final-only; a decoupled row with
# ppo-clip at the same lag; a ppo-clip row with ppo-clip at lag 0 (what staleness alone costs)
BASELINE = {name: ("final-only" if not name.startswith("stale") else name.replace("decoupled", "ppo-clip")
                   if name.endswith("decoupled") else "stale0-ppo-clip") for name in SETTINGS}
RULES = ROOT / "deploy" / "rewards"
FIRST = re.compile(r"version +0 \(supervised warm-up only\): +([\d.]+)%")
STALENESS = re.compile(r"staleness +the batches trained on were ([\d.]+) versions old")
FINAL = re.compile(r"version +(\d+) \(after GRPO\): +([\d.]+)% +\(([+-][\d.]+) points, paired standard error ([\d.]+)\)")


def parse(stdout: str) -> dict[str, float]:
    """The held-out figures of a demo's output (first and final success %, gain, paired SE, the version). Pure."""
    first, final = FIRST.search(stdout), FINAL.search(stdout)
    if first is None or final is None:
        raise ValueError("no held-out lines in the demo's output")
    stale = STALENESS.search(stdout)
    return {"first": float(first.group(1)), "final": float(final.group(2)), "gain": float(final.group(3)),
            "se": float(final.group(4)), "version": int(final.group(1)), "staleness": float(stale.group(1)) if stale else None}


def run_one(setting: str, seed: int, steps: int, minutes: float, held_out: int, work: Path) -> dict[str, Any]:
    rules = RULES / ("final-only.toml" if setting == "final-only" else "air.toml")
    out = work / f"{setting}-{seed}"
    argv = [sys.executable, "-m", "rolloutbus.cli", "demo", "--max-steps", str(steps), "--minutes", str(minutes),
            "--held-out", str(held_out), "--seed", str(seed), "--no-dashboard", "--out", str(out), *SETTINGS[setting],
            *([] if setting.startswith("stale") else ["--reward-rules", str(rules)])]
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=str(work / "data"), PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=minutes * 60 + 900)
    wall = time.monotonic() - t0
    (work / f"{setting}-{seed}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{setting} seed {seed} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return {"setting": setting, "seed": seed, "argv": argv[2:], "wall_s": round(wall, 1), **parse(proc.stdout)}


def table(runs: list[dict[str, Any]]) -> str:
    """One row per setting: held-out before → after, the gain of each run and their mean, the paired SE of each
    run, and the mean difference to ``final-only`` over the same seeds with its standard error. Pure."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["setting"], {})[r["seed"]] = r
    lines = ["| setting | runs | batches' mean age, versions | held-out before → after (mean) | gain, points: mean (runs) | "
             "paired SE of each run | vs its baseline, same seeds: mean ± SE |", "|---|---|---|---|---|---|---|"]
    for setting in SETTINGS:
        rs = by.get(setting)
        if not rs:
            continue
        seeds = sorted(rs)
        gains = [rs[s]["gain"] for s in seeds]
        vs = "—"
        base = by.get(BASELINE[setting], {})
        common = [s for s in seeds if s in base]
        if BASELINE[setting] != setting and common:
            d = [rs[s]["final"] - base[s]["final"] for s in common]
            se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else 0.0
            vs = f"{statistics.fmean(d):+.1f} ± {se:.1f} ({len(d)} seeds, vs {BASELINE[setting]})"
        ages = [rs[s]["staleness"] for s in seeds if rs[s].get("staleness") is not None]
        age = f"{statistics.fmean(ages):.2f}" if ages else "—"
        ses = ", ".join(format(rs[s]["se"], ".1f") for s in seeds)
        each = ", ".join(format(g, "+.1f") for g in gains)
        before = statistics.fmean(rs[s]["first"] for s in seeds)
        after = statistics.fmean(rs[s]["final"] for s in seeds)
        lines.append(f"| {setting} | {len(seeds)} | {age} | {before:.1f}% → {after:.1f}% | {statistics.fmean(gains):+.1f} ({each}) | "
                     f"{ses} | {vs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default="final-only,identical+air,discounted+air", help=f"comma-separated, of {', '.join(SETTINGS)}")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--steps", type=int, default=150, help="optimiser steps per run (the learning test's budget)")
    p.add_argument("--minutes", type=float, default=6.0, help="a cap on each run's training minutes")
    p.add_argument("--held-out", type=int, default=150)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--render", type=Path, help="print the table of an earlier run's JSON, run nothing")
    args = p.parse_args(argv)
    if args.render:
        print(table(json.loads(args.render.read_text())["runs"]))
        return 0
    settings = [s for s in args.settings.split(",") if s]
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        p.error(f"unknown setting(s) {bad}: choose from {list(SETTINGS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    started = _dt.datetime.now().replace(microsecond=0)
    runs: list[dict[str, Any]] = []
    path = args.out / f"credit-{started.date().isoformat()}.json"
    with tempfile.TemporaryDirectory(prefix="bench-credit-") as tmp:
        try:
            _runs(args, settings, seeds, Path(tmp), started, runs, path)
        finally:  # the demo leaves its store up to be queried: stopped here
            subprocess.run([sys.executable, "-m", "rolloutbus.cli", "down"], capture_output=True, timeout=120,
                           env=dict(os.environ, ROLLOUTBUS_DATA_DIR=str(Path(tmp) / "data")))
    print(table(runs))
    print(f"raw results: {path}")
    return 0


def _runs(args: argparse.Namespace, settings: list[str], seeds: list[int], tmp: Path, started: _dt.datetime,
          runs: list[dict[str, Any]], path: Path) -> None:
    for seed in seeds:  # seed by seed: each seed's settings run close together in time
        for setting in settings:
            r = run_one(setting, seed, args.steps, args.minutes, args.held_out, tmp)
            runs.append(r)
            print(f"{setting:<15} seed {seed}: {r['first']:.1f}% -> v{r['version']} {r['final']:.1f}% "
                  f"({r['gain']:+.1f} points, paired SE {r['se']:.1f}), {r['wall_s']:.0f} s", flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"started": started.isoformat(), "machine": f"{platform.node()} ({os.cpu_count()} cores)",
                                        "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
