"""Who may do what on the store: users, roles, the analyst's limits, and the SQL guard. Pure.

Two roles. ``writer`` is what the stream workers use: anything the engine accepts (like a ClickHouse
server's ``default`` user). ``analyst`` is read-only whatever the request says: the server sets
``readonly=2`` last, after the request's own settings (``readonly=1`` when the request asks for it), caps
the query time and the result size, and refuses SQL that reaches the file system, the network or other
processes (``file``, ``url``, ``executable``, ``s3``, ... and ``INTO OUTFILE``), which the engine's
readonly mode alone lets through. ``readonly=2`` lets an analyst change settings in the SQL too
(``SETTINGS max_execution_time = 5``): those go through the same rules as the URL's — limits only
lowered, otherwise only how results look — since the engine has no per-user ceilings of its own here;
the temporary tables and ``KILL QUERY`` that readonly mode lets through are refused.

Users come from ``ROLLOUTBUS_STORE_USERS`` (``name:role:password`` entries separated by commas) or a
file of one ``name role password`` line each (``#`` comments). With no users configured the store has
one user, ``default``, a writer with no password: the local-only stack's default, like a fresh server.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from foundation.errors import ConfigError
from rolloutbus.store.sqltext import Unreadable, settings_in, statement_keywords, strip_literals

ROLES = ("writer", "analyst")


@dataclass(frozen=True)
class Limits:
    """What one analyst query may take: seconds, result rows, result bytes (0: no limit)."""

    max_execution_time_s: float = 60.0
    max_result_rows: int = 1_000_000
    max_result_bytes: int = 1 << 30

    def settings(self) -> dict[str, str]:
        return {
            "max_execution_time": f"{self.max_execution_time_s:g}",
            "max_result_rows": str(self.max_result_rows),
            "max_result_bytes": str(self.max_result_bytes),
            "result_overflow_mode": "throw",
        }


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password: SecretStr = field(default_factory=lambda: SecretStr(""))

    @property
    def readonly(self) -> bool:
        return self.role == "analyst"

    def check_password(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.password.get_secret_value().encode())


DEFAULT_USERS = (User("default", "writer"),)


def parse_users(spec: str) -> tuple[User, ...]:
    """Users from ``ROLLOUTBUS_STORE_USERS``: a file path, or ``name:role:password`` entries by commas."""
    spec = spec.strip()
    if not spec:
        return DEFAULT_USERS
    path = Path(spec).expanduser()
    if "\n" not in spec and ":" not in spec.split("/")[-1] and path.is_file():
        entries = []
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                parts = line.split(None, 2)
                entries.append(parts + [""] * (3 - len(parts)))
        where = str(path)
    else:
        entries = [(e.split(":", 2) + ["", ""])[:3] for e in spec.split(",") if e.strip()]
        where = "ROLLOUTBUS_STORE_USERS"
    users: dict[str, User] = {}
    for name, role, password in entries:
        name, role = name.strip(), role.strip()
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]*$", name):
            raise ConfigError(f"{where}: user name {name!r} must be letters, digits, '_', '.', '-'")
        if role not in ROLES:
            raise ConfigError(f"{where}: user {name!r} has role {role!r}; use one of {', '.join(ROLES)}")
        if name in users:
            raise ConfigError(f"{where}: user {name!r} is listed twice")
        users[name] = User(name, role, SecretStr(password))
    if not users:
        raise ConfigError(f"{where} names no users: give name:role:password entries")
    return tuple(users.values())


class Refused(Exception):
    """The request is not allowed. ``code`` is the ClickHouse error code the client sees."""

    def __init__(self, message: str, code: int, name: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name


READONLY = (164, "READONLY")
ACCESS_DENIED = (497, "ACCESS_DENIED")
AUTHENTICATION_FAILED = (516, "AUTHENTICATION_FAILED")


def authenticate(users: tuple[User, ...], name: str | None, password: str | None) -> User:
    """The user these credentials name. No name: ``default``."""
    name = name or "default"
    for user in users:
        if user.name == name and user.check_password(password or ""):
            return user
    raise Refused(f"{name}: Authentication failed: password is incorrect, or there is no user with such name.", *AUTHENTICATION_FAILED)


# Functions (table or scalar) that read or write outside the database: files, URLs, other servers,
# processes. ClickHouse's readonly mode stops the table functions but not e.g. the scalar file().
_OUTSIDE = (
    "file", "url", "urlcluster", "executable", "executablepool", "s3", "s3cluster", "gcs", "oss", "cos", "hdfs",
    "hdfscluster", "azureblobstorage", "azureblobstoragecluster", "remote", "remotesecure", "cluster",
    "clusterallreplicas", "mysql", "postgresql", "jdbc", "odbc", "mongodb", "redis", "sqlite", "iceberg",
    "icebergs3", "icebergazure", "icebergazurecluster", "icebergs3cluster", "icebergcluster", "iceberglocal",
    "icebergHDFS", "deltalake", "deltalakes3", "deltalakeazure", "deltalakelocal", "deltalakecluster", "hudi",
    "hudicluster", "input", "python", "arrowflight", "arrowflightsql", "ytsaurus", "filecluster", "paimon",
    "paimons3", "paimonlocal", "dictionary", "loop", "prometheusquery", "prometheusqueryrange",
)
_OUTSIDE_RE = re.compile(r"(?<![\w.$])[`\"]?(" + "|".join(sorted(set(n.lower() for n in _OUTSIDE), key=len, reverse=True)) + r")[`\"]?\s*\(", re.IGNORECASE)
_OUTFILE_RE = re.compile(r"\bINTO\s+OUTFILE\b|\bFROM\s+INFILE\b", re.IGNORECASE)
# Statements the engine's readonly mode lets through that an analyst may not run: temporary tables
# (readonly=2), killing other users' queries (every request runs as the engine's one user), backups.
_ANALYST_REFUSED_STATEMENTS = ("CREATE", "DROP", "INSERT", "KILL", "BACKUP", "RESTORE")


def check_sql(sql: str, readonly: bool, user: User | None = None, limits: Limits | None = None) -> None:
    """Refuse what no client of the store may run, and what a read-only request may not reach; for an
    analyst (``user``), also statements readonly mode lets through and settings the SQL itself changes
    beyond what :func:`effective_settings` allows."""
    code = strip_literals(sql)
    if _OUTFILE_RE.search(code):
        raise Refused("INTO OUTFILE and FROM INFILE are client-side features; the store does not read or write its own files for a client", *ACCESS_DENIED)
    if readonly:
        match = _OUTSIDE_RE.search(code)
        if match:
            raise Refused(
                f"{match.group(1)}() reaches outside the database (files, network, processes): not allowed for read-only users",
                *ACCESS_DENIED,
            )
    if user is not None and user.readonly:
        for keyword in statement_keywords(sql):
            if keyword in _ANALYST_REFUSED_STATEMENTS:
                raise Refused(f"{user.name}: Cannot execute query in readonly mode ({keyword})", *READONLY)
        try:
            changed = settings_in(sql)
        except Unreadable as exc:
            raise Refused(f"cannot check the settings this SQL changes ({exc}): give each SETTINGS value as a plain literal", *READONLY) from None
        for key, value in changed:
            _check_analyst_setting(user, key, value, limits or Limits())


# Settings an analyst may change: how results look, not what a query may reach or use.
_ANALYST_SETTINGS = re.compile(
    r"^(output_format_\w+|format_\w+|date_time_output_format|date_time_input_format|input_format_\w+|"
    r"extremes|totals_mode|max_block_size|join_use_nulls|session_timezone|use_query_cache|limit|offset|"
    r"cast_string_to_dynamic_use_inference|"
    r"cancel_http_readonly_queries_on_client_close|http_\w+|send_progress_in_http_headers|"
    r"wait_end_of_query|add_http_cors_header|enable_http_compression|http_zlib_compression_level)$"
)


def effective_settings(user: User, requested: dict[str, str], limits: Limits, get_request: bool = False) -> dict[str, str]:
    """The settings the engine runs a request with, in order; ``readonly`` last so it cannot be undone.

    A writer gets what it asked for (a GET is read-only, as on a server). An analyst may tighten the
    limits and change how results look; anything else is refused, as a read-only server user's is.
    """
    out: dict[str, str] = {}
    readonly = 0
    for key, value in requested.items():
        if key == "readonly":
            try:
                readonly = max(readonly, int(value))
            except ValueError:
                raise Refused(f"readonly={value!r} is not 0, 1 or 2", 62, "SYNTAX_ERROR") from None
            continue
        if user.readonly:
            _check_analyst_setting(user, key, value, limits)
            if key == "result_overflow_mode":
                continue  # "throw" is what the limits set below
        out[key] = value
    if user.readonly:
        for key, value in limits.settings().items():
            if key not in out:
                out[key] = value
        # 2 lets the SQL lower the limits too (check_sql holds it to the same rules); 1 if asked for.
        readonly = 1 if readonly == 1 else 2
    elif get_request:
        readonly = max(readonly, 2)
    if readonly:
        out["readonly"] = str(readonly)
    return out


def _check_analyst_setting(user: User, key: str, value: str, limits: Limits) -> None:
    """An analyst may lower a limit and change how results look; nothing else."""
    cap = limits.settings().get(key)
    if key == "readonly":
        raise Refused(f"Cannot modify '{key}' setting in readonly mode", *READONLY)
    if cap is not None:
        if key == "result_overflow_mode":
            if value != "throw":
                raise Refused(f"Cannot modify '{key}' setting in readonly mode", *READONLY)
        elif not _within(value, cap):
            raise Refused(f"Cannot raise '{key}' above {cap} for user {user.name}", *READONLY)
    elif not _ANALYST_SETTINGS.match(key):
        raise Refused(f"Cannot modify '{key}' setting in readonly mode", *READONLY)


def _within(value: str, cap: str) -> bool:
    try:
        v, c = float(value), float(cap)
    except ValueError:
        return False
    if c == 0:
        return True
    return 0 < v <= c


__all__ = ["Limits", "User", "ROLES", "DEFAULT_USERS", "parse_users", "Refused", "authenticate", "check_sql",
           "strip_literals", "effective_settings"]
