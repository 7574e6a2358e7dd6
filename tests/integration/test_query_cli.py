"""`rolloutbus query` as an analyst uses it, against a real `rolloutbus store` (the ClickHouse engine
behind ClickHouse's HTTP interface): output formats that pipe into pandas unchanged, the SQL's own
FORMAT clause, full precision, whole errors in one line, a fresh store, and an analyst lowering its own
limits within the server's ceilings."""

from __future__ import annotations

import io
import os
import pickle
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.integration.store.conftest import REPO, Store, start_store

pytestmark = pytest.mark.integration

ROWS = (
    "SELECT * FROM values('id UInt32, x Float64, n Nullable(Int64), s String, big UInt64, arr Array(UInt32)', "
    "(1, 1/3, NULL, 'a, \"quoted\" b', 18446744073709551615, [1, 2]), "
    "(2, 0.1, -5, 'line\\nbreak', 0, []), "
    "(3, 1e-300, 7, 'ünïcode', 42, [3]))"
)


def _stop(store: Store) -> None:
    store.proc.terminate()
    try:
        store.proc.wait(20)
    except subprocess.TimeoutExpired:
        store.proc.kill()
        store.proc.wait(10)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = start_store(tmp_path / "data")
    r = requests.post(store.url, timeout=30, data="CREATE DATABASE rolloutbus")
    assert r.status_code == 200, r.text
    r = requests.post(store.url, timeout=30, data=f"CREATE TABLE rolloutbus.t ENGINE = MergeTree ORDER BY id AS {ROWS}")
    assert r.status_code == 200, r.text
    yield store
    _stop(store)


