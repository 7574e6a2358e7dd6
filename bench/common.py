"""Helpers shared by the pipeline benches: a broker, fresh topics, child processes, a table printer.

Benches are scripts (``python bench/bench_x.py``), not tests: they print a table, or JSON with
``--json``. Peak RSS and CPU time of child processes are read from ``/proc`` (no psutil).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from foundation.config import Topics  # noqa: E402

DEFAULT_PORT = 29892
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def broker(scratch: Path) -> Iterator[str]:
    """The bootstrap address of a broker: ``ROLLOUTBUS_KAFKA_BOOTSTRAP`` if set (not stopped at the end),
    else a local KRaft broker on ``ROLLOUTBUS_BENCH_KAFKA_PORT`` (default 29892) started here and stopped."""
    given = os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")
    if given:
        yield given
        return
    from rolloutbus.local_kafka import LocalKafka

    b = LocalKafka(scratch / "broker", int(os.environ.get("ROLLOUTBUS_BENCH_KAFKA_PORT", str(DEFAULT_PORT))))
    b.start()
    try:
        yield b.bootstrap
    finally:
        b.stop()


def fresh_topics(bootstrap: str, label: str, partitions: int = 4) -> Topics:
    """A new topic prefix (``bench<label><hex>.``) with every rolloutbus topic created."""
    from foundation.kafka_admin import ensure_topics, topic_specs

    topics = Topics(f"bench{label}{uuid.uuid4().hex[:6]}.")
    ensure_topics({"bootstrap.servers": bootstrap}, topic_specs(topics, partitions))
    return topics


def topic_messages(bootstrap: str, topic: str) -> int:
    """Records on ``topic`` (sum of high watermarks minus low watermarks over its partitions)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-wm-{uuid.uuid4().hex[:6]}", "log_level": 0})
    try:
        md = c.list_topics(topic, timeout=10)
        total = 0
        for p in md.topics[topic].partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += hi - lo
        return total
    finally:
        c.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(data_dir: Path, bootstrap: str, topics: Topics, **extra: str) -> dict[str, str]:
    """Environment of a pipeline process under test: its own data dir, the bench broker and topics."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTBUS_")}
    env.update(
        ROLLOUTBUS_DATA_DIR=str(data_dir),
        ROLLOUTBUS_KAFKA_BOOTSTRAP=bootstrap,
        ROLLOUTBUS_TOPIC_PREFIX=topics.prefix,
        ROLLOUTBUS_CLICKHOUSE_DSN="chdb://",  # the embedded engine in the worker, under its data dir
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class ProcWatch:
    """Peak RSS (VmHWM) and CPU seconds of one live process, read from /proc while it runs."""

    pid: int
    peak_rss_kib: int = 0
    _cpu_marks: dict[str, float] = field(default_factory=dict)

    def sample(self) -> None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_kib = max(self.peak_rss_kib, int(line.split()[1]))
        except (OSError, ValueError):
            pass

    def cpu_s(self) -> float | None:
        """utime + stime of the process (all its threads) so far, in seconds; None once it is gone."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    def mark(self, name: str) -> None:
        cpu = self.cpu_s()
        if cpu is not None:
            self._cpu_marks[name] = cpu

    def cpu_between(self, a: str, b: str) -> float | None:
        if a in self._cpu_marks and b in self._cpu_marks:
            return self._cpu_marks[b] - self._cpu_marks[a]
        return None

    @property
    def peak_rss_mib(self) -> float:
        return self.peak_rss_kib / 1024


def scrape(url: str, timeout: float = 2.0) -> dict[str, float]:
    """Prometheus text → {``name{labels}``: value} (labels as written). Empty dict when unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def stop_process(proc: subprocess.Popen[Any], timeout: float = 60.0) -> int:
    """SIGTERM (the stream worker flushes and commits on it), then SIGKILL after ``timeout``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def pct(samples: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``samples``; NaN when empty."""
    if not samples:
        return float("nan")
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def print_table(title: str, rows: list[tuple[str, str, str]], notes: list[str] = ()) -> None:  # type: ignore[assignment]
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


__all__ = [
    "ROOT", "broker", "fresh_topics", "topic_messages", "free_port", "child_env", "ProcWatch", "scrape",
    "stop_process", "pct", "print_table", "emit_json", "log",
]


def peak_rss_mib(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM) in MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
