"""Producing rollouts, running the worker as a subprocess, reading its ClickHouse store."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from schemas import codec
from schemas.models import GroupBatch, LLMCall, RolloutEvent, Span, ToolCall

ROOT = Path(__file__).resolve().parents[3]


def rollout(rid: str, task: str, reward: float, rv: int = 1, turns: int = 2, tool_fail: bool = False) -> tuple[list[Span], RolloutEvent]:
    spans: list[Span] = []
    seq = 0
    for t in range(turns):
        seq += 1
        spans.append(Span(
            span_id=f"{rid}-{seq}", trace_id="a" * 32, rollout_id=rid, attempt_id=f"{rid}-a1", sequence_id=seq,
            name="chat", kind="llm", start_time_ns=seq, end_time_ns=seq + 1, agent_name="solver",
            llm=LLMCall(prompt_token_ids=[1, 2, t], response_token_ids=[3, seq], response_logprobs=[-0.1, -0.2], resource_version=rv),
        ))
        seq += 1
        spans.append(Span(
            span_id=f"{rid}-{seq}", trace_id="a" * 32, rollout_id=rid, attempt_id=f"{rid}-a1", sequence_id=seq,
            name="tool", kind="tool", start_time_ns=seq, end_time_ns=seq + 1,
            tool=ToolCall(name="calc", ok=not (tool_fail and t == 0)),
        ))
    ev = RolloutEvent(rollout_id=rid, attempt_id=f"{rid}-a1", event="FINISHED", time_ns=10**18, task_id=task,
                      resource_version=rv, status="succeeded", final_reward=reward, span_count=seq)
    return spans, ev


def produce(conf: dict[str, Any], topic: str, items: list[tuple[str, bytes]]) -> None:
    p = Producer({**conf, "linger.ms": 5, "message.max.bytes": 16 * 1024 * 1024})  # as large as the project's producers send
    for key, value in items:
        p.produce(topic, key=key.encode(), value=value)
    assert p.flush(30) == 0


def encoded(spans: list[Span], ev: RolloutEvent) -> list[tuple[str, bytes]]:
    return [(s.rollout_id, codec.encode(s)) for s in spans] + [(ev.rollout_id, codec.encode(ev))]


# Every subprocess a test starts (workers here, gateways/runners/emitters in tests/faults): killed after
# each test if still running (tests/conftest.py), so a failing test cannot leave them behind.
LIVE: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()


class WorkerProc(subprocess.Popen):  # type: ignore[type-arg]
    """The worker subprocess, its output drained by a thread into memory: a pipe nobody reads fills
    up (64 KiB — a broker outage logs that much in seconds) and blocks the worker in its logging."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        super().__init__(args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        LIVE.add(self)
        self._out = bytearray()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        assert self.stdout is not None
        for chunk in iter(lambda: self.stdout.read1(65536), b""):  # type: ignore[union-attr]
            self._out += chunk
            if len(self._out) > 4 << 20:  # keep the last 2 MiB
                del self._out[: len(self._out) - (2 << 20)]

    def output(self) -> str:
        """What the worker printed so far (all of it once it exited)."""
        if self.poll() is not None:
            self._drainer.join(10)
        return bytes(self._out).decode(errors="replace")


def start_worker(env: dict[str, str], *flags: str) -> WorkerProc:
    return WorkerProc([sys.executable, "-m", "streams.cli", "--sink-interval", "0.3", *flags], env)


def stop_worker(proc: WorkerProc, sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str]:
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.returncode, proc.output()


def read_topic(conf: dict[str, Any], topic: str, want: int, timeout: float = 45.0, proc: WorkerProc | None = None, distinct: bool = False) -> list[tuple[bytes, bytes]]:
    """Read ``topic`` from the beginning until ``want`` records arrived or ``timeout`` passed."""
    c = Consumer({**conf, "group.id": f"test-{time.time_ns()}", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len({k for k, _ in out} if distinct else out) < want and time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"worker exited early: {proc.output()[-3000:]}")
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append((m.key(), m.value()))
        # a moment more: duplicates of what was read would show up now
        end = time.monotonic() + (1.0 if distinct else 0)
        while time.monotonic() < end:
            m = c.poll(0.2)
            if m is not None and not m.error():
                out.append((m.key(), m.value()))
    finally:
        c.close()
    return out


def batches(conf: dict[str, Any], topic: str, groups: int, proc: WorkerProc | None = None, timeout: float = 45.0) -> list[GroupBatch]:
    """GroupBatch records on ``topic`` until ``groups`` distinct group ids were seen (or the timeout)."""
    return [codec.decode(v) for _, v in read_topic(conf, topic, groups, timeout, proc, distinct=True)]  # type: ignore[misc]


_QUERY = """
import json, sys
from foundation.clickhouse import connect
c = connect(sys.argv[1], database=sys.argv[2], create_database=False)
out = {}
for name, sql in json.loads(sys.argv[3]).items():
    r = c.query(sql)
    out[name] = [list(row) for row in r.result_rows]
print(json.dumps(out, default=str))
"""


def query(env: dict[str, str], queries: dict[str, str]) -> dict[str, list[list[Any]]]:
    """Run SQL against the worker's store in a fresh process: the embedded one under its data dir (one
    chDB path per process), or the ``rolloutbus store`` its ``ROLLOUTBUS_CLICKHOUSE_DSN`` names."""
    dsn = env.get("ROLLOUTBUS_CLICKHOUSE_DSN", "")
    if not dsn.startswith(("http:", "https:")):
        dsn = f"chdb://{Path(env['ROLLOUTBUS_DATA_DIR']).resolve()}/clickhouse"
    res = subprocess.run([sys.executable, "-c", _QUERY, dsn, "rolloutbus", json.dumps(queries)],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
