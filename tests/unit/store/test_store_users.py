"""Users, roles and the analyst's settings and SQL guard: pure rules, checked without a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from foundation.errors import ConfigError
from rolloutbus.store.access import DEFAULT_USERS, Limits, Refused, User, authenticate, check_sql, effective_settings, parse_users


def test_users_from_the_variable_and_from_a_file(tmp_path: Path) -> None:
    users = parse_users("rolloutbus:writer:pw1, analyst:analyst:p:w")
    assert [(u.name, u.role, u.password.get_secret_value()) for u in users] == [("rolloutbus", "writer", "pw1"), ("analyst", "analyst", "p:w")]
    assert "pw1" not in repr(users)  # secrets stay out of logs
    f = tmp_path / "users"
    f.write_text("# who may use the store\nrolloutbus writer s3 cr3t\nanalyst analyst x\n")
    users = parse_users(str(f))
    assert [(u.name, u.role, u.password.get_secret_value()) for u in users] == [("rolloutbus", "writer", "s3 cr3t"), ("analyst", "analyst", "x")]
    assert parse_users("") == DEFAULT_USERS


@pytest.mark.parametrize("spec, message", [("a:admin:x", "role 'admin'"), ("a:writer:x,a:analyst:y", "listed twice"), ("bad name:writer:x", "user name")])
def test_bad_user_lists_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_users(spec)


def test_authenticate() -> None:
    users = parse_users("w:writer:pw,a:analyst:")
    assert authenticate(users, "w", "pw").role == "writer"
    assert authenticate(users, "a", None).role == "analyst"
    with pytest.raises(Refused) as exc:
        authenticate(users, "w", "nope")
    assert exc.value.code == 516
    assert authenticate(DEFAULT_USERS, None, None).name == "default"


ANALYST = User("a", "analyst")
WRITER = User("w", "writer")
LIMITS = Limits(max_execution_time_s=5, max_result_rows=100, max_result_bytes=1000)


def test_the_analyst_is_read_only_last_with_its_limits() -> None:
    out = effective_settings(ANALYST, {"readonly": "0", "output_format_json_quote_64bit_integers": "1", "max_execution_time": "2"}, LIMITS)
    assert list(out)[-1] == "readonly" and out["readonly"] == "2"  # 2: the SQL may lower limits too (check_sql holds it)
    assert out["max_execution_time"] == "2" and out["max_result_rows"] == "100" and out["result_overflow_mode"] == "throw"


@pytest.mark.parametrize("settings", [{"max_execution_time": "6"}, {"max_execution_time": "0"}, {"max_result_rows": "0"},
                                      {"result_overflow_mode": "break"}, {"allow_ddl": "1"}, {"max_memory_usage": "0"}])
def test_the_analyst_cannot_loosen_anything(settings: dict[str, str]) -> None:
    with pytest.raises(Refused) as exc:
        effective_settings(ANALYST, settings, LIMITS)
    assert exc.value.code == 164


def test_writers_get_what_they_ask_and_get_is_read_only() -> None:
    assert effective_settings(WRITER, {"max_threads": "1"}, LIMITS) == {"max_threads": "1"}
    assert effective_settings(WRITER, {}, LIMITS, get_request=True) == {"readonly": "2"}
    assert effective_settings(WRITER, {"readonly": "1"}, LIMITS, get_request=True) == {"readonly": "2"}


@pytest.mark.parametrize("sql", ["SELECT * FROM file('x')", "select FILE('x')", "SELECT * FROM url('u', CSV)", "SELECT * FROM s3Cluster(c, 'u')",
                                 "SELECT * FROM executable('id', TSV, 'a String')", "SELECT * FROM remoteSecure('h', db.t)",
                                 "SELECT * FROM \"file\"('x')", "SELECT * FROM postgresql('h', 'd', 't', 'u', 'p')"])
def test_outside_functions_are_refused_when_read_only(sql: str) -> None:
    with pytest.raises(Refused) as exc:
        check_sql(sql, readonly=True)
    assert exc.value.code == 497
    check_sql(sql, readonly=False)  # the writer is trusted, as a server's default user is


@pytest.mark.parametrize("sql", ["SELECT 1 INTO OUTFILE 'x'", "INSERT INTO t FROM INFILE '/etc/passwd' FORMAT TSV"])
def test_server_side_files_are_refused_for_everyone(sql: str) -> None:
    for readonly in (True, False):
        with pytest.raises(Refused):
            check_sql(sql, readonly=readonly)


@pytest.mark.parametrize("sql", ["SELECT 'file(x)'", "SELECT profile(1)", "SELECT count() FROM spans -- url(x)", "SELECT t.file FROM t",
                                 "SELECT domain(url) FROM t", "SELECT /* s3( */ 1"])
def test_harmless_sql_passes(sql: str) -> None:
    check_sql(sql, readonly=True)
