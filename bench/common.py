"""What the pipeline benches share about the system under test: a broker, fresh topics, the processes under
test (started with a log, waited on until they answer, stopped) and what they cost.

Peak RSS and CPU time of child processes are read from ``/proc`` (no psutil). What a bench prints is
:mod:`bench.report`'s.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundation.config import Topics, default_of, load_settings
from rolloutbus.bench_settings import BenchSettings
from rolloutbus.localproc import free_port

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_PORT = default_of(BenchSettings, "bench_kafka_port")  # 29892
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def broker(scratch: Path, default_port: int = DEFAULT_PORT) -> Iterator[str]:
    """The bootstrap address of a broker: ``ROLLOUTBUS_KAFKA_BOOTSTRAP`` if set (not stopped at the end), else a local
    KRaft broker on ``ROLLOUTBUS_BENCH_KAFKA_PORT``, or this bench's ``default_port`` when that is unset, started here
    and stopped. Both variables are read and checked by ``rolloutbus bench``'s settings (a bad value is one line naming
    the variable)."""
    s = load_settings(BenchSettings)
    if s.kafka_bootstrap:
        yield s.kafka_bootstrap
        return
    from rolloutbus.local_kafka import LocalKafka

    b = LocalKafka(scratch / "broker", s.bench_kafka_port if "bench_kafka_port" in s.model_fields_set else default_port)
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


# --------------------------------------------------------------------------- processes


def start_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with its stdout and stderr appended to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200 now (an error status or no answer raises)."""
    with urllib.request.urlopen(url, timeout=2) as r:
        return bool(r.status == 200)


def wait_ready(what: str, ok: Callable[[], bool], proc: subprocess.Popen[Any], log: Path | None = None, timeout: float = 120,
               error: type[BaseException] = RuntimeError) -> None:
    """Until ``ok()`` holds (it may raise while the process starts); ``error`` when the process exits first, with
    the last lines of its ``log``, or when ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log is not None and log.exists() else []
            raise error(f"{what} exited with {proc.returncode}: {' | '.join(tail) or 'no output'}")
        try:
            if ok():
                return
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.2)
    raise error(f"{what} did not answer within {timeout:.0f}s" + (f"; see {log}" if log is not None else ""))


def stop_process(proc: subprocess.Popen[Any] | None, timeout: float = 60.0) -> int | None:
    """SIGTERM (the stream worker flushes and commits on it), then SIGKILL after ``timeout``; its exit code
    (None when there was no process)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


# --------------------------------------------------------------------------- what they cost


def parse_stat(text: str) -> tuple[int, float]:
    """``/proc/<pid>/stat`` → (parent pid, utime+stime+cutime+cstime in seconds)."""
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / _CLK_TCK


def cpu_s(pid: int) -> float | None:
    """utime + stime of the process (all its threads, not its children) so far, in seconds; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and every live descendant (each with its waited-for children's)."""
    stats: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stats[int(d)] = parse_stat(Path(f"/proc/{d}/stat").read_text())
            except (OSError, ValueError):
                continue
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen or p not in stats:
            continue
        seen.add(p)
        total += stats[p][1]
        todo += [c for c, (pp, _) in stats.items() if pp == p]
    return total


def _peak_rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def peak_rss_mib(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM) in MiB; None once it is gone."""
    kib = _peak_rss_kib(pid)
    return None if kib is None else kib / 1024


@dataclass
class ProcWatch:
    """Peak RSS (VmHWM) and CPU seconds of one live process, read from /proc while it runs."""

    pid: int
    peak_rss_kib: int = 0
    _cpu_marks: dict[str, float] = field(default_factory=dict)

    def sample(self) -> None:
        kib = _peak_rss_kib(self.pid)
        if kib is not None:
            self.peak_rss_kib = max(self.peak_rss_kib, kib)

    def cpu_s(self) -> float | None:
        """utime + stime of the process (all its threads) so far, in seconds; None once it is gone."""
        return cpu_s(self.pid)

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


__all__ = [
    "ROOT", "broker", "fresh_topics", "topic_messages", "child_env", "free_port", "start_logged", "http_ok", "wait_ready",
    "stop_process", "parse_stat", "cpu_s", "tree_cpu_s", "peak_rss_mib", "ProcWatch", "scrape",
]
