"""The SQL task: gold queries run, the split never leaks a held-out question, rewards follow execution."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolloutbus.demo import sql


def test_every_gold_query_returns_rows() -> None:
    db = sql.connect()
    for q in sql.questions():
        ok, rows = sql.execute(db, q.gold)
        assert ok and rows, q


def test_split_is_disjoint_by_question_and_covers_every_level() -> None:
    qs = sql.questions()
    train, test = sql.split(qs, 150, seed=0)
    assert len(test) == 150 and len(train) + len(test) == len(qs)
    assert not {q.text for q in train} & {q.text for q in test}
    assert {q.level for q in test} == {q.level for q in qs} == {1, 2, 3, 4, 5}
    assert sql.split(qs, 150, seed=0) == (train, test)


@pytest.mark.parametrize(("reply", "query"), [
    ("```sql\nSELECT name FROM employees;\n```", "SELECT name FROM employees"),
    ("Here is the query: SELECT COUNT(*) FROM employees; It counts.", "SELECT COUNT(*) FROM employees"),
    ("select name from departments", "select name from departments"),
])
def test_extract_sql(reply: str, query: str) -> None:
    assert sql.extract_sql(reply) == query


def test_execution_match_ignores_row_order_and_column_names_not_values() -> None:
    db = sql.connect()
    gold = "SELECT name FROM employees WHERE hire_year = 2018"
    ok, rows = sql.execute(db, "SELECT e.name AS who FROM employees e WHERE e.hire_year = 2018 ORDER BY name DESC")
    assert ok and sql.execution_match(db, rows, gold)
    ok, rows = sql.execute(db, "SELECT name FROM employees WHERE hire_year = 2019")
    assert ok and not sql.execution_match(db, rows, gold)


def test_execute_refuses_writes_and_reports_errors() -> None:
    db = sql.connect()
    assert sql.execute(db, "DROP TABLE employees") == (False, "only SELECT queries are allowed")
    ok, err = sql.execute(db, "SELECT nope FROM employees")
    assert not ok and "no such column" in str(err)


def test_the_curve_is_drawn_when_a_version_has_no_rewarded_rollout(tmp_path: Path) -> None:
    # Rollouts stopped at the end of a run have no reward: their version has avg NULL in ClickHouse.
    from rolloutbus.demo.report import plot

    png = tmp_path / "curve.png"
    plot([(0, 40, 0.1), (1, 3, None)], [(1, 0.3, 0.2)], 0, 1, 0.13, 0.33, png, "Text-to-SQL agent")
    assert png.stat().st_size > 10_000
