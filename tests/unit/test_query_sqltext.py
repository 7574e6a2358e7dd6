"""SQL read as the engine reads it (the store's guards, `rolloutbus query`'s FORMAT detection), the
analyst's settings in the SQL itself, and how `rolloutbus query` prints values and errors. Pure."""

from __future__ import annotations

import pytest

from rolloutbus.cli import clickhouse_error, format_table
from rolloutbus.store.access import Limits, Refused, User, check_sql, effective_settings
from rolloutbus.store.sqltext import Unreadable, output_format, settings_in, strip_literals

ANALYST = User("a", "analyst")
WRITER = User("w", "writer")
LIMITS = Limits(max_execution_time_s=5, max_result_rows=100, max_result_bytes=1000)


@pytest.mark.parametrize("sql", [
    "SELECT 1 # '\n, file('/etc/hostname') -- '",          # '# ' starts a comment: the quote after it is no string
    "SELECT 1 /* /* */ ' */ , file('x') -- '",            # comments nest
    "SELECT $$ ' $$, file('x') -- '",                      # a heredoc is a string
])
def test_what_hides_in_comments_and_strings_is_seen_as_the_engine_sees_it(sql: str) -> None:
    assert "file(" in strip_literals(sql)
    with pytest.raises(Refused) as exc:
        check_sql(sql, readonly=True)
    assert exc.value.code == 497


def test_a_line_comment_ends_at_a_newline_only() -> None:
    assert "file" not in strip_literals("SELECT 1 --x\r, file('x')")  # the engine runs none of it either


@pytest.mark.parametrize("sql, expected", [
    ("SELECT 1 SETTINGS max_execution_time = 5", [("max_execution_time", "5")]),
    ("SELECT * FROM (SELECT 1 SETTINGS `max_result_rows`='10') SETTINGS a=1, b=-2", [("max_result_rows", "10"), ("a", "1"), ("b", "-2")]),
    ("SELECT 1 FORMAT JSON SETTINGS max_execution_time=1", [("max_execution_time", "1")]),
    ("SET max_execution_time = 3; SELECT 1", [("max_execution_time", "3")]),
    ("SELECT 1 SETTINGS allow_ddl", [("allow_ddl", "1")]),  # a boolean without a value is true
    ("SELECT 1 SETTINGS max_execution_time = $$5$$", [("max_execution_time", "5")]),
    ("SELECT 1 SETTINGS max_result_rows = DEFAULT", [("max_result_rows", "DEFAULT")]),
    ("SELECT name FROM system.settings", []),
    ("SELECT settings FROM t", []),
    ("SELECT 'SETTINGS x=1' -- SETTINGS y=2\n", []),
])
def test_settings_the_sql_changes(sql: str, expected: list[tuple[str, str]]) -> None:
    assert settings_in(sql) == expected


@pytest.mark.parametrize("sql", ["SELECT 1 SETTINGS max_execution_time = plus(1000, 1)", "SELECT 1 SETTINGS max_execution_time = {t:UInt32}",
                                 "SELECT 1 SETTINGS a.b = 1, max_execution_time = 1000", "SELECT 1 SETTINGS a = 1,"])
def test_settings_that_cannot_be_read_are_unreadable(sql: str) -> None:
    with pytest.raises(Unreadable):
        settings_in(sql)


@pytest.mark.parametrize("sql", ["SELECT count() FROM t SETTINGS max_execution_time = 2", "SELECT 1 SETTINGS max_result_rows = 10, output_format_json_quote_64bit_integers = 0",
                                 "SELECT 1 FORMAT CSV SETTINGS max_execution_time = 0.5", "SELECT name FROM system.settings"])
def test_the_analyst_lowers_its_own_limits_in_the_sql(sql: str) -> None:
    check_sql(sql, readonly=True, user=ANALYST, limits=LIMITS)


@pytest.mark.parametrize("sql", [
    "SELECT 1 SETTINGS max_execution_time = 6", "SELECT 1 SETTINGS max_execution_time = 0", "SELECT 1 SETTINGS max_result_rows = DEFAULT",
    "SELECT * FROM (SELECT 1 SETTINGS max_result_bytes = 0)", "SELECT 1 SETTINGS result_overflow_mode = 'break'",
    "SELECT 1 SETTINGS readonly = 0", "SELECT 1 SETTINGS allow_ddl", "SELECT 1 SETTINGS max_memory_usage = 0",
    "SET max_execution_time = 1000; SELECT 1", "SET ROLE admin", "SELECT 1 SETTINGS max_execution_time = plus(1, 2)",
    "CREATE TEMPORARY TABLE x AS SELECT 1", "KILL QUERY WHERE 1",
])
def test_the_analyst_cannot_loosen_anything_in_the_sql(sql: str) -> None:
    with pytest.raises(Refused) as exc:
        check_sql(sql, readonly=True, user=ANALYST, limits=LIMITS)
    assert exc.value.code == 164
    check_sql(sql, readonly=False, user=WRITER, limits=LIMITS)  # a writer is trusted, as a server's default user is


def test_the_analyst_runs_readonly_2_unless_it_asks_for_1() -> None:
    assert effective_settings(ANALYST, {}, LIMITS)["readonly"] == "2"
    assert effective_settings(ANALYST, {"readonly": "0"}, LIMITS)["readonly"] == "2"
    assert effective_settings(ANALYST, {"readonly": "1"}, LIMITS)["readonly"] == "1"
    # what clickhouse-connect sets once it sees settings it may change
    assert effective_settings(ANALYST, {"cast_string_to_dynamic_use_inference": "1", "date_time_input_format": "best_effort"}, LIMITS)


@pytest.mark.parametrize("sql, fmt", [
    ("SELECT 1 FORMAT CSV", "CSV"), ("SELECT 1 FORMAT CSV;", "CSV"), ("select 1 format jsonEachRow settings a = 1 ;", "jsonEachRow"),
    ("SELECT 1 FORMAT `Markdown`", "Markdown"), ("SELECT x FROM t ORDER BY format DESC", None), ("SELECT format b FROM t", None),
    ("SELECT 'FORMAT JSON'", None), ("SELECT 1 -- FORMAT JSON", None), ("SELECT formatReadableSize(1)", None),
])
def test_the_sqls_own_format_clause(sql: str, fmt: str | None) -> None:
    assert output_format(sql) == fmt


def test_the_table_shows_floats_in_full_and_says_when_empty() -> None:
    table = format_table(["x", "n"], [[1 / 3, None], [0.1, 2]])
    assert "0.3333333333333333" in table and "∅" in table
    assert format_table(["a", "b"], []).splitlines() == ["a  b", "-  -", "(0 rows)"]


def test_errors_are_whole_and_say_how_to_create_the_database() -> None:
    exc = RuntimeError("HTTPDriver for http://127.0.0.1:8123 received ClickHouse error code 62\n Code: 62. DB::Exception: Code: 62. "
                       "DB::Exception: Syntax error: failed at position 8\n\nExpected one of: FROM, WHERE. (SYNTAX_ERROR). (SYNTAX_ERROR) "
                       "(version 26.9.2.1)\n")
    assert clickhouse_error(exc) == "Code: 62. DB::Exception: Syntax error: failed at position 8 Expected one of: FROM, WHERE. (SYNTAX_ERROR)"
    missing = clickhouse_error(RuntimeError("Code: 81. DB::Exception: Database rolloutbus does not exist. (UNKNOWN_DATABASE)"), "rolloutbus")
    assert "rolloutbus up" in missing and "Database rolloutbus does not exist" in missing
