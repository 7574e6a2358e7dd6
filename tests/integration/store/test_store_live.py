"""Live analysis and more than one writer: stream workers write through the store while
`rolloutbus query` reads, and two workers of one consumer group share the span partitions."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.store.conftest import REPO, Store
from tests.integration.streams.helpers import batches, encoded, produce, rollout, start_worker, stop_worker

pytestmark = pytest.mark.integration


def cli_count(env: dict[str, str], sql: str) -> int:
    out = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "query", sql], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        if "UNKNOWN_DATABASE" in out.stderr or "UNKNOWN_TABLE" in out.stderr:
            return 0  # the worker has not migrated yet
        raise AssertionError(out.stderr)
    return int(out.stdout.splitlines()[-1].strip())


def wait_count(env: dict[str, str], sql: str, above: int, procs: list[Any], timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, p.output()[-3000:]
        n = cli_count(env, sql)
        if n > above:
            return n
        time.sleep(0.5)
    raise AssertionError(f"{sql} stayed at {above} for {timeout}s")


def test_query_sees_rows_grow_while_two_workers_write_through_the_store(
    make_store: Callable[..., Store], kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str]
) -> None:
    store = make_store()
    env = {**test_env, "ROLLOUTBUS_CLICKHOUSE_DSN": store.url}
    workers = [start_worker(env, "--group-size", "2"), start_worker(env, "--group-size", "2")]
    first = {f"a-r{i}": rollout(f"a-r{i}", f"a{i // 2}", reward=float(i % 2)) for i in range(8)}
    produce(kafka_conf, topics.spans, [kv for s, e in first.values() for kv in encoded(s, e)])
    spans_sql = "SELECT count() FROM spans FINAL"
    n1 = wait_count(env, spans_sql, 0, workers)
    second = {f"b-r{i}": rollout(f"b-r{i}", f"b{i // 2}", reward=float(i % 2)) for i in range(8)}
    produce(kafka_conf, topics.spans, [kv for s, e in second.values() for kv in encoded(s, e)])
    n2 = wait_count(env, spans_sql, max(n1, 32), workers)  # a second query, during the run, sees more rows
    assert n2 > n1
    got = batches(kafka_conf, topics.batches, 8, workers[0])
    assert len({b.group_id for b in got}) == 8
    deadline = time.monotonic() + 30
    while cli_count(env, "SELECT count() FROM rollouts FINAL") < 16 and time.monotonic() < deadline:
        time.sleep(0.5)
    for w in workers:
        rc, out = stop_worker(w)
        assert rc == 0, out[-3000:]
    assert cli_count(env, "SELECT uniqExact(rollout_id, span_id) FROM spans FINAL") == 64
    assert cli_count(env, spans_sql) == 64
    assert cli_count(env, "SELECT count() FROM rollouts FINAL") == 16
    assert cli_count(env, "SELECT count() FROM groups FINAL") == 8
