"""ClickHouse through clickhouse-connect: one client for a ClickHouse server or the local store
(``http(s)://user@host:8123``) and the embedded chDB engine in this process (``chdb://path``, for a
single process that wants no server), and idempotent migrations.

Migrations are the ``NNN_*.sql`` files under ``deploy/clickhouse/migrations`` (or another directory).
``{db}`` in them is the database name. ``schema_migrations`` records which ran, so applying them again
is a no-op. On a cluster the same files run in the form :mod:`foundation.cluster_ddl` derives.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import SecretStr

from foundation.chdb_lock import holder
from foundation.cluster_ddl import cluster_statements
from foundation.errors import ClickHouseError, ConfigError
from foundation.paths import DEPLOY_DIR
from foundation.redact import redact_url, scrub, url_secrets

MIGRATIONS_DIR = DEPLOY_DIR / "clickhouse" / "migrations"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# The DSN as logs and errors show it: the one redactor's (password, lone user part, ?password=...).
# The old name stays for callers that still import it from here.
redact_dsn = redact_url


def connect(
    dsn: str,
    database: str | None = None,
    password: SecretStr | None = None,
    readonly: bool = False,
    create_database: bool = True,
) -> Any:
    """A clickhouse-connect client for ``dsn``, using ``database`` (created if missing)."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError as CCError
    from clickhouse_connect.driver.exceptions import OperationalError

    if database is not None and not _IDENT.match(database):
        raise ConfigError(f"database name {database!r} must be letters, digits and underscores")
    if not dsn.startswith(("chdb:", "http:", "https:", "clickhouse:")):
        raise ConfigError(f"ClickHouse DSN {redact_url(dsn)!r} must start with chdb://, http:// or https://")
    kwargs: dict[str, Any] = {}
    if password is not None and not dsn.startswith("chdb:"):
        kwargs["password"] = password.get_secret_value()
    if dsn.startswith("chdb:"):
        path = urlparse(dsn).path
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            owner = holder(Path(path))
            if owner is not None:
                raise ClickHouseError(
                    f"the embedded ClickHouse store {path} is served by {owner}: connect to it over HTTP "
                    "(ROLLOUTBUS_CLICKHOUSE_DSN=http://127.0.0.1:8123, the default) instead of opening it in this process"
                )
    # urllib3 and the driver log each refused connection as a warning before the error below says it
    # once, plainly.
    for noisy in ("urllib3.connectionpool", "clickhouse_connect.driver._backend.http_sync"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        client = clickhouse_connect.get_client(dsn=dsn, **kwargs)
        if database:
            if create_database:
                client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
            client.database = database
        if readonly:
            # 1 forbids writes and setting changes for this client's session (analyst SQL). A user the
            # server already holds read-only (the store's analyst, at readonly=2) cannot change it: the
            # client refuses the setting, and the server's own read-only mode stands.
            from clickhouse_connect.driver.exceptions import ProgrammingError

            try:
                client.set_client_setting("readonly", "1")
            except ProgrammingError as exc:
                if "readonly" not in str(exc):
                    raise
    except OperationalError as exc:
        raise ClickHouseError(f"cannot reach ClickHouse at {redact_url(dsn)}: {_reason(exc, password, dsn)}") from exc
    except CCError as exc:
        msg = _scrub(str(exc), password, dsn)
        if "EmbeddedServer" in msg or "one engine path per process" in msg or "different path" in msg:
            raise ClickHouseError(
                f"the embedded ClickHouse store {redact_url(dsn)} is open in another process "
                "(in embedded mode one process owns it: stop that process, or use a ClickHouse server DSN)"
            ) from exc
        raise ClickHouseError(f"ClickHouse at {redact_url(dsn)}: {msg.splitlines()[0] if msg else exc!r}") from exc
    except Exception as exc:  # noqa: BLE001 - transport errors of every kind end here
        msg = _scrub(str(exc), password, dsn)
        raise ClickHouseError(f"cannot reach ClickHouse at {redact_url(dsn)}: {msg.splitlines()[0] if msg else exc!r}") from exc
    return client


def _reason(exc: BaseException, password: SecretStr | None, dsn: str = "") -> str:
    """Why a connection failed, in a few words; a refused one says what to do (most often the store is not running)."""
    if "refused" in str(exc).lower():
        return ("connection refused: nothing listens there (start it with `rolloutbus store` or `rolloutbus up`, "
                "or set ROLLOUTBUS_CLICKHOUSE_DSN=chdb:// to open the data in this process)")
    return _scrub(str(exc), password, dsn).splitlines()[0][:200]


def _scrub(msg: str, password: SecretStr | None, dsn: str = "") -> str:
    """``msg`` without the password nor the DSN's secrets (a driver's error may quote the URL it was given)."""
    return scrub(msg, [password.get_secret_value() if password is not None else "", *url_secrets(dsn)])


def split_statements(sql: str) -> list[str]:
    """Split a migration file into statements at semicolons that end a line; drops comment-only chunks."""
    out = []
    for chunk in re.split(r";\s*(?:\n|$)", sql):
        lines = [ln for ln in chunk.splitlines() if ln.strip() and not ln.strip().startswith("--")]
        if lines:
            out.append("\n".join(lines))
    return out


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[tuple[int, Path]]:
    files = []
    for path in sorted(directory.glob("*.sql")):
        match = re.match(r"^(\d+)_", path.name)
        if match:
            files.append((int(match.group(1)), path))
    return files


def migration_statements(path: Path, cluster: bool = False) -> list[str]:
    """One migration file's statements (``{db}`` not yet replaced); their cluster form with ``cluster``."""
    statements = split_statements(path.read_text())
    return cluster_statements(statements) if cluster else statements


def migrate(client: Any, database: str, directory: Path = MIGRATIONS_DIR, substitutions: dict[str, str] | None = None,
            cluster: bool = False) -> list[str]:
    """Apply the migrations not yet recorded in ``database.schema_migrations``. Returns what ran.

    ``cluster``: in their cluster form, with ``substitutions['cluster']`` naming the cluster."""
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {database}.schema_migrations "
        "(version UInt32, name String, applied_ns Int64) ENGINE = ReplacingMergeTree ORDER BY version"
    )
    done = {row[0] for row in client.query(f"SELECT version FROM {database}.schema_migrations FINAL").result_rows}
    ran = []
    subs = {"db": database, **(substitutions or {})}
    for version, path in migration_files(directory):
        if version in done:
            continue
        for statement in migration_statements(path, cluster):
            for key, value in subs.items():
                statement = statement.replace("{" + key + "}", value)
            try:
                client.command(statement)
            except Exception as exc:  # noqa: BLE001
                raise ClickHouseError(f"migration {path.name} failed: {str(exc).splitlines()[0]}") from exc
        client.insert(
            f"{database}.schema_migrations",
            [[version, path.name, time.time_ns()]],
            column_names=["version", "name", "applied_ns"],
        )
        ran.append(path.name)
    return ran


def migrate_for(client: Any, database: str, cluster: str | None = None) -> list[str]:
    """Single-node migrations, or the replicated/distributed variant when ``cluster`` names one."""
    if cluster:
        if not _IDENT.match(cluster):
            raise ConfigError(f"cluster name {cluster!r} must be letters, digits and underscores")
        return migrate(client, database, substitutions={"cluster": cluster}, cluster=True)
    return migrate(client, database)


def open_store(dsn: str, database: str, password: SecretStr | None = None, cluster: str | None = None) -> Any:
    """Connect and bring the schema up to date: what every writer calls at start."""
    client = connect(dsn, database=database, password=password)
    migrate_for(client, database, cluster)
    return client
