"""`rolloutbus query --trajectory` on a store where nothing was stored yet: one clear line, no traceback.

A real `rolloutbus store` with a database that was made but never migrated (no tables): the analyst is
told there are no rollouts yet and how the tables get made, not which internal view is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.integration.store.conftest import REPO, Store, start_store

pytestmark = pytest.mark.integration


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = start_store(tmp_path / "data")
    r = requests.post(store.url, timeout=30, data="CREATE DATABASE rolloutbus")
    assert r.status_code == 200, r.text
    yield store
    store.proc.terminate()
    store.proc.wait(20)


def query(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTBUS_")}
    env.update({"PYTHONPATH": str(REPO), "ROLLOUTBUS_DATA_DIR": str(store.data_dir), "ROLLOUTBUS_CLICKHOUSE_DSN": store.url})
    return subprocess.run([sys.executable, "-m", "rolloutbus.cli", "query", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [("--trajectory", "ro-1"), ("--format", "csv", "--trajectory", "ro-1"),
                                  ("--format", "jsonl", "--trajectory", "ro-1")])
def test_trajectory_on_a_database_never_migrated_says_nothing_is_stored_yet(store: Store, args: tuple[str, ...]) -> None:
    r = query(store, *args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("rolloutbus query: no rollouts stored yet") and "rolloutbus migrate" in lines[0], lines[0]
    assert "v_trajectory" not in lines[0] and "Unknown table" not in lines[0], lines[0]
    assert r.stdout == ""


def test_plain_sql_on_a_missing_table_still_shows_clickhouses_error(store: Store) -> None:
    """The analyst's own SQL naming a missing table gets ClickHouse's message: it is about their query."""
    r = query(store, "SELECT count() FROM spans")
    assert r.returncode != 0 and "UNKNOWN_TABLE" in r.stderr and "Traceback" not in r.stderr, r.stderr
