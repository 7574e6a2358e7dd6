"""The cluster form of the ClickHouse schema, derived from the single-node migrations at migration time.

``deploy/clickhouse/migrations/`` is the one source of every table and view. For a ClickHouse cluster
with Keeper (``ROLLOUTBUS_CLICKHOUSE_CLUSTER=<name>``) each statement is rewritten:

* ``CREATE TABLE {db}.<name> ... ENGINE = ReplacingMergeTree[(version)]`` becomes two tables:
  ``{db}.<name>_local ON CLUSTER`` with ``ReplicatedReplacingMergeTree`` (same columns, ORDER BY and
  version column; ``replicated_deduplication_window`` for the non-replicated one) on every replica of
  every shard, and ``{db}.<name> ON CLUSTER`` as a ``Distributed`` table over them with the name the
  views and the sink use. The sharding key is the first ORDER BY column, so every copy of one record
  lands on one shard and FINAL (which merges within a shard) still collapses duplicates.
* ``CREATE [OR REPLACE] VIEW {db}.<name>`` is created ``ON CLUSTER``.
* ``ALTER TABLE {db}.<name> MODIFY SETTING ...`` applies to ``{db}.<name>_local ON CLUSTER`` (the
  settings are the storage's; the Distributed table has none).
* Each migration begins with ``CREATE DATABASE IF NOT EXISTS {db} ON CLUSTER``.

``'{cluster}'`` is replaced by the cluster's name when the migration runs; ``{shard}``, ``{replica}``
and ``{database}`` stay server macros (``<macros>`` in the server config, which the ClickHouse
operator writes). Any other statement is refused with the reason, so a new kind of migration is
taught here before it can reach a cluster half-converted. Pure text: no client, no engine.
"""

from __future__ import annotations

import re

from foundation.errors import ConfigError

ON_CLUSTER = "ON CLUSTER '{cluster}'"
_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\{db\}\.(\w+))\s*\n", re.S)
_VIEW = re.compile(r"^CREATE (OR REPLACE )?VIEW (\{db\}\.\w+) AS\b", re.S)
_MODIFY_SETTING = re.compile(r"^ALTER TABLE (\{db\}\.\w+) (MODIFY SETTING\b.*)$", re.S)
_ENGINE = re.compile(r"ENGINE = ReplacingMergeTree(?:\((\w*)\))?\s*\n")
_ORDER_BY = re.compile(r"^ORDER BY \(?\s*(\w+)", re.M)


def _table(statement: str, full: str, name: str) -> list[str]:
    engine = _ENGINE.search(statement)
    order = _ORDER_BY.search(statement)
    if engine is None or order is None:
        raise ConfigError(f"cluster DDL: table {name}: only ReplacingMergeTree tables with an ORDER BY can be derived")
    version = engine.group(1)
    args = f"'/clickhouse/tables/{{shard}}/{{database}}/{name}_local', '{{replica}}'" + (f", {version}" if version else "")
    local = _TABLE.sub(lambda m: f"CREATE TABLE IF NOT EXISTS {full}_local {ON_CLUSTER}\n", statement, count=1)
    local = _ENGINE.sub(lambda m: f"ENGINE = ReplicatedReplacingMergeTree({args})\n", local, count=1)
    local = local.replace("non_replicated_deduplication_window", "replicated_deduplication_window")
    distributed = (
        f"CREATE TABLE IF NOT EXISTS {full} {ON_CLUSTER}\n"
        f"AS {full}_local\n"
        f"ENGINE = Distributed('{{cluster}}', '{{db}}', '{name}_local', cityHash64({order.group(1)}))"
    )
    return [local, distributed]


def cluster_statements(statements: list[str]) -> list[str]:
    """The cluster form of one migration's single-node statements (``{db}`` not yet replaced)."""
    out = [f"CREATE DATABASE IF NOT EXISTS {{db}} {ON_CLUSTER}"]
    for statement in statements:
        table = _TABLE.match(statement)
        view = _VIEW.match(statement)
        setting = _MODIFY_SETTING.match(statement)
        if table:
            out += _table(statement, table.group(1), table.group(2))
        elif view:
            out.append(_VIEW.sub(lambda m: f"CREATE {m.group(1) or ''}VIEW {m.group(2)} {ON_CLUSTER} AS", statement, count=1))
        elif setting:
            out.append(f"ALTER TABLE {setting.group(1)}_local {ON_CLUSTER} {setting.group(2)}")
        else:
            first = statement.strip().splitlines()[0][:80]
            raise ConfigError(f"cluster DDL: no cluster form for {first!r} (teach foundation/cluster_ddl.py this statement)")
    return out


__all__ = ["ON_CLUSTER", "cluster_statements"]
