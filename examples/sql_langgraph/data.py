"""The SQL example's tasks in the write-ups' shape (``question``, ``db_id``, ``db_path``, ``ground_truth``),
from the project's generated SQLite databases (:mod:`rolloutbus.demo.sql`; Spider cannot be downloaded
here): each database is written once to a ``.sqlite`` file, the split is the demo's
(:func:`rolloutbus.demo.sql.split_databases`: validation from the training databases, test with two
databases never trained on)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from rolloutbus.demo import sql
from sql_agent import EXAMPLES_SUFFIX


def write_databases(directory: Path) -> dict[str, Path]:
    """Each generated database as a SQLite file under ``directory`` (kept once written), its three worked examples
    (the demo's: questions no task asks) beside it as ``<name>.examples.json``, which the agent's prompt shows."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in sql.DATABASES:
        path = directory / f"{name}.sqlite"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.unlink(missing_ok=True)
            src, dst = sql.connect(name), sqlite3.connect(tmp)
            src.commit()  # connect() leaves its inserts in an open transaction, which a backup waits on forever
            src.backup(dst)
            src.close()
            dst.close()
            tmp.rename(path)
        examples = path.with_suffix(EXAMPLES_SUFFIX)
        if not examples.exists():
            examples.write_text(json.dumps([list(pair) for pair in sql.example_pairs(name)], indent=1))
        paths[name] = path.resolve()
    return paths


def records(questions: list[sql.Question], paths: dict[str, Path]) -> list[dict[str, Any]]:
    return [{"id": q.qid, "question": q.text, "db_id": q.db, "db_path": str(paths[q.db]), "ground_truth": q.gold,
             "level": q.level} for q in questions]


def datasets(directory: Path | None = None, seed: int = 0, validation: int = 30, test: int = 60) -> tuple[list[dict[str, Any]], ...]:
    """(train, validation, test) as lists of dicts."""
    directory = directory or Path(os.environ.get("ROLLOUTBUS_DATA_DIR", ".rolloutbus")) / "sql-example"
    paths = write_databases(directory)
    split = sql.split_databases(seed=seed, validation=validation, test_seen=test // 3, test_unseen=test - test // 3)
    return records(split.train, paths), records(split.validation, paths), records(split.test, paths)
