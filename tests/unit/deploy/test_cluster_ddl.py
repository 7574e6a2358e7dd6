"""The ClickHouse cluster DDL, derived from the single-node migrations, checked in the real ClickHouse engine (chDB)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

import ddl
from foundation.clickhouse import connect
from foundation.cluster_ddl import cluster_statements
from foundation.errors import ConfigError


@pytest.fixture
def client(clickhouse_dsn: str) -> Iterator[Any]:
    c = connect(clickhouse_dsn)
    yield c
    c.close()


def test_cluster_ddl_parses_runs_and_matches_migrations(client: Any) -> None:
    assert ddl.check(client) == []


def test_every_table_and_view_of_migrations_has_a_cluster_form() -> None:
    """One source: every table and view of migrations/ (a new 004_* too) has its cluster form, derived."""
    ref = {s.name for s in ddl.load(ddl.MIGRATIONS, "db") if s.kind in ("TABLE", "VIEW")}
    cluster = {s.name for s in ddl.load(ddl.MIGRATIONS, "db", cluster=True) if s.kind in ("TABLE", "VIEW")}
    assert ref - cluster == set()
    # and every local replicated table sits behind a Distributed table of the reference name
    assert {f"{n}_local" for n in ref if not n.startswith("v_")} <= cluster


def test_no_second_copy_of_the_schema() -> None:
    assert not (ddl.ROOT / "deploy" / "clickhouse" / "cluster").exists()
    assert sorted(p.name for p in ddl.MIGRATIONS.glob("*.sql"))


def test_replicated_engines_and_on_cluster_everywhere() -> None:
    statements = ddl.load(ddl.MIGRATIONS, "db", cluster=True)
    local = [s for s in statements if s.name.endswith("_local")]
    # the tables a user queries, each with its replicated local table: the checks below have something to check
    assert {"spans_local", "rollouts_local", "transitions_local"} <= {s.name for s in local}, [s.name for s in statements]
    for s in statements:
        assert "ON CLUSTER '{cluster}'" in s.sql, s.name
    for s in local:
        assert "ENGINE = ReplicatedReplacingMergeTree(" in s.sql, s.name


def test_cluster_form_of_one_table() -> None:
    single = ("CREATE TABLE IF NOT EXISTS {db}.audit\n(\n    rollout_id String,\n    v Int64\n)\n"
              "ENGINE = ReplacingMergeTree(v)\nORDER BY (rollout_id, v)\nSETTINGS non_replicated_deduplication_window = 10000")
    out = cluster_statements([single])
    assert out[0] == "CREATE DATABASE IF NOT EXISTS {db} ON CLUSTER '{cluster}'"
    assert out[1].startswith("CREATE TABLE IF NOT EXISTS {db}.audit_local ON CLUSTER '{cluster}'\n(")
    assert "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/audit_local', '{replica}', v)" in out[1]
    assert "SETTINGS replicated_deduplication_window = 10000" in out[1]
    assert out[2] == ("CREATE TABLE IF NOT EXISTS {db}.audit ON CLUSTER '{cluster}'\nAS {db}.audit_local\n"
                      "ENGINE = Distributed('{cluster}', '{db}', 'audit_local', cityHash64(rollout_id))")


def test_a_table_setting_changes_on_every_replica_of_the_local_table() -> None:
    out = cluster_statements(["ALTER TABLE {db}.spans MODIFY SETTING min_bytes_for_wide_part = 268435456"])
    assert out[1] == "ALTER TABLE {db}.spans_local ON CLUSTER '{cluster}' MODIFY SETTING min_bytes_for_wide_part = 268435456"


def test_a_statement_without_a_cluster_form_is_refused() -> None:
    with pytest.raises(ConfigError, match="no cluster form for 'ALTER TABLE"):
        cluster_statements(["ALTER TABLE {db}.spans ADD COLUMN x String"])


def test_new_migration_is_derived_and_checked(client: Any, tmp_path: Path) -> None:
    """A table added to migrations/ gets its cluster form with no second file; the check runs it."""
    migrations = tmp_path / "migrations"
    shutil.copytree(ddl.MIGRATIONS, migrations)
    (migrations / "009_extra.sql").write_text(
        "CREATE TABLE IF NOT EXISTS {db}.reward_audit\n(rollout_id String, v Int64)\nENGINE = ReplacingMergeTree\nORDER BY rollout_id;\n"
    )
    assert ddl.check(client, migrations) == []
    assert "reward_audit_local" in {s.name for s in ddl.load(migrations, "db", cluster=True)}


def test_unsupported_migration_is_reported(client: Any, tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    shutil.copytree(ddl.MIGRATIONS, migrations)
    (migrations / "009_alter.sql").write_text("ALTER TABLE {db}.spans ADD COLUMN x String;\n")
    problems = ddl.check(client, migrations)
    assert problems and "no cluster form" in problems[0]


def test_sharding_key_outside_order_by_is_reported() -> None:
    statements = [
        ddl.Statement("x.sql", "CREATE TABLE IF NOT EXISTS d.t_local ON CLUSTER '{cluster}' (a String, b String) "
                               "ENGINE = ReplicatedReplacingMergeTree('/p', '{replica}') ORDER BY (a)"),
        ddl.Statement("x.sql", "CREATE TABLE IF NOT EXISTS d.t ON CLUSTER '{cluster}' AS d.t_local "
                               "ENGINE = Distributed('{cluster}', 'd', 't_local', cityHash64(b))"),
    ]
    assert ddl.check_sharding(statements) == ["x.sql: t: sharding key uses ['b'], not in t_local's ORDER BY"]


@pytest.mark.parametrize(
    ("cluster_sql", "local_sql"),
    [
        ("CREATE TABLE d.t_local ON CLUSTER '{cluster}' (a String, v Int64) "
         "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/t_local', '{replica}', v) ORDER BY a "
         "SETTINGS replicated_deduplication_window = 10000",
         "CREATE TABLE d.t_local (a String, v Int64) ENGINE = ReplacingMergeTree(v) ORDER BY a "
         "SETTINGS non_replicated_deduplication_window = 10000"),
        ("CREATE TABLE d.t ON CLUSTER '{cluster}' AS d.t_local ENGINE = Distributed('{cluster}', 'd', 't_local', cityHash64(a))",
         "CREATE TABLE d.t AS d.t_local ENGINE = Merge('d', '^t_local$')"),
        ("CREATE OR REPLACE VIEW d.v ON CLUSTER '{cluster}' AS SELECT 1", "CREATE OR REPLACE VIEW d.v AS SELECT 1"),
    ],
)
def test_localize(cluster_sql: str, local_sql: str) -> None:
    assert ddl.localize(cluster_sql) == local_sql
