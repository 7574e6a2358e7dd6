"""The SQL task: gold queries run, the splits never leak a held-out question or database, rewards follow
execution, the prompt shows the question's own database, the agent's rewrites and greedy test mode."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from foundation.errors import ConfigError
from producers import rollout
from rolloutbus.demo import sql
from rolloutbus.demo.sql_agent import MAX_REWRITES, SQLAgent
from rolloutbus.trainer_api.resources import from_version
from schemas import ResourceVersion

OTHERS = [name for name in sql.DATABASES if name != "company"]
_LITERAL = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")


def _shape(query: str) -> str:
    return _LITERAL.sub("?", query.strip().rstrip(";"))


@pytest.mark.parametrize("name", list(sql.DATABASES))
def test_every_gold_query_returns_rows(name: str) -> None:
    db = sql.connect(name)
    for q in sql.questions(name):
        assert q.db == name
        ok, rows = sql.execute(db, q.gold)
        assert ok and rows, q


def test_the_databases() -> None:
    assert list(sql.DATABASES)[0] == "company" and len(sql.DATABASES) >= 7
    qs = sql.all_questions()
    assert len({q.qid for q in qs}) == len(qs), "question ids never collide across databases"
    assert len({d.schema for d in sql.DATABASES.values()}) == len(sql.DATABASES)
    for name in OTHERS:
        own = sql.questions(name)
        assert 30 <= len(own) <= 60 and {q.level for q in own} == {1, 2, 3, 4, 5}
        assert all(q.qid.startswith(f"{name}:") for q in own)
        assert sql.schema(name) == sql.DATABASES[name].schema and sql.schema(name).count("CREATE TABLE") == 2
    with pytest.raises(ValueError, match="library"):
        sql.connect("nowhere")


def test_the_company_database_is_unchanged() -> None:
    qs = sql.questions()
    assert len(qs) == 252 and qs[0] == sql.Question("L1-names", 1, "List the names of all employees.", "SELECT name FROM employees")
    assert all(q.db == "company" for q in qs) and sql.schema() == sql.SCHEMA
    assert sql.SYSTEM_PROMPT == sql.SYSTEM_TEMPLATE.replace("{schema}", sql.SCHEMA)
    example_turns = [t for q, a in sql.EXAMPLES for t in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]
    text = "How many employees are there?"
    assert sql.messages(text) == [{"role": "system", "content": sql.SYSTEM_PROMPT}, *example_turns, {"role": "user", "content": text}]
    assert sql.question_messages(qs[2]) == sql.messages(text) and sql.example_pairs("company") == sql.EXAMPLES
    assert sql.connect().execute("SELECT COUNT(*) FROM employees").fetchone() == (40,)


def test_split_is_disjoint_by_question_and_covers_every_level() -> None:
    qs = sql.questions()
    train, test = sql.split(qs, 150, seed=0)
    assert len(test) == 150 and len(train) + len(test) == len(qs)
    assert not {q.text for q in train} & {q.text for q in test}
    assert {q.level for q in test} == {q.level for q in qs} == {1, 2, 3, 4, 5}
    assert sql.split(qs, 150, seed=0) == (train, test)


def test_split_databases_holds_out_whole_databases_and_questions() -> None:
    s = sql.split_databases(seed=0)
    assert (len(s.validation), len(s.test_seen), len(s.test_unseen)) == (30, 50, 100) and len(s.held_out_dbs) == 2
    parts = [s.train, s.validation, s.test_seen, s.test_unseen]
    ids = [q.qid for part in parts for q in part]
    assert len(ids) == len(set(ids)), "the four sets are disjoint"
    assert {q.db for q in s.test_unseen} == set(s.held_out_dbs)
    assert not {q.db for q in s.train + s.validation + s.test_seen} & set(s.held_out_dbs), "a held-out schema is never seen"
    assert len(s.train) + 30 + 50 == sum(len(sql.questions(n)) for n in sql.DATABASES if n not in s.held_out_dbs)
    assert {q.level for q in s.test_seen} == {q.level for q in s.test_unseen} == {1, 2, 3, 4, 5} or len(s.test_seen) < 5
    assert s.test == s.test_seen + s.test_unseen
    assert sql.split_databases(seed=0) == s and sql.split_databases(seed=1) != s
    assert all("company" not in sql.split_databases(seed=k).held_out_dbs for k in range(30))


def test_a_subset_of_the_training_questions_keeps_levels_and_databases_in_proportion() -> None:
    train = sql.split_databases(seed=0).train
    sub = sql.subset(train, 32, seed=0)
    assert len(sub) == len({q.qid for q in sub}) == 32 and {q.qid for q in sub} <= {q.qid for q in train}
    for attr in ("level", "db"):  # each level (and database) within 1.5 questions of its share of the whole
        for value in {getattr(q, attr) for q in train}:
            share = sum(getattr(q, attr) == value for q in train) * 32 / len(train)
            assert abs(sum(getattr(q, attr) == value for q in sub) - share) <= 1.5, (attr, value)
    assert sql.subset(train, 32, seed=0) == sub and sql.subset(train, 32, seed=1) != sub
    # shuffled: a feeder taking them in turn mixes levels (picked level by level, they would change level 4 times)
    assert sum(a.level != b.level for a, b in zip(sub, sub[1:])) > 8
    assert sql.subset(train, 0) == train and sql.subset(train, 10_000) == train


@pytest.mark.parametrize("kwargs", [{"test_unseen": 10_000}, {"held_out_dbs": 99}, {"validation": 600, "test_seen": 600},
                                    {"validation": -1}, {"held_out_dbs": 0, "test_unseen": 1}])
def test_split_databases_refuses_sizes_that_do_not_fit(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        sql.split_databases(**kwargs)


def test_worked_examples_leak_no_question() -> None:
    golds = sql.all_questions()
    gold_literals = {lit for q in golds for lit in _LITERAL.findall(q.gold)}
    gold_shapes = {_shape(q.gold) for q in golds}
    texts = {q.text for q in golds}
    for name in OTHERS:
        pairs = sql.example_pairs(name)
        assert len(pairs) == 3 and " JOIN " in pairs[0][1] and "COUNT(" in pairs[1][1] and " WHERE " in pairs[2][1]
        db = sql.connect(name)
        for text, query in pairs:
            ok, rows = sql.execute(db, query)
            assert ok and rows, (name, query)
            assert text not in texts and _shape(query) not in gold_shapes, (name, query)
            assert not set(_LITERAL.findall(query)) & gold_literals, (name, query)


def test_question_messages_show_the_question_database() -> None:
    q = sql.questions("library")[0]
    msgs = sql.question_messages(q)
    assert sql.schema("library") in msgs[0]["content"] and sql.SCHEMA not in msgs[0]["content"]
    assert "employees" not in json.dumps(msgs) and msgs[-1] == {"role": "user", "content": q.text}
    assert [m["content"] for m in msgs[1:-1]] == [t for pair in sql.example_pairs("library") for t in pair]
    assert sql.messages(q.text, db="library") == msgs
    # A resource's template is rendered with the question's schema; its (company) examples are used as given.
    template, examples = sql.template_from_config(sql.prompt_config("Only SQL for:\n{schema}", [("q1", "SELECT 1")]))
    msgs = sql.question_messages(q, template, examples)
    assert msgs[0]["content"] == "Only SQL for:\n" + sql.schema("library") and msgs[1:3] == [
        {"role": "user", "content": "q1"}, {"role": "assistant", "content": "SELECT 1"}]
    assert sql.template_from_config({}) == (sql.SYSTEM_TEMPLATE, None)


@pytest.mark.parametrize("name", list(sql.DATABASES))
def test_score_is_execution_match_on_the_question_database(name: str) -> None:
    q = next(q for q in sql.questions(name) if q.level == 5)
    assert sql.score(q, q.gold) == 1.0
    assert sql.score(q, f"Here you go:\n```sql\n{q.gold};\n```") == 1.0
    other = sql.questions(name)[2]  # a COUNT over the whole child table: other rows
    assert sql.score(q, other.gold) == 0.0
    assert sql.score(q, "SELECT nope FROM nowhere") == 0.0 and sql.score(q, "") == 0.0 and sql.score(q, "DROP TABLE x") == 0.0


def test_score_runs_the_gold_on_a_fresh_copy() -> None:
    q = sql.questions("shop")[2]
    table = sql.DATABASES["shop"].tables[1][0]
    assert sql.score(q, f"WITH a AS (SELECT 1) DELETE FROM {table}") == 0.0
    assert sql.score(q, q.gold) == 1.0


def test_question_json_round_trip_and_old_json() -> None:
    for q in (sql.questions()[5], sql.questions("fleet")[7]):
        assert sql.Question.from_json(q.to_json()) == q
    old = {"qid": "L1-names", "level": 1, "question": "List the names of all employees.", "gold": "SELECT name FROM employees"}
    assert sql.Question.from_json(json.dumps(old)) == sql.questions()[0]


# --------------------------------------------------------------------------- the agent, with a fake OpenAI client


class _FakeOpenAI:
    """Answers each chat call with the next scripted reply; records what it was asked."""

    replies: list[str] = []
    calls: list[dict[str, Any]] = []

    def __init__(self, **_kw: Any) -> None:
        self.chat = self
        self.completions = self

    def create(self, **kw: Any) -> Any:
        type(self).calls.append(kw | {"messages": list(kw["messages"])})
        text = type(self).replies.pop(0)
        return type("R", (), {"choices": [type("C", (), {"message": type("M", (), {"content": text})()})()]})()


class _Spans:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def emit(self, key: str, name: str, record: dict[str, Any]) -> bool:
        self.records.append((name, record))
        return True


def _run(agent: SQLAgent, q: sql.Question, replies: list[str], mode: str = "train",
         resources: dict[str, Any] | None = None) -> tuple[float, list[dict[str, Any]], _Spans]:
    _FakeOpenAI.replies, _FakeOpenAI.calls = list(replies), []
    spans = _Spans()
    with rollout("t", mode=mode, transport=spans) as r:  # type: ignore[arg-type]
        reward = agent.rollout(q.to_json(), resources or {}, r)
    return reward, _FakeOpenAI.calls, spans


@pytest.fixture
def fake_openai(monkeypatch: pytest.MonkeyPatch) -> None:
    import openai

    monkeypatch.setattr(openai, "OpenAI", _FakeOpenAI)


def test_agent_rewrites_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLOUTBUS_AGENT_REWRITES", raising=False)
    assert SQLAgent().max_rewrites == MAX_REWRITES == 2
    monkeypatch.setenv("ROLLOUTBUS_AGENT_REWRITES", "0")
    assert SQLAgent().max_rewrites == 0 and SQLAgent(max_rewrites=3).max_rewrites == 3
    for bad in ("-1", "two"):
        monkeypatch.setenv("ROLLOUTBUS_AGENT_REWRITES", bad)
        with pytest.raises(ConfigError, match="ROLLOUTBUS_AGENT_REWRITES"):
            SQLAgent()


@pytest.mark.usefixtures("fake_openai")
def test_agent_on_another_database_rewrites_then_matches() -> None:
    q = sql.questions("hospital")[-1]
    reward, calls, spans = _run(SQLAgent(temperature=0.7, max_rewrites=2), q, ["SELECT nope FROM wards", q.gold])
    assert reward == 1.0 and [c["temperature"] for c in calls] == [0.7, 0.7], "training rollouts sample"
    assert sql.schema("hospital") in calls[0]["messages"][0]["content"]
    assert "That query failed" in calls[1]["messages"][-1]["content"]
    tools = [r for name, r in spans.records if name == "rolloutbus.Span" and r["kind"] == "tool"]
    assert len(tools) == 2


@pytest.mark.usefixtures("fake_openai")
def test_agent_single_turn_and_greedy_in_test_mode() -> None:
    q = sql.questions("league")[10]
    reward, calls, _ = _run(SQLAgent(temperature=1.0, max_rewrites=0), q, ["SELECT nope FROM teams", q.gold], mode="test")
    assert reward == 0.0 and len(calls) == 1, "no rewrite in the single-turn form"
    assert calls[0]["temperature"] == 0.0, "evaluation rollouts are greedy"
    reward, calls, _ = _run(SQLAgent(temperature=1.0, max_rewrites=0), q, [q.gold], mode="val")
    assert reward == 1.0 and calls[0]["temperature"] == 0.0


def test_graded_reward_gives_half_the_row_f1_to_most_of_a_several_row_answer_and_nothing_less() -> None:
    db = sql.connect()
    gold = "SELECT name FROM employees WHERE hire_year = 2018"
    ok, rows = sql.execute(db, gold)
    n = len(rows)
    assert ok and n >= 4, "one row of four or more: F1 below 0.5"
    assert sql.graded_reward("graded", db, rows, gold) == sql.graded_reward("match", db, rows, gold) == 1.0
    most = rows[:-1]  # all but one of the gold's rows: precision 1, recall (n-1)/n
    f1 = 2 * (n - 1) / (2 * n - 1)
    assert f1 >= sql.GRADED_MIN_F1 and sql.graded_reward("graded", db, most, gold) == pytest.approx(sql.GRADED_WEIGHT * f1)
    assert sql.graded_reward("match", db, most, gold) == 0.0
    assert sql.graded_reward("graded", db, most + [("Nobody",)], gold) < sql.graded_reward("graded", db, most, gold), "others cost"
    assert sql.graded_reward("graded", db, rows[:1], gold) == 0.0, f"one of {n} rows: F1 below {sql.GRADED_MIN_F1}"
    ok, everyone = sql.execute(db, "SELECT name FROM employees")  # the filter left out: every gold row among 40
    assert sql.graded_reward("graded", db, everyone, gold) == 0.0
    ok, wide = sql.execute(db, "SELECT * FROM employees WHERE hire_year = 2018")  # other columns: no row shared
    assert sql.graded_reward("graded", db, wide, gold) == 0.0
    assert sql.graded_reward("graded", db, None, gold) == 0.0 and sql.graded_reward("graded", db, [], gold) == 0.0
    assert sql.graded_reward("graded", db, [(None,), (1,)], gold) == 0.0, "rows that do not sort score 0, not raise"
    count = "SELECT COUNT(*) FROM employees WHERE hire_year = 2018"  # a one-row gold: a match or nothing
    assert sql.graded_reward("graded", db, [(n,), (n + 1,)], count) == 0.0
    assert sql.row_f1([(1,), (1,), (2,)], [(1,), (1,), (3,)]) == pytest.approx(2 / 3), "multisets: a repeated row counts twice"
    assert sql.row_f1([(1,), (1,), (2,)], [(1,), (2,), (2,)]) == pytest.approx(2 / 3), "and matches as often as the gold has it"
    with pytest.raises(ValueError, match="unknown SQL reward 'partial'"):
        sql.graded_reward("partial", db, rows, gold)


def test_no_question_pays_a_query_counting_to_200() -> None:
    """Every integer up to 200 holds most counts, and advantages are normalised by the group's spread, so any credit in
    a failing group would be learnt as a match: such a query earns nothing on any question of any database."""
    every_integer = "WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n LIMIT 200) SELECT x FROM n"
    paid = []
    for q in sql.all_questions():
        db = sql.connect(q.db)
        ok, rows = sql.execute(db, every_integer)
        if sql.graded_reward("graded", db, rows, q.gold):  # type: ignore[arg-type]
            paid.append(q.qid)
        db.close()
    assert ok and not paid


@pytest.mark.usefixtures("fake_openai")
def test_a_graded_agent_grades_training_rollouts_and_matches_measured_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLOUTBUS_AGENT_REWARD", raising=False)
    q = next(q for q in sql.questions() if q.gold == "SELECT name FROM employees WHERE hire_year = 2018")
    db = sql.connect()
    ok, gold_rows = sql.execute(db, q.gold)
    names = ", ".join(f"'{r[0]}'" for r in gold_rows[:-1])
    partial = f"SELECT name FROM employees WHERE name IN ({names})"  # all but one of the gold's rows
    reward, _, _ = _run(SQLAgent(max_rewrites=0, reward="graded"), q, [partial])
    assert 0.0 < reward < sql.GRADED_WEIGHT
    assert _run(SQLAgent(max_rewrites=0), q, [partial])[0] == 0.0, "execution match by default"
    for mode in ("val", "test"):
        assert _run(SQLAgent(max_rewrites=0, reward="graded"), q, [partial], mode=mode)[0] == 0.0, mode
    monkeypatch.setenv("ROLLOUTBUS_AGENT_REWARD", "graded")
    assert SQLAgent().reward == "graded"
    monkeypatch.setenv("ROLLOUTBUS_AGENT_REWARD", "partial")
    with pytest.raises(ConfigError, match="ROLLOUTBUS_AGENT_REWARD='partial'"):
        SQLAgent()
    with pytest.raises(ConfigError, match="reward='partial'"):
        SQLAgent(reward="partial")


@pytest.mark.usefixtures("fake_openai")
def test_agent_uses_a_prompt_resource_with_the_question_schema() -> None:
    q = sql.questions("cinema")[0]
    prompt = ResourceVersion(name="prompt", version=2, kind="prompt_template", created_ns=1,
                             config=sql.prompt_config("Write SQLite for {schema}", None))
    # As the runner hands it over: a PromptTemplate carrying its version's whole config (template and examples).
    reward, calls, spans = _run(SQLAgent(max_rewrites=0), q, ["SELECT title FROM films WHERE 1 = 0"],
                                resources={"prompt": from_version(prompt)})
    assert reward == 0.0 and calls[0]["messages"][0]["content"] == "Write SQLite for " + sql.schema("cinema")
    assert calls[0]["messages"][1]["content"] == sql.example_pairs("cinema")[0][0]
    assert any(r["kind"] == "validator" for name, r in spans.records if name == "rolloutbus.Span"), "an empty result"


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


def test_a_connection_can_be_copied_with_sqlite_backup() -> None:
    """connect() leaves no transaction open: backup() (how the LangGraph example writes its .sqlite files) ends."""
    import sqlite3

    from rolloutbus.demo.sql import connect

    src, dst = connect("company"), sqlite3.connect(":memory:")
    src.backup(dst)
    assert dst.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0
