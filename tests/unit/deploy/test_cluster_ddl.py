"""The ClickHouse cluster DDL, checked in the real ClickHouse engine (chDB)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

import ddl
from rolloutbus.clickhouse import connect


@pytest.fixture
def client(clickhouse_dsn: str) -> Iterator[Any]:
    c = connect(clickhouse_dsn)
    yield c
    c.close()


def test_cluster_ddl_parses_runs_and_matches_migrations(client: Any) -> None:
    assert ddl.check(client) == []


def test_every_table_and_view_of_migrations_has_a_cluster_counterpart() -> None:
    """Drift guard: a new table or view in migrations/ (e.g. a 003_*) must be added to cluster/ too."""
    ref = {s.name for s in ddl.load(ddl.MIGRATIONS, "db") if s.kind in ("TABLE", "VIEW")}
    cluster = {s.name for s in ddl.load(ddl.CLUSTER, "db") if s.kind in ("TABLE", "VIEW")}
    assert ref - cluster == set()
    # and every local replicated table sits behind a Distributed table of the reference name
    assert {f"{n}_local" for n in ref if not n.startswith("v_")} <= cluster


def test_cluster_files_mirror_migration_numbering() -> None:
    names = lambda d: sorted(p.name for p in d.glob("*.sql"))  # noqa: E731
    assert names(ddl.CLUSTER) == names(ddl.MIGRATIONS)


def test_replicated_engines_and_on_cluster_everywhere() -> None:
    for s in ddl.load(ddl.CLUSTER, "db"):
        assert "ON CLUSTER '{cluster}'" in s.sql, s.name
        if s.name.endswith("_local"):
            assert "ENGINE = ReplicatedReplacingMergeTree(" in s.sql, s.name


def test_drift_is_reported(client: Any, tmp_path: Path) -> None:
    """A table added to migrations/ only, and a column changed in cluster/ only, are both caught."""
    migrations, cluster = tmp_path / "migrations", tmp_path / "cluster"
    shutil.copytree(ddl.MIGRATIONS, migrations)
    shutil.copytree(ddl.CLUSTER, cluster)
    (migrations / "003_extra.sql").write_text(
        "CREATE TABLE IF NOT EXISTS {db}.reward_audit (rollout_id String, v Int64) ENGINE = ReplacingMergeTree ORDER BY rollout_id;\n"
    )
    (cluster / "003_extra.sql").write_text("SELECT 1;\n")
    tables = cluster / "001_tables.sql"
    tables.write_text(tables.read_text().replace("    kafka_offset       Int64,", "    kafka_offset       Int32,", 1))
    problems = ddl.check(client, migrations, cluster)
    assert any("reward_audit" in p and "no counterpart" in p for p in problems), problems
    assert any("spans columns differ" in p for p in problems), problems


def test_sharding_key_outside_order_by_is_reported() -> None:
    statements = [
        ddl.Statement("x.sql", "CREATE TABLE IF NOT EXISTS d.t_local ON CLUSTER '{cluster}' (a String, b String) "
                               "ENGINE = ReplicatedReplacingMergeTree('/p', '{replica}') ORDER BY (a)"),
        ddl.Statement("x.sql", "CREATE TABLE IF NOT EXISTS d.t ON CLUSTER '{cluster}' AS d.t_local "
                               "ENGINE = Distributed('{cluster}', 'd', 't_local', cityHash64(b))"),
    ]
    assert ddl.check_sharding(statements) == ["x.sql: t: sharding key uses ['b'], not in t_local's ORDER BY"]


def test_syntax_error_is_reported(client: Any, tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    shutil.copytree(ddl.CLUSTER, cluster)
    (cluster / "003_bad.sql").write_text("CREATE TABLE {db}.broken ON CLUSTER '{cluster}' (a String ENGINE = Memory;\n")
    problems = ddl.check(client, ddl.MIGRATIONS, cluster)
    assert problems and "003_bad.sql: does not parse" in problems[0]


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
