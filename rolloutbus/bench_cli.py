"""``rolloutbus bench``: run the benches in ``bench/`` on one local broker, print one table against the
targets, and write ``bench/results/<YYYY-MM-DD>.md`` with the table and the machine.

Each bench runs as a subprocess from the checkout's root (``python -m bench.<module> --json``: ``bench/`` is
a package); benches that print no JSON have their table text kept in the results file. Nothing here imports
``bench`` (the floor above): top-level imports stay light (standard library only).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


@dataclass
class Bench:
    name: str
    file: str
    args: list[str]
    quick_args: list[str]
    json: bool = True
    timeout_s: int = 300

    @property
    def module(self) -> str:
        """What ``python -m`` runs: ``bench.bench_e2e`` for ``bench_e2e.py``."""
        return f"bench.{self.file.removesuffix('.py')}"


BENCHES = [
    Bench("producers", "bench_producers.py", [], ["--small", "50000", "--llm", "5000", "--latency", "20000"], json=False, timeout_s=240),
    Bench("gateway", "bench_gateway.py", ["--json"], ["--json", "--quick"], timeout_s=240),
    Bench("streams", "bench_streams.py", ["--json"], ["--json", "--quick"], timeout_s=420),
    Bench("trainer", "bench_trainer.py", [], ["--steps", "2"], json=False, timeout_s=240),
    Bench("ingest", "bench_streams.py", ["--json", "--ingest-workload"], ["--json", "--ingest-workload"], timeout_s=120),
    Bench("agentlightning", "agentlightning_store.py", ["--json"], ["--json"], timeout_s=420),
    Bench("paths", "bench_paths.py", ["--json", "--sizes", "1000,10000,100000"], ["--json", "--quick"], timeout_s=420),
    # rolloutbus (gateway + stream worker + store) against Agent Lightning 1.0.2's server and 0.3.0's store, CPU until
    # queryable. The full run (1k/10k/100k, both mixes, three systems) takes about an hour on 2 busy cores.
    Bench("e2e", "bench_e2e.py", ["--json", "--sizes", "1000,10000,100000", "--mixes", "default,llm"],
          ["--json", "--sizes", "1000", "--mixes", "default"], timeout_s=7200),
]
E2E_SIZES = (1000, 10_000)  # with --spans N the e2e bench runs these below N, then N: how cost per span grows
SPANS_PER_ROLLOUT = 16  # bench/workload.py's rollouts, as the ingest and Agent Lightning benches send them


def sized_args(b: Bench, quick: bool, spans: int | None) -> list[str]:
    """The bench's arguments, with the workload size ``--spans`` applied where the bench takes one."""
    args = list(b.quick_args if quick else b.args)
    if not spans:
        return args
    if b.name == "paths":
        return ["--json", "--spans", str(spans)] + (["--repeat", "1"] if quick else [])
    if b.name == "e2e":
        sizes = [n for n in E2E_SIZES if n < spans] + [spans]
        return ["--json", "--sizes", ",".join(map(str, sizes)), "--mixes", "default" if quick else "default,llm"]
    if b.name in ("ingest", "agentlightning"):
        return [*args, "--rollouts", str(max(1, round(spans / SPANS_PER_ROLLOUT))), "--spans-per-rollout", str(SPANS_PER_ROLLOUT)]
    return args


