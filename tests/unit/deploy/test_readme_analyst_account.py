"""deploy/README.md gives analysts a read-only account's DSN, never the writer's.

The writer is the ClickHouse user the stack's processes insert with (``CLICKHOUSE_USER`` of the compose
file's server, the ``writer`` of the podman run's store). The analysts' row must name another user, and
the README's store users for it must make that user an ``analyst`` (read-only) there."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rolloutbus.store.access import parse_users

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "deploy" / "README.md").read_text()


def _writer_users() -> set[str]:
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    users = {compose["services"]["clickhouse"]["environment"]["CLICKHOUSE_USER"]}
    local = (ROOT / "deploy" / "compose.local.yml").read_text()
    spec = re.search(r'ROLLOUTBUS_STORE_USERS: "([^"]+)"', local)
    assert spec, "compose.local.yml names the store's users"
    users |= {u.name for u in parse_users(re.sub(r"\$\{[^}]*\}", "pw", spec.group(1))) if u.role == "writer"}
    return users


def _analysts_row() -> str:
    rows = [line for line in README.splitlines() if line.startswith("| analysts |")]
    assert len(rows) == 1, rows
    return rows[0]


def test_analysts_get_a_dsn_of_their_own_not_the_writers() -> None:
    row = _analysts_row()
    dsns = re.findall(r"ROLLOUTBUS_CLICKHOUSE_DSN=(\S+)", row)
    assert dsns, row
    for dsn in dsns:
        user = re.match(r"https?://([^@:/]+)@", dsn)
        assert user, f"the analysts' DSN names its user: {dsn}"
        assert user.group(1) not in _writer_users(), f"analysts are given the writer's account: {dsn}"
        assert ":" not in dsn.split("//", 1)[1].split("@", 1)[0], "no password in a DSN"


def test_the_readme_makes_that_user_read_only_on_the_store_and_on_a_server() -> None:
    user = re.search(r"ROLLOUTBUS_CLICKHOUSE_DSN=https?://([^@]+)@", _analysts_row()).group(1)  # type: ignore[union-attr]
    spec = re.search(r"ROLLOUTBUS_STORE_USERS=(\S+?)`", README)
    assert spec, "the README shows the store's users with the analyst"
    roles = {u.name: u.role for u in parse_users(re.sub(r"\$\w+", "pw", spec.group(1)))}
    assert roles.get(user) == "analyst", roles
    assert re.search(rf"CREATE USER {user}\b.*readonly", README) and f"GRANT SELECT ON rolloutbus.* TO {user}" in README
