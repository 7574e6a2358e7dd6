"""Checks the ClickHouse cluster DDL with the engine we have here (chDB).

The cluster form is not a second copy: it is derived from deploy/clickhouse/migrations/ at migration
time (foundation/cluster_ddl.py). There is no ClickHouse cluster on a developer machine, so the checks
of what the derivation produces are:

1. every statement parses (``EXPLAIN AST``), ON CLUSTER, Replicated engines and macros included;
2. the statements, "localised" to one node (ON CLUSTER dropped, ReplicatedReplacingMergeTree →
   ReplacingMergeTree with the same version column, Distributed → Merge over the local table), run
   for real, and every view of the cluster schema answers a query;
3. equivalence: every table and view of deploy/clickhouse/migrations/ exists in the cluster schema
   with the same columns (name, type, default kind and expression), in the same order, and the views
   return the same columns;
4. every Distributed table's sharding key uses only columns of its local table's ORDER BY key, so all
   copies of a record meet on one shard and FINAL collapses them.

What is NOT checked here: replication through Keeper, the macros' values, inserts across shards.

Run: ``python deploy/validate/ddl.py [--dsn chdb://...]`` (exit 1 and one line per problem on failure).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = ROOT / "deploy" / "clickhouse" / "migrations"

_ON_CLUSTER = re.compile(r"\s+ON\s+CLUSTER\s+'[^']*'", re.I)
_REPLICATED = re.compile(r"Replicated(\w*MergeTree)\(\s*'[^']*'\s*,\s*'[^']*'\s*(?:,\s*([^)]*?))?\s*\)")
_DISTRIBUTED = re.compile(
    r"ENGINE\s*=\s*Distributed\(\s*'[^']*'\s*,\s*'?(\w+)'?\s*,\s*'?(\w+)'?\s*(?:,\s*(.*?))?\)\s*$", re.S
)
_CREATE = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(TABLE|VIEW|MATERIALIZED\s+VIEW|DATABASE)\s+(?:IF\s+NOT\s+EXISTS\s+)?([\w.{}]+)", re.I)


@dataclass(frozen=True)
class Statement:
    file: str
    sql: str

    @property
    def kind(self) -> str:
        m = _CREATE.search(self.sql)
        return m.group(1).upper() if m else "OTHER"

    @property
    def name(self) -> str:
        m = _CREATE.search(self.sql)
        return m.group(2).split(".")[-1] if m else ""


def load(directory: Path, database: str, cluster: bool = False) -> list[Statement]:
    """The statements of a migrations directory with ``{db}`` replaced, in the order migrate() runs them
    (their derived cluster form with ``cluster``)."""
    sys.path.insert(0, str(ROOT))
    from foundation.clickhouse import migration_files, migration_statements

    out = []
    for _, path in migration_files(directory):
        out.extend(Statement(path.name, s.replace("{db}", database)) for s in migration_statements(path, cluster))
    return out


def localize(sql: str) -> str:
    """The single-node equivalent of one cluster statement (see the module docstring)."""
    sql = _ON_CLUSTER.sub("", sql)

    def engine(m: re.Match[str]) -> str:
        version = (m.group(2) or "").strip()
        return f"{m.group(1)}({version})" if version else m.group(1)

    sql = _REPLICATED.sub(engine, sql)
    sql = sql.replace("replicated_deduplication_window", "non_replicated_deduplication_window")
    sql = _DISTRIBUTED.sub(lambda m: f"ENGINE = Merge('{m.group(1)}', '^{m.group(2)}$')", sql)
    return sql


def _columns(client: Any, database: str, table: str) -> list[tuple[str, str, str, str]]:
    rows = client.query(
        "SELECT name, type, default_kind, default_expression FROM system.columns "
        "WHERE database = {d:String} AND table = {t:String} ORDER BY position",
        parameters={"d": database, "t": table},
    ).result_rows
    # Expressions name the database they were created in; compare them without it.
    return [(n, t, k, e.replace(f"{database}.", "")) for n, t, k, e in rows]


def _tables(client: Any, database: str) -> dict[str, str]:
    rows = client.query(
        "SELECT name, engine FROM system.tables WHERE database = {d:String}", parameters={"d": database}
    ).result_rows
    return {n: e for n, e in rows if n != "schema_migrations"}


def _order_by_columns(sql: str) -> set[str]:
    m = re.search(r"ORDER BY\s+\(?([^)\n]*)\)?", sql)
    return {c.strip() for c in m.group(1).split(",")} if m else set()


def check_sharding(statements: list[Statement]) -> list[str]:
    """Each Distributed table's sharding key may use only its local table's ORDER BY columns."""
    order_by = {s.name: _order_by_columns(s.sql) for s in statements if s.kind == "TABLE" and "MergeTree" in s.sql}
    problems = []
    for s in statements:
        m = _DISTRIBUTED.search(s.sql)
        if not m:
            continue
        local, key = m.group(2), (m.group(3) or "").strip()
        if not key:
            problems.append(f"{s.file}: {s.name}: Distributed table without a sharding key")
            continue
        used = set(re.findall(r"\b([a-z_][a-z0-9_]*)\b(?!\s*\()", key)) - {"cityHash64", "sipHash64", "xxHash64"}
        extra = used - order_by.get(local, set())
        if local not in order_by:
            problems.append(f"{s.file}: {s.name}: local table {local} is not created by these migrations")
        elif extra:
            problems.append(f"{s.file}: {s.name}: sharding key uses {sorted(extra)}, not in {local}'s ORDER BY")
    return problems


def check(client: Any, migrations: Path = MIGRATIONS) -> list[str]:
    """All checks; returns one line per problem (empty: all good). ``client`` is a clickhouse-connect client."""
    suffix = uuid.uuid4().hex[:8]
    ref_db, cl_db = f"deploy_ref_{suffix}", f"deploy_cluster_{suffix}"
    problems: list[str] = []
    ref = load(migrations, ref_db)
    try:
        cl = load(migrations, cl_db, cluster=True)
    except Exception as exc:  # noqa: BLE001 - a statement the derivation refuses is the finding
        return [str(exc)]
    if not cl:
        return [f"{migrations}: no NNN_*.sql migrations"]
    cluster = "cluster form"

    # 1. parse
    for s in cl:
        try:
            client.query(f"EXPLAIN AST {s.sql}")
        except Exception as exc:  # noqa: BLE001 - any parser error is the finding
            problems.append(f"{s.file}: does not parse: {str(exc).splitlines()[0][:300]}")
    if problems:
        return problems

    problems += check_sharding(cl)
    try:
        # 2. run the reference schema and the localised cluster schema side by side
        client.command(f"CREATE DATABASE IF NOT EXISTS {ref_db}")
        for s in ref:
            client.command(s.sql)
        for s in cl:
            try:
                client.command(localize(s.sql))
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{s.file}: {s.name}: fails on one node: {str(exc).splitlines()[0][:300]}")
        if problems:
            return problems

        # 3. drift: every reference table/view exists with the same columns
        ref_tables, cl_tables = _tables(client, ref_db), _tables(client, cl_db)
        for name, engine in sorted(ref_tables.items()):
            if name not in cl_tables:
                problems.append(
                    f"{'view' if engine == 'View' else 'table'} {name} of {migrations.name}/ has no counterpart in the {cluster}"
                )
                continue
            if engine != "View" and cl_tables[name] != "Merge":
                problems.append(f"{cluster}: {name} should be a Distributed table over {name}_local")
            if engine != "View" and f"{name}_local" not in cl_tables:
                problems.append(f"{cluster}: {name}_local (the replicated table) is missing")
            want, got = _columns(client, ref_db, name), _columns(client, cl_db, name)
            if want != got:
                diff = sorted(set(want) ^ set(got)) or ["column order"]
                problems.append(f"{cluster}: {name} columns differ from {migrations.name}/: {diff[:4]}")
        # every view answers
        for name, engine in sorted(cl_tables.items()):
            if engine == "View":
                try:
                    client.query(f"SELECT * FROM {cl_db}.{name} LIMIT 1")
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"{cluster}: view {name} fails: {str(exc).splitlines()[0][:300]}")
    finally:
        for db in (ref_db, cl_db):
            client.command(f"DROP DATABASE IF EXISTS {db}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="ClickHouse DSN (default: a scratch chDB store)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from foundation.clickhouse import connect

    with tempfile.TemporaryDirectory(prefix="rb-ddl-") as tmp:
        client = connect(args.dsn or f"chdb://{tmp}/clickhouse")
        try:
            problems = check(client)
        finally:
            client.close()
    for p in problems:
        print(f"cluster DDL: {p}", file=sys.stderr)
    if not problems:
        print(f"cluster DDL: {len(load(MIGRATIONS, 'db', cluster=True))} statements derived from {MIGRATIONS.name}/ "
              "parse, run on one node, match it")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