# flag dest → BenchSettings field: each flag's default, variable and bounds are the model's
_FLAGS = {"quick": "bench_quick", "spans": "bench_spans", "out": "bench_out"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from foundation.flags import Bounded, describe_flags

    parser.add_argument("--quick", action="store_true", default=None, help="smaller sizes, a smoke run")
    parser.add_argument("--only", action="append", default=None, metavar="NAME", choices=[b.name for b in BENCHES],
                        help=f"run only this bench (repeatable): {', '.join(b.name for b in BENCHES)}")
    parser.add_argument("--spans", type=Bounded(int, ge=SPANS_PER_ROLLOUT), default=None, metavar="N",
                        help="workload size for the ingest, Agent Lightning, hot-path and end-to-end benches, e.g. "
                             "100000 (whole rollouts of 16; default: their own, 1,024 spans for the ingest comparison)")
    parser.add_argument("--out", type=Path, default=None, help="where the results file goes (default: bench/results)")
    describe_flags(parser, "rolloutbus.bench_settings:BenchSettings", _FLAGS)


# --------------------------------------------------------------------------- running


def _run_one(b: Bench, quick: bool, env: dict[str, str], spans: int | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", b.module, *sized_args(b, quick, spans)]
    if spans and b.name in ("ingest", "agentlightning", "paths", "e2e"):
        b = Bench(b.name, b.file, b.args, b.quick_args, b.json, max(b.timeout_s, int(b.timeout_s * spans / 10_000)))
    started = time.monotonic()
    print(f"rolloutbus bench: {b.name} ({' '.join(cmd[1:])}) ...", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=b.timeout_s)
    except subprocess.TimeoutExpired:
        return {"name": b.name, "error": f"over its {b.timeout_s}s limit", "seconds": b.timeout_s}
    out = {"name": b.name, "rc": proc.returncode, "seconds": time.monotonic() - started, "text": proc.stdout.strip()}
    if b.json:
        for line in reversed(proc.stdout.strip().splitlines()):
            if line.startswith("{"):
                try:
                    out["json"] = json.loads(line)
                    break
                except ValueError:
                    pass
    if proc.returncode != 0 and "json" not in out:
        tail = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("%")][-3:]
        out["error"] = f"exit {proc.returncode}: {' | '.join(tail)[:400]}"
    print(f"rolloutbus bench: {b.name} done in {out['seconds']:.0f}s (exit {proc.returncode})", file=sys.stderr, flush=True)
    return out


def _num(text: str, label: str) -> list[float]:
    """Numbers in the value column (the second run of text after two spaces) of the first line of
    ``text`` that starts with ``label``; thousands separators removed."""
    for line in text.splitlines():
        if line.strip().startswith(label):
            cols = re.split(r"\s{2,}", line.strip())
            value = cols[1] if len(cols) > 1 else ""
            return [float(x.replace(",", "")) for x in re.findall(r"-?\d[\d,]*\.?\d*", value)]
    return []


# --------------------------------------------------------------------------- the table


def _fmt(v: float | None, unit: str = "", digits: int = 0) -> str:
    if v is None or v != v:  # None or NaN
        return "—"
    return f"{v:,.{digits}f}{unit}"


def build_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(metric, measured, target, met?) rows; a bench that did not run gives 'not run' / its error."""
    rows: list[tuple[str, str, str, str]] = []

    def missing(name: str) -> str | None:
        r = results.get(name)
        if r is None:
            return "not run"
        if "error" in r and "json" not in r:
            return f"failed: {r['error']}"[:90]
        return None

    def add(metric: str, value: float | None, shown: str, target: str, ok: bool | None, bench: str) -> None:
        why = missing(bench)
        if why:
            rows.append((metric, why, target, "—"))
        else:
            rows.append((metric, shown, target, "—" if ok is None or value is None or value != value else ("yes" if ok else "NO")))

    p = results.get("producers", {}).get("text", "")
    up = _num(p, "emit_state p50 / p99, Kafka up (µs)")
    add("emit p50 / p99, Kafka up (µs)", up[0] if up else None, f"{up[0]:.1f} / {up[1]:.1f}" if len(up) > 1 else "—",
        "p50 ≤ 10", bool(up) and up[0] <= 10, "producers")
    down = _num(p, "emit_state p50 / p99, Kafka down (µs)")
    add("emit p50 / p99, Kafka down (µs)", down[0] if down else None, f"{down[0]:.1f} / {down[1]:.1f}" if len(down) > 1 else "—",
        "p50 ≤ 10", bool(down) and down[0] <= 10, "producers")
    small = _num(p, "small spans/s into Kafka")
    v = small[0] if small else None
    add("producer small spans/s (one process)", v, _fmt(v), "≥ 100,000 /core", v is not None and v >= 100_000, "producers")
    llm = _num(p, "LLM spans/s, 1,000-token prompts")
    v = llm[0] if llm else None
    add("producer LLM spans/s (1,000-token prompts)", v, _fmt(v), "≥ 10,000", v is not None and v >= 10_000, "producers")

    g = results.get("gateway", {}).get("json", {}).get("metrics", {})
    v = g.get("gateway_spans_per_core")
    add("gateway spans/s per core (OTLP/HTTP protobuf)", v, f"{_fmt(v)} (wall {_fmt(g.get('gateway_spans_per_s'))})",
        "≥ 60,000", v is not None and v >= 60_000, "gateway")

    s = results.get("streams", {}).get("json", {}).get("metrics", {})
    v = s.get("streams_small_spans_per_core")
    add("streams small spans/s per core → ClickHouse", v, f"{_fmt(v)} (wall {_fmt(s.get('streams_small_spans_per_s'))})",
        "≥ 60,000", v is not None and v >= 60_000, "streams")
    v = s.get("streams_llm_spans_per_core")
    add("streams LLM spans/s per core → ClickHouse", v, f"{_fmt(v)} (wall {_fmt(s.get('streams_llm_spans_per_s'))})",
        "≥ 15,000", v is not None and v >= 15_000, "streams")
    v = s.get("rollout_queryable_p99_s")
    add("rollout FINISHED → queryable p50 / p99 (s, upper bound)", v,
        f"{_fmt(s.get('rollout_queryable_p50_s'), digits=2)} / {_fmt(v, digits=2)}", "p99 ≤ 2", v is not None and v <= 2, "streams")
    v = s.get("group_batch_p99_s")
    add("group complete → GroupBatch p50 / p99 (s)", v,
        f"{_fmt(s.get('group_batch_p50_s'), digits=2)} / {_fmt(v, digits=2)}", "p99 ≤ 1", v is not None and v <= 1, "streams")

    t = results.get("trainer", {}).get("text", "")
    share = _num(t, "data path share of a step")
    v = share[0] if share else None
    add("trainer data path share of a step", v, _fmt(v, " %", 2), "≤ 5 %", v is not None and v <= 5, "trainer")

    ours = results.get("ingest", {}).get("json", {}).get("metrics", {}).get("ingest_spans_per_s")
    al = results.get("agentlightning", {}).get("json", {})
    theirs = al.get("spans_per_s")
    ratio = ours / theirs if ours and theirs else None
    if al.get("error"):
        rows.append(("ingest vs Agent Lightning's store", f"AL failed: {al['error']}"[:90], "≥ 10×", "—"))
    else:
        add("ingest vs Agent Lightning's store (same workload)", ratio,
            f"{_fmt(ratio, '×', 1)} ({_fmt(ours)} vs {_fmt(theirs)} spans/s)", "≥ 10×", ratio is not None and ratio >= 10,
            "agentlightning" if missing("ingest") is None else "ingest")
        if al and "queryable_after_restart" in al:
            e = al.get("expected", {}).get("spans")
            rows.append(("Agent Lightning spans surviving a restart", f"{al['queryable_after_restart']:,} / {e:,}" if e else "—", "", ""))

    ingest = results.get("ingest", {}).get("json", {})
    ours_cpu = ingest.get("metrics", {}).get("ingest_spans_per_cpu_s")
    theirs_cpu = al.get("spans_per_server_cpu_s")
    n_spans = ingest.get("run", {}).get("spans")
    if ours_cpu:
        ratio = ours_cpu / theirs_cpu if theirs_cpu else None
        shown = (f"{_fmt(ratio, '×', 1)} ({_fmt(ours_cpu)} vs {_fmt(theirs_cpu)} spans per CPU-s, {_fmt(n_spans)} spans)"
                 if ratio else f"ours {_fmt(ours_cpu)} spans per producer CPU-s ({_fmt(n_spans)} spans); Agent Lightning not run")
        add("ingest per CPU-s: our producer vs Agent Lightning's server", ratio, shown, "≥ 50×",
            ratio is not None and ratio >= 50, "ingest")

    e2e = results.get("e2e", {}).get("json", {})
    em = e2e.get("metrics", {})
    if "e2e" in results:
        ours, al1, al03 = (em.get(f"e2e_{k}_spans_per_cpu_s") for k in ("rolloutbus", "al1", "al03"))
        n = em.get("e2e_spans")
        r1 = ours / al1 if ours and al1 else None
        r3 = ours / al03 if ours and al03 else None
        add(f"end to end per CPU-s vs Agent Lightning 1.0.2's server ({_fmt(n)} spans, default mix)", r1,
            f"{_fmt(r1, '×', 1)} ({_fmt(ours)} vs {_fmt(al1)} spans per CPU-s; vs 0.3.0's store {_fmt(r3, '×', 1)}, {_fmt(al03)})",
            "≥ 50×", r1 is not None and r1 >= 50, "e2e")
        v = em.get("e2e_finished_to_queryable_p99_s")
        add(f"FINISHED → queryable p50 / p99 under the e2e load (s, {_fmt(n)} spans)", v,
            f"{_fmt(em.get('e2e_finished_to_queryable_p50_s'), digits=2)} / {_fmt(v, digits=2)}", "p99 ≤ 2",
            v is not None and v <= 2, "e2e")

    paths = results.get("paths", {}).get("json", {}).get("metrics", {})
    for key, label, target in (("sdk", "SDK emit + encode", 100_000), ("gateway", "gateway OTLP → Avro", 60_000),
                               ("stage", "span stage Avro → rows", 60_000)):
        v = paths.get(f"paths_{key}_spans_per_cpu_s")
        add(f"{label}, spans per CPU-s (in process, {_fmt(paths.get('paths_spans'))} spans)", v, _fmt(v),
            f"≥ {target:,}", v is not None and v >= target, "paths")

    rss = []
    for label, val in (("gateway", g.get("gateway_peak_rss_mib")), ("stream worker", s.get("worker_peak_rss_mib")),
                       ("Agent Lightning server", al.get("server_peak_rss_mb"))):
        if val:
            rss.append(f"{label} {val:,.0f}")
    tr = re.search(r"peak RSS\s+(\d+) MiB", t)
    if tr:
        rss.append(f"trainer {tr.group(1)}")
    if rss:
        rows.append(("peak RSS (MiB)", ", ".join(rss), "", ""))
    return rows


def format_rows(rows: list[tuple[str, str, str, str]]) -> str:
    head = ("metric", "measured", "target", "met?")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
             "| " + " | ".join("-" * w for w in widths) + " |"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the machine


def machine() -> dict[str, str]:
    def version(mod: str) -> str:
        try:
            from importlib.metadata import version as v

            return v(mod)
        except Exception:  # noqa: BLE001 - not installed
            return "not installed"

    mem = "?"
    try:
        kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    cpu = "?"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        from rolloutbus.local_kafka import kafka_version

        kafka = kafka_version()
    except Exception:  # noqa: BLE001 - informational
        kafka = "?"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "cores": str(os.cpu_count()), "cpu": cpu, "memory": mem, "load average (1/5/15 min) at start": load,
        "os": platform.platform(), "python": platform.python_version(), "kafka": kafka,
        "chdb": version("chdb"), "clickhouse-connect": version("clickhouse-connect"), "confluent-kafka": version("confluent-kafka"),
        "faust-streaming": version("faust-streaming"), "torch": version("torch"),
    }


def write_results(out_dir: Path, rows: list[tuple[str, str, str, str]], info: dict[str, str],
                  results: dict[str, dict[str, Any]], quick: bool, seconds: float, command: str = "rolloutbus bench") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{_dt.date.today().isoformat()}.md"
    parts = [f"# rolloutbus bench — {_dt.datetime.now().isoformat(timespec='seconds')}", "",
             f"`{command}{' --quick' if quick and '--quick' not in command else ''}`, {seconds:.0f} s in all.", "", format_rows(rows), "",
             "## Machine", ""]
    parts += [f"- {k}: {v}" for k, v in info.items()]
    parts += ["", "## Notes per bench", ""]
    for name, r in results.items():
        parts.append(f"### {name} ({r.get('seconds', 0):.0f} s)")
        parts.append("")
        if "error" in r:
            parts.append(f"Failed: {r['error']}")
        j = r.get("json")
        if j:
            parts += [f"- {n}" for n in j.get("notes", [])]
            if j.get("table"):
                parts += ["", j["table"]]
            parts += ["", "```json", json.dumps({k: v for k, v in j.items() if k != "table"}, indent=1, default=str)[:20000], "```"]
        elif r.get("text"):
            parts += ["```", r["text"][-4000:], "```"]
        parts.append("")
    path.write_text("\n".join(parts))
    return path


# --------------------------------------------------------------------------- entry


def run(args: argparse.Namespace) -> int:
    from foundation.entry import settings_from_args
    from foundation.errors import ConfigError
    from rolloutbus.bench_settings import BenchSettings

    # the benches read the same ROLLOUTBUS_* variables: checked before a broker starts
    s = settings_from_args(BenchSettings, args, _FLAGS)
    port, args.spans, args.quick = s.bench_kafka_port, s.bench_spans, s.bench_quick
    out = s.bench_out or BENCH / "results"

    names = [b.name for b in BENCHES]
    only = args.only or names
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError(f"unknown bench {', '.join(unknown)}: choose from {', '.join(names)}")
    if "agentlightning" in only and "ingest" not in only:
        only = [*only, "ingest"]  # the ratio needs our side
    chosen = [b for b in BENCHES if b.name in only and (BENCH / b.file).exists()]
    for b in BENCHES:
        if b.name in only and not (BENCH / b.file).exists():
            print(f"rolloutbus bench: {b.name}: bench/{b.file} is not in this checkout; skipped", file=sys.stderr)

    started = time.monotonic()
    info = machine()
    results: dict[str, dict[str, Any]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="rb-bench-"))
    env = dict(os.environ)
    broker = None
    if not env.get("ROLLOUTBUS_KAFKA_BOOTSTRAP"):
        from rolloutbus.local_kafka import LocalKafka

        # One broker for every bench (each uses fresh topics): starting one per bench costs minutes.
        broker = LocalKafka(scratch / "broker", port)
        print(f"rolloutbus bench: starting a local broker on {broker.bootstrap}", file=sys.stderr, flush=True)
        broker.start()
        env["ROLLOUTBUS_KAFKA_BOOTSTRAP"] = broker.bootstrap
    try:
        for b in chosen:
            results[b.name] = _run_one(b, args.quick, env, getattr(args, "spans", None))
    finally:
        if broker is not None:
            broker.stop()
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - started
    rows = build_rows(results)
    table = format_rows(rows)
    print(table)
    command = " ".join(["rolloutbus bench", *(f"--only {n}" for n in (args.only or [])),
                        *([f"--spans {args.spans}"] if args.spans else []), *(["--quick"] if args.quick else [])])
    path = write_results(out, rows, info, results, args.quick, seconds, command)
    print(f"\n{len(chosen)} benches in {seconds:.0f}s on {info['cores']} cores ({info['memory']}); written to {path}")
    return 0 if all("error" not in r for r in results.values()) else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m rolloutbus.bench_cli``: the same as ``rolloutbus bench``."""
    parser = argparse.ArgumentParser(prog="rolloutbus bench", description=" ".join(__doc__.split("\n\n")[0].split()))
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
