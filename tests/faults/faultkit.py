"""Helpers of the fault suite: processes to start and kill, ground truth read back from the broker,
the worker's ClickHouse store read after it exits, and the figures each test prints."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from foundation.errors import DecodeError, ValidationError
from schemas import codec
from streams.spans_stage import span_group
from tests.integration.streams.helpers import LIVE, ROOT, WorkerProc, query, read_topic, start_worker, stop_worker

__all__ = ["ROOT", "query", "start_worker", "stop_worker", "read_topic"]

LONG = os.environ.get("ROLLOUTBUS_FAULTS_LONG") == "1"
SEED = int(os.environ.get("ROLLOUTBUS_FAULTS_SEED", "7"))


def rng(name: str) -> random.Random:
    """A seeded generator per test, so a failing run can be repeated (ROLLOUTBUS_FAULTS_SEED)."""
    return random.Random(f"{SEED}:{name}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def py(env: dict[str, str], *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    """A Python subprocess of ours in the repo root; output to ``log`` (or a pipe)."""
    out: Any = log.open("ab") if log is not None else subprocess.PIPE
    proc = subprocess.Popen([sys.executable, *args], env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                            stdout=out, stderr=subprocess.STDOUT)
    LIVE.add(proc)  # killed after each test if still running (tests/conftest.py)
    return proc


def emitter(env: dict[str, str], out: Path, *flags: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    return py(env, str(ROOT / "tests" / "faults" / "emitter.py"), str(out), *flags, log=log)


def store(env: dict[str, str], data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A ``rolloutbus store`` on a free port serving ``data_dir`` → (process, its DSN): several worker
    processes write one store through it (an embedded chDB path opens in one process only)."""
    from rolloutbus.store.local import ping

    port = free_port()
    proc = py(env, "-m", "rolloutbus.cli", "--data-dir", str(data_dir), "store", "--port", str(port), log=log)
    deadline = time.monotonic() + 60
    while not ping("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the store did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def worker(env: dict[str, str], *flags: str, rollout_timeout: float = 4.0) -> WorkerProc:
    """The stream worker with short timeouts, so timed-out attempts and partial groups drain quickly."""
    return start_worker(env, "--group-size", "2", "--group-min-rollouts", "1", "--group-timeout", "4",
                        "--rollout-timeout", str(rollout_timeout), *flags)


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` from /proc (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


_SETTLING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
             KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.LEADER_NOT_AVAILABLE}


def _retry(call: Any, tries: int = 30) -> Any:
    """``call()``, retried while leadership and group coordination settle (a broker just (re)started)."""
    for attempt in range(tries):
        try:
            return call()
        except KafkaException as exc:
            err = exc.args[0]
            if attempt == tries - 1 or not (err.retriable() or err.code() in _SETTLING):
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _high_watermark(c: Consumer, topic: str, partition: int) -> int:
    return _retry(lambda: c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10))[1]


def records(env_or_conf: dict[str, Any], topic: str, timeout: float = 20.0) -> list[tuple[int, int, bytes | None, bytes]]:
    """Every record on ``topic`` now, as (partition, offset, key, value): read up to the high watermarks."""
    conf = {"bootstrap.servers": env_or_conf.get("bootstrap.servers") or env_or_conf["ROLLOUTBUS_KAFKA_BOOTSTRAP"]}
    c = Consumer({**conf, "group.id": f"truth-{uuid.uuid4().hex}", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        ends = {p: _high_watermark(c, topic, p) for p in md.partitions}
        want = {p: e for p, e in ends.items() if e > 0}
        c.assign([TopicPartition(topic, p, 0) for p in want])
        out: list[tuple[int, int, bytes | None, bytes]] = []
        pos = {p: 0 for p in want}
        deadline = time.monotonic() + timeout
        while any(pos[p] < want[p] for p in want) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out.append((m.partition(), m.offset(), m.key(), m.value()))
            pos[m.partition()] = m.offset() + 1
        return out
    finally:
        c.close()


def span_truth(conf: dict[str, Any], topic: str) -> dict[str, Any]:
    """What reached rb.spans: span ids (with how often each was delivered) and FINISHED attempts."""
    spans: Counter[tuple[str, str, str]] = Counter()
    finished: dict[tuple[str, str], dict[str, Any]] = {}
    other = 0
    for _p, _o, _k, v in records(conf, topic):
        try:
            # The validating decode, as the worker does: what fails it is bad input (a dead letter).
            model = codec.decode(v)
        except (DecodeError, ValidationError):
            other += 1
            continue
        rec = model.model_dump()
        if model.schema_name == "rolloutbus.Span":
            spans[(rec["rollout_id"], rec["attempt_id"], rec["span_id"])] += 1
        elif model.schema_name == "rolloutbus.RolloutEvent" and str(getattr(model.event, "value", model.event)) == "FINISHED":
            rec["event"] = "FINISHED"
            rec["status"] = str(getattr(model.status, "value", model.status))
            finished[(rec["rollout_id"], rec["attempt_id"])] = rec
    return {"spans": spans, "finished": finished, "undecodable": other}


def committed_behind(conf: dict[str, Any], group: str, topic: str) -> int:
    """Records of ``topic`` not yet committed by consumer group ``group`` (the worker commits after its flush)."""
    c = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        tps = [TopicPartition(topic, p) for p in md.partitions]
        committed = _retry(lambda: c.committed(tps, timeout=10))
        behind = 0
        for tp in committed:
            hi = _high_watermark(c, topic, tp.partition)
            behind += hi - max(tp.offset, 0) if hi > 0 else 0
        return behind
    finally:
        c.close()


SIDE_TOPICS = ("metrics", "dlq", "resources")  # stored by the worker's faust agents (rb.spans: its span stage)


def drain_state(conf: dict[str, Any], env: dict[str, str]) -> dict[str, int]:
    """Records not yet committed, per topic: rb.spans by the span stage's group, the side topics by faust's
    (the app id). Each commits only what it flushed, so 0 everywhere means every record has its row.
    rb.resources is compacted and read again from its beginning on every assignment: its commit reaching
    the end says this assignment's replay got there."""
    prefix = env["ROLLOUTBUS_TOPIC_PREFIX"]
    app_id = env.get("ROLLOUTBUS_APP_ID") or f"{prefix}streams"
    state = {"spans": committed_behind(conf, span_group(app_id), f"{prefix}spans")}
    for topic in SIDE_TOPICS:
        state[topic] = committed_behind(conf, app_id, f"{prefix}{topic}")
    return state


def wait_drained(conf: dict[str, Any], env: dict[str, str], proc: WorkerProc | list[WorkerProc], timeout: float = 90.0,
                 settle: float = 6.0) -> None:
    """Until the worker (or workers, one app) committed every record of rb.spans and of the side topics
    (so they flushed their rows), then ``settle`` seconds more for timers (timed-out attempts, partial
    groups) and one more commit.

    A side topic is read by faust's group, which after a restart rejoins, rebalances and recovers its
    tables on its own schedule: rb.spans drained says nothing about it. A partition that never drains is
    a stalled consumer (its records have no row until the next restart): that fails here, by name."""
    procs = proc if isinstance(proc, list) else [proc]
    deadline = time.monotonic() + timeout
    behind: dict[str, int] = {}
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"worker exited early: {p.output()[-3000:]}")
        behind = drain_state(conf, env)
        if not any(behind.values()):
            time.sleep(settle)
            behind = drain_state(conf, env)
            if not any(behind.values()):
                return
        time.sleep(1.0)
    for p in procs:
        p.kill()
        p.wait()
    tail = "\n--\n".join(p.output()[-2500:] for p in procs)
    lagging = {t: n for t, n in behind.items() if n}
    side = sorted(t for t in lagging if t != "spans")
    what = (f"the worker's faust agents never committed to the end of {', '.join(side)} (a stalled partition: those "
            "records have no row until the next restart)" if side and "spans" not in lagging else "the worker did not drain")
    raise AssertionError(f"{what}; records not committed after {timeout}s, per topic: {lagging}; its log ends:\n{tail}")


def group_ids(conf: dict[str, Any], topic: str) -> Counter[str]:
    """GroupBatch records on rb.batches, counted per group id (a re-emit after a crash counts twice)."""
    out: Counter[str] = Counter()
    for _p, _o, k, _v in records(conf, topic):
        out[(k or b"").decode()] += 1
    return out


STORE_QUERIES = {
    "spans": "SELECT rollout_id, attempt_id, span_id FROM spans FINAL",
    "span_rows": "SELECT count() FROM spans FINAL",
    "rollouts": "SELECT rollout_id, attempt_id, status, group_id FROM rollouts FINAL",
    "dlq": "SELECT reason, count() FROM dead_letters FINAL GROUP BY reason ORDER BY reason",
}


SIDE_QUERIES = {"side:resources": "SELECT name, version FROM resource_versions FINAL",
                "side:metrics": "SELECT run_id, step FROM train_steps FINAL",
                "side:dlq": "SELECT dlq_partition, dlq_offset FROM dead_letters FINAL"}


def side_table_gaps(env: dict[str, str], conf: dict[str, Any], rows: dict[str, list[list[Any]]]) -> dict[str, set[Any]]:
    """Records on rb.resources, rb.metrics and rb.dlq with no row in their table (``rows``: SIDE_QUERIES' answers)."""
    prefix = env["ROLLOUTBUS_TOPIC_PREFIX"]
    on_topic: dict[str, set[Any]] = {"resources": set(), "metrics": set(), "dlq": set()}
    for p, o, _k, v in records(conf, f"{prefix}resources"):
        r = codec.decode(v)
        on_topic["resources"].add((r.name, r.version))  # type: ignore[attr-defined]
    for p, o, _k, v in records(conf, f"{prefix}metrics"):
        m = codec.decode(v)
        on_topic["metrics"].add((m.run_id, m.step))  # type: ignore[attr-defined]
    on_topic["dlq"] = {(p, o) for p, o, _k, _v in records(conf, f"{prefix}dlq")}
    return {k: on_topic[k] - {tuple(r) for r in rows[f"side:{k}"]} for k in on_topic}


def check_store(env: dict[str, str], conf: dict[str, Any], label: str, expect_finished: bool = True) -> dict[str, Any]:
    """Compare the worker's store (as a FINAL reader sees it) with what reached the broker; print figures."""
    prefix = env["ROLLOUTBUS_TOPIC_PREFIX"]
    truth = span_truth(conf, f"{prefix}spans")
    rows = query(env, {**STORE_QUERIES, **SIDE_QUERIES})
    stored = Counter((r[0], r[1], r[2]) for r in rows["spans"])
    produced = set(truth["spans"])
    lost = produced - set(stored)
    extra = set(stored) - produced
    dup_rows = sum(n - 1 for n in stored.values() if n > 1)
    redelivered = sum(n - 1 for n in truth["spans"].values() if n > 1)
    ro = Counter((r[0], r[1]) for r in rows["rollouts"])
    status = {(r[0], r[1]): r[2] for r in rows["rollouts"]}
    finished = truth["finished"]
    no_row = [k for k in finished if ro.get(k, 0) != 1]
    wrong_status = [k for k in finished if k in status and status[k] != finished[k]["status"]]
    gids = {r[3] for r in rows["rollouts"] if r[3]}
    emitted = group_ids(conf, f"{prefix}batches")
    missing_groups = gids - set(emitted)
    figures = {
        "test": label, "spans_produced": len(produced), "lost": len(lost), "extra": len(extra),
        "duplicates_seen_by_final_reader": dup_rows, "redelivered_on_topic": redelivered,
        "rollouts_finished": len(finished), "rollouts_rows": len(ro), "finished_without_one_row": len(no_row),
        "groups": len(gids), "groups_missing_from_batches": len(missing_groups),
        "groups_re_emitted": sum(n - 1 for n in emitted.values() if n > 1),
        "dlq_by_reason": {r[0]: r[1] for r in rows["dlq"]},
    }
    side = side_table_gaps(env, conf, rows)
    figures["side_tables_missing"] = {k: len(v) for k, v in side.items()}
    print("FIGURES " + json.dumps(figures, sort_keys=True))
    assert not any(side.values()), f"records on the topics without their row: { {k: sorted(v)[:3] for k, v in side.items() if v} }"
    assert not lost, f"{len(lost)} spans lost, e.g. {sorted(lost)[:3]}"
    assert not extra, f"{len(extra)} spans in ClickHouse that never reached the broker: {sorted(extra)[:3]}"
    assert dup_rows == 0 and rows["span_rows"] == [[len(produced)]]
    assert not no_row, f"{len(no_row)} finished attempts without exactly one rollouts row, e.g. {no_row[:3]}"
    assert not wrong_status, [(k, status[k], finished[k]['status']) for k in wrong_status[:3]]
    assert not missing_groups, f"groups never on rb.batches: {sorted(missing_groups)[:5]}"
    if expect_finished:
        assert finished, "the workload finished no rollout"
    return {"truth": truth, "rows": rows, "figures": figures, "batches": emitted}
