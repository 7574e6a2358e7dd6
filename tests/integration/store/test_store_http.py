"""``rolloutbus store`` against the clients that talk to a ClickHouse server: curl-style HTTP, unmodified
clickhouse-connect (query, command, insert, compressed or not) and the project's own sink (RowBinary)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.store.conftest import REPO, Store, store_env

pytestmark = pytest.mark.integration


def get(store: Store, **params: str) -> requests.Response:
    return requests.get(store.url + "/", params=params, timeout=30)


def test_ping_get_post_formats_and_headers(store: Store) -> None:
    assert requests.get(store.url + "/ping", timeout=10).text == "Ok.\n"
    r = get(store, query="SELECT 1 + 1")
    assert (r.status_code, r.text) == (200, "2\n")
    assert r.headers["X-ClickHouse-Format"] == "TabSeparated"
    assert r.headers["X-ClickHouse-Query-Id"]
    # The query in the body, in the URL plus the body, with a database, default_format, a setting and a parameter.
    assert requests.post(store.url, data="CREATE DATABASE d1", timeout=30).status_code == 200
    requests.post(store.url, params={"database": "d1"}, data="CREATE TABLE t (a UInt32, s String) ENGINE = MergeTree ORDER BY a", timeout=30).raise_for_status()
    requests.post(store.url, params={"database": "d1", "query": "INSERT INTO t VALUES"}, data="(1, 'x'), (2, 'y')", timeout=30).raise_for_status()
    r = requests.post(store.url, params={"database": "d1", "default_format": "JSONEachRow", "max_threads": "1", "param_n": "1"},
                      data="SELECT a, s FROM t WHERE a > {n:UInt32}", timeout=30)
    assert r.text == '{"a":2,"s":"y"}\n' and r.headers["X-ClickHouse-Format"] == "JSONEachRow"
    r = requests.post(store.url, headers={"X-ClickHouse-Database": "d1"}, data="SELECT count() FROM t FORMAT CSV", timeout=30)
    assert r.text == "2\n" and r.headers["X-ClickHouse-Format"] == "CSV"
    # An insert whose data follows FORMAT, in the body.
    requests.post(store.url, params={"database": "d1"}, data=b"INSERT INTO t FORMAT TSV\n3\tz\n4\tw\n", timeout=30).raise_for_status()
    assert get(store, query="SELECT count() FROM d1.t").text == "4\n"
    # curl, as a user would type it.
    out = subprocess.run(["curl", "-sS", f"{store.url}/?query=SELECT+count()+FROM+d1.t"], capture_output=True, text=True, timeout=30)
    assert out.stdout == "4\n"


@pytest.mark.parametrize(
    "sql, status, code, name",
    [
        ("SELECT * FROM nosuch_table", 404, 60, "UNKNOWN_TABLE"),
        ("SELEC 1", 400, 62, "SYNTAX_ERROR"),
        ("SELECT nosuch_function(1)", 404, 46, "UNKNOWN_FUNCTION"),
        ("SELECT throwIf(1)", 500, 395, "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO"),
    ],
)
def test_errors_look_like_clickhouse(store: Store, sql: str, status: int, code: int, name: str) -> None:
    r = get(store, query=sql)
    assert r.status_code == status
    assert r.headers["X-ClickHouse-Exception-Code"] == str(code)
    assert r.text.startswith(f"Code: {code}. DB::Exception:") and f"({name})" in r.text and "(version " in r.text


def test_get_is_read_only_and_bad_settings_fail(store: Store) -> None:
    r = get(store, query="CREATE DATABASE nope")
    assert r.status_code == 403 and "(READONLY)" in r.text
    r = get(store, query="SELECT 1", no_such_setting="1")
    assert r.status_code == 404 and r.headers["X-ClickHouse-Exception-Code"] == "115"


@pytest.mark.parametrize("compress", [False, "lz4", "zstd", "gzip"])
def test_clickhouse_connect_query_command_insert(store: Store, compress: Any) -> None:
    import clickhouse_connect

    client = clickhouse_connect.get_client(host="127.0.0.1", port=store.port, compress=compress)
    assert client.server_version.count(".") >= 2
    client.command("CREATE DATABASE IF NOT EXISTS cc")
    client.command("CREATE TABLE IF NOT EXISTS cc.x (a UInt32, s String, m Map(String, String), f Array(Float32)) ENGINE = MergeTree ORDER BY a")
    rows = [[i, f"s{i}", {"k": str(i)}, [0.5, float(i)]] for i in range(20000)]
    summary = client.insert("cc.x", rows, column_names=["a", "s", "m", "f"])
    assert summary.written_rows == 20000
    client.database = "cc"
    assert client.command("SELECT count() FROM x") == 20000
    result = client.query("SELECT a, s, m, f FROM x WHERE a < {n:UInt32} ORDER BY a", parameters={"n": 2})
    assert result.result_rows == [(0, "s0", {"k": "0"}, [0.5, 0.0]), (1, "s1", {"k": "1"}, [0.5, 1.0])]
    assert client.query("SELECT a FROM x LIMIT 0").column_names == ("a",)
    client.raw_insert("x", ["a", "s", "m", "f"], b"99999\tz\t{}\t[]\n", fmt="TabSeparated")
    assert client.query("SELECT count() FROM x", settings={"max_threads": 1}).result_rows == [(20001,)]
    with pytest.raises(Exception, match="UNKNOWN_TABLE"):
        client.query("SELECT * FROM nosuch")
    client.command("DROP DATABASE cc")
    client.close()


def test_the_projects_own_client_and_sink_through_the_store(store: Store) -> None:
    """Migrations, the RowBinary span rows of streams/rowbinary.py and the analyst path of `rolloutbus query`."""
    from foundation.clickhouse import connect, migrate
    from schemas import codec
    from streams import rowbinary
    from streams.attempts import span_view
    from streams.sink import ClickHouseSink
    from tests.integration.streams.test_rowbinary import SPANS

    client = connect(store.url, database="proj")
    migrate(client, "proj")
    assert migrate(client, "proj") == []
    sink = ClickHouseSink(client)
    for i, s in enumerate(SPANS):
        sink.add_encoded("spans", rowbinary.span(span_view(codec.decode_raw(codec.encode(s))[1]), 0, i, False, 42), ("rb.spans", 0, i))
    assert sink.flush() == {"spans": 4}
    rows = client.query("SELECT span_id, prompt_token_ids, response_logprobs FROM spans FINAL ORDER BY sequence_id").result_rows
    assert [r[0] for r in rows] == ["s1", "s2", "s3", "s4"]
    assert rows[0][1][-1] == 2**32 - 1 and rows[0][2] == pytest.approx([-0.5, -1.25])
    env = store_env(ROLLOUTBUS_CLICKHOUSE_DSN=store.url, ROLLOUTBUS_CLICKHOUSE_DATABASE="proj")
    out = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "query", "SELECT count() AS n FROM spans"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].strip() == "4"
    client.close()


def test_queries_run_while_inserts_run(store: Store) -> None:
    import clickhouse_connect

    setup = clickhouse_connect.get_client(host="127.0.0.1", port=store.port)
    setup.command("CREATE DATABASE conc")
    setup.command("CREATE TABLE conc.t (a UInt64, s String) ENGINE = MergeTree ORDER BY a")
    stop = threading.Event()
    errors: list[BaseException] = []
    inserted = [0]

    def writer() -> None:
        client = clickhouse_connect.get_client(host="127.0.0.1", port=store.port)
        try:
            n = 0
            while not stop.is_set():
                client.insert("conc.t", [[n + i, "x" * 50] for i in range(5000)], column_names=["a", "s"])
                n += 5000
                inserted[0] = n
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    reader = clickhouse_connect.get_client(host="127.0.0.1", port=store.port)
    counts = []
    deadline = time.monotonic() + 30
    while len(set(counts)) < 4 and time.monotonic() < deadline:
        counts.append(reader.command("SELECT count() FROM conc.t"))
        time.sleep(0.05)
    stop.set()
    thread.join(30)
    assert not errors, errors
    assert len(set(counts)) >= 4, counts  # the reader saw the table grow while the writer wrote
    assert counts == sorted(counts)
    assert reader.command("SELECT count() FROM conc.t") == inserted[0]


def test_a_second_store_or_embedded_client_on_the_same_data_dir_refuses(store: Store, tmp_path: Path) -> None:
    from tests.integration.store.conftest import free_port

    out = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "--data-dir", str(store.data_dir), "store", "--port", str(free_port())],
                         capture_output=True, text=True, env=store_env(), cwd=REPO, timeout=60)
    assert out.returncode == 1
    assert "is in use by rolloutbus store on 127.0.0.1:" in out.stderr and "one process owns it" in out.stderr
    from foundation.clickhouse import connect
    from foundation.errors import ClickHouseError

    with pytest.raises(ClickHouseError, match="served by rolloutbus store"):
        connect(f"chdb://{store.data_dir.resolve()}/clickhouse")
    assert requests.get(store.url + "/ping", timeout=10).text == "Ok.\n"  # the first one is unharmed