def env_for(store: Store, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTBUS_")}
    env.update({"PYTHONPATH": str(REPO), "ROLLOUTBUS_DATA_DIR": str(store.data_dir),
                "ROLLOUTBUS_CLICKHOUSE_DSN": store.url, **extra})
    return env


def query(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rolloutbus.cli", "query", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_csv_and_jsonl_pipe_into_pandas_unchanged(store: Store) -> None:
    import pandas as pd

    env = env_for(store)
    reader = {"csv": "pandas.read_csv(sys.stdin, keep_default_na=False, na_values=[''])",
              "jsonl": "pandas.read_json(sys.stdin, lines=True, dtype=False, precise_float=True)"}
    frames = {}
    for fmt, read in reader.items():
        # A real pipe, as an analyst types it: rolloutbus query ... | python -c "import pandas ..."
        cmd = (f"{shlex.quote(sys.executable)} -m rolloutbus.cli query --format {fmt} 'SELECT * FROM t ORDER BY id' | "
               f"{shlex.quote(sys.executable)} -c {shlex.quote(f'import pickle, sys, pandas; sys.stdout.buffer.write(pickle.dumps({read}))')}")
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], env=env, cwd=REPO, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        frames[fmt] = pickle.loads(r.stdout)
    for fmt, df in frames.items():
        assert list(df.columns) == ["id", "x", "n", "s", "big", "arr"], fmt
        assert df["id"].tolist() == [1, 2, 3]
        assert df["x"].tolist() == [1 / 3, 0.1, 1e-300], fmt  # every digit of a Float64 survives
        assert pd.isna(df["n"][0]) and df["n"][1:].tolist() == [-5, 7], fmt  # NULL reads as missing
        assert df["s"].tolist() == ['a, "quoted" b', "line\nbreak", "ünïcode"], fmt
        assert [int(v) for v in df["big"]] == [18446744073709551615, 0, 42], fmt
    assert frames["csv"]["arr"].tolist() == ["[1,2]", "[]", "[3]"]
    assert frames["jsonl"]["arr"].tolist() == [[1, 2], [], [3]]


def test_table_tsv_passthrough_and_the_sqls_format_clause(store: Store) -> None:
    env = env_for(store)
    r = query(env, "SELECT id, x, n FROM t ORDER BY id")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["id", "x", "n"]
    assert "0.3333333333333333" in r.stdout and "1e-300" in r.stdout and "∅" in r.stdout
    r = query(env, "SELECT id, s FROM t WHERE id > 100")
    assert r.returncode == 0 and r.stdout.splitlines() == ["id  s", "--  -", "(0 rows)"], r.stdout
    r = query(env, "--format", "tsv", "SELECT id, s FROM t ORDER BY id")
    assert r.stdout.splitlines()[:3] == ["id\ts", "1\ta, \"quoted\" b", "2\tline\\nbreak"], r.stdout
    # A FORMAT clause in the SQL wins, as in ClickHouse's own client; so does any format --format names.
    r = query(env, "SELECT id FROM t ORDER BY id FORMAT JSONEachRow")
    assert r.returncode == 0 and r.stdout == '{"id":1}\n{"id":2}\n{"id":3}\n', r.stdout + r.stderr
    r = query(env, "--format", "Markdown", "SELECT id FROM t WHERE id = 1")
    assert r.stdout.splitlines() == ["| id |", "|-:|", "| 1 |"], r.stdout
    # The variable does what the flag does.
    r = query({**env, "ROLLOUTBUS_QUERY_FORMAT": "jsonl"}, "SELECT id FROM t WHERE id = 3")
    assert r.stdout == '{"id":3}\n', r.stdout


def test_errors_are_whole_one_line_and_say_what_to_do(store: Store) -> None:
    env = env_for(store)
    # The whole text of a long, multi-line ClickHouse error, on one line.
    line = one_line_error(query(env, "SELECT id FROM t WHERE"))
    assert "Syntax error" in line and "Expected one of" in line and "(SYNTAX_ERROR)" in line, line
    line = one_line_error(query(env, "DROP TABLE t"))
    assert "readonly" in line.lower(), line
    # A fresh store: no database yet. Plain SQL and --trajectory both say how to create it.
    fresh = env_for(store, ROLLOUTBUS_CLICKHOUSE_DATABASE="never_made")
    for args in (("SELECT count() FROM spans",), ("--trajectory", "ro-0123456789abcdef"), ("--format", "csv", "--trajectory", "ro-1")):
        line = one_line_error(query(fresh, *args))
        assert "does not exist" in line and "rolloutbus up" in line, line
    # A migrated store with no such rollout.
    r = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "migrate"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no spans for rollout ro-x" in one_line_error(query(env, "--trajectory", "ro-x"))


def test_the_analyst_lowers_its_own_limits_within_the_ceilings(tmp_path: Path) -> None:
    store = start_store(tmp_path / "data", ROLLOUTBUS_STORE_USERS="w:writer:wpw,a:analyst:apw",
                        ROLLOUTBUS_STORE_ANALYST_MAX_EXECUTION_TIME_S="10", ROLLOUTBUS_STORE_ANALYST_MAX_RESULT_ROWS="5000")
    try:
        for sql in ("CREATE DATABASE rolloutbus", f"CREATE TABLE rolloutbus.t ENGINE = MergeTree ORDER BY id AS {ROWS}"):
            assert requests.post(store.url, timeout=30, data=sql, auth=("w", "wpw")).status_code == 200
        env = env_for(store, ROLLOUTBUS_CLICKHOUSE_DSN=f"http://a@127.0.0.1:{store.port}", ROLLOUTBUS_CLICKHOUSE_PASSWORD="apw")
        r = query(env, "SELECT getSetting('max_execution_time') AS t, count() AS n FROM t SETTINGS max_execution_time = 2")
        assert r.returncode == 0 and r.stdout.splitlines()[2].split() == ["2.0", "3"], r.stdout + r.stderr
        line = one_line_error(query(env, "SELECT id FROM t SETTINGS max_result_rows = 2"))
        assert "TOO_MANY_ROWS_OR_BYTES" in line, line
        for sql in ("SELECT 1 SETTINGS max_execution_time = 11", "SET max_execution_time = 100; SELECT 1"):
            line = one_line_error(query(env, sql))
            assert "Cannot raise 'max_execution_time' above 10" in line, line
        assert "readonly" in one_line_error(query(env, "CREATE TEMPORARY TABLE x AS SELECT 1")).lower()
        r = query(env, "--format", "csv", "SELECT n FROM t ORDER BY id")
        assert r.returncode == 0 and r.stdout.splitlines() == ['"n"', "", "-5", "7"], r.stdout + r.stderr
        assert "apw" not in r.stdout + r.stderr
    finally:
        _stop(store)
