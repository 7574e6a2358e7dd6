"""Users on the store: a writer for the workers, a read-only analyst whose refusals the server enforces
whatever the request carries. Each refusal is asserted as the client sees it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests

from tests.integration.store.conftest import Store

pytestmark = pytest.mark.integration

WRITER_PW = "w-s3cret"
ANALYST_PW = "a-s3cret"


@pytest.fixture
def secured(make_store: Callable[..., Store]) -> Store:
    store = make_store(
        ROLLOUTBUS_STORE_USERS=f"rolloutbus:writer:{WRITER_PW},analyst:analyst:{ANALYST_PW}",
        ROLLOUTBUS_STORE_ANALYST_MAX_EXECUTION_TIME_S="1",
        ROLLOUTBUS_STORE_ANALYST_MAX_RESULT_ROWS="4000",  # clickhouse-connect reads ~1,900 settings at connect
    )
    r = requests.post(store.url, auth=("rolloutbus", WRITER_PW), timeout=30,
                      data="CREATE TABLE default.t ENGINE = MergeTree ORDER BY n AS SELECT number AS n FROM numbers(5000)")
    assert r.status_code == 200, r.text
    return store


def analyst(store: Store, sql: str, **params: str) -> requests.Response:
    return requests.post(store.url, params=params, data=sql, auth=("analyst", ANALYST_PW), timeout=30)


def test_passwords_are_checked_in_every_form(secured: Store) -> None:
    for kwargs in ({"auth": ("analyst", "wrong")}, {"auth": ("nobody", ANALYST_PW)}, {}):
        r = requests.post(secured.url, data="SELECT 1", timeout=30, **kwargs)
        assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "516", r.text
    assert requests.post(secured.url, data="SELECT 1", timeout=30, headers={"X-ClickHouse-User": "analyst", "X-ClickHouse-Key": ANALYST_PW}).text == "1\n"
    assert requests.get(secured.url, params={"query": "SELECT 1", "user": "analyst", "password": ANALYST_PW}, timeout=30).text == "1\n"
    # The error never echoes the password.
    r = requests.post(secured.url, data="SELECT 1", auth=("analyst", "wrong-guess"), timeout=30)
    assert "wrong-guess" not in r.text


def test_the_analyst_reads(secured: Store) -> None:
    assert analyst(secured, "SELECT count() FROM t").text == "5000\n"
    assert analyst(secured, "SELECT count() FROM t FORMAT JSONEachRow", output_format_json_quote_64bit_integers="1").text == '{"count()":"5000"}\n'


@pytest.mark.parametrize(
    "sql, params, code",
    [
        ("INSERT INTO t VALUES (1)", {}, 164),
        ("CREATE TABLE u (a Int8) ENGINE = Memory", {}, 164),
        ("DROP TABLE t", {}, 164),
        ("INSERT INTO t VALUES (1)", {"readonly": "0"}, 164),  # asking for readonly=0 changes nothing
        ("SELECT 1 SETTINGS readonly = 0", {}, 164),
        ("SELECT count() FROM t SETTINGS max_execution_time = 1000", {}, 164),
        ("SELECT 1", {"max_execution_time": "1000"}, 164),
        ("SELECT 1", {"max_result_rows": "0"}, 164),
        ("SELECT 1", {"allow_ddl": "1"}, 164),
    ],
)
def test_the_analyst_cannot_write_or_lift_its_limits(secured: Store, sql: str, params: dict[str, str], code: int) -> None:
    r = analyst(secured, sql, **params)
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == str(code), r.text
    assert requests.post(secured.url, data="SELECT count() FROM t", auth=("rolloutbus", WRITER_PW), timeout=30).text == "5000\n"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "SELECT file('/etc/passwd')",
        "SELECT * FROM url('http://127.0.0.1:1/x', 'CSV', 'a String')",
        "SELECT * FROM executable('id', 'TSV', 'a String')",
        "SELECT * FROM s3('http://127.0.0.1:1/b/k.csv', 'CSV', 'a String')",
        "SELECT * FROM remote('127.0.0.1:1', system.one)",
        "SELECT * FROM `file`('/etc/passwd', 'LineAsString')",
        "SELECT * FROM FILE ('/etc/passwd', 'LineAsString')",
        "SELECT * FROM mysql('127.0.0.1:1', 'd', 't', 'u', 'p')",
        "SELECT 1 INTO OUTFILE '/tmp/rolloutbus-analyst-wrote-this'",
    ],
)
def test_the_analyst_cannot_reach_files_network_or_processes(secured: Store, sql: str) -> None:
    r = analyst(secured, sql)
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "497", r.text
    assert "ACCESS_DENIED" in r.text


def test_a_string_that_mentions_file_is_fine(secured: Store) -> None:
    assert analyst(secured, "SELECT 'file(1)' AS x -- url(2)").text == "file(1)\n"


def test_query_time_and_result_size_are_limited(secured: Store) -> None:
    r = analyst(secured, "SELECT count() FROM system.numbers")
    assert r.status_code == 500 and r.headers["X-ClickHouse-Exception-Code"] == "159", r.text  # TIMEOUT_EXCEEDED
    r = analyst(secured, "SELECT n FROM t")
    assert r.headers["X-ClickHouse-Exception-Code"] == "396", r.text  # TOO_MANY_ROWS_OR_BYTES
    assert analyst(secured, "SELECT n FROM t LIMIT 1000", max_result_rows="2000").status_code == 200


def test_clickhouse_connect_as_the_analyst(secured: Store) -> None:
    import clickhouse_connect

    client: Any = clickhouse_connect.get_client(host="127.0.0.1", port=secured.port, username="analyst", password=ANALYST_PW)
    assert client.query("SELECT count() FROM t").result_rows == [(5000,)]
    with pytest.raises(Exception, match="READONLY"):
        client.command("DROP TABLE t")
    with pytest.raises(Exception, match="ACCESS_DENIED"):
        client.query("SELECT * FROM file('/etc/passwd', 'LineAsString')")
    client.close()
    writer: Any = clickhouse_connect.get_client(host="127.0.0.1", port=secured.port, username="rolloutbus", password=WRITER_PW)
    writer.insert("t", [[9]], column_names=["n"])
    assert writer.command("SELECT count() FROM t") == 5001
    writer.close()
