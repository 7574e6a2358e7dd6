"""The SQL demo's task: Text-to-SQL on a small company database, rewarded by execution match.

Everything here is pure and deterministic: the SQLite database (two tables, built from a seed-free
table of rows), a few hundred question / gold-SQL pairs from templates at five levels (single table,
WHERE, aggregates, ORDER BY/LIMIT, JOIN), a split by question (each template instance lands on one
side, so a held-out question is never trained on), the prompt, SQL extraction from a model's reply,
execution and execution match.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from dataclasses import dataclass
from typing import Any, Sequence

SCHEMA = """CREATE TABLE departments (id INTEGER PRIMARY KEY, name TEXT, city TEXT, budget INTEGER);
CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT, department_id INTEGER, salary INTEGER, hire_year INTEGER);"""

DEPARTMENTS = [(1, "Sales", "Boston", 300000), (2, "Engineering", "Denver", 900000), (3, "Marketing", "Austin", 250000),
               (4, "Finance", "Boston", 400000), (5, "Support", "Denver", 150000)]
_FIRST = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack", "Karen", "Leo",
          "Maria", "Nathan", "Olivia", "Paul", "Quinn", "Rosa", "Sam", "Tina", "Uma", "Victor", "Wendy", "Xavier",
          "Yara", "Zack", "Amir", "Bella", "Chen", "Dana", "Elif", "Femi", "Gina", "Hugo", "Ines", "Jonas", "Kofi",
          "Lena", "Mateo", "Nora"]


def _employees() -> list[tuple[int, str, int, int, int]]:
    rows = []
    for i, name in enumerate(_FIRST):
        # Distinct salaries (ORDER BY salary has no ties); years 2015..2024; departments round-robin-ish.
        rows.append((i + 1, name, 1 + (i * 7) % 5, 41000 + ((i * 37) % 40) * 2000, 2015 + (i * 3) % 10))
    return rows


EMPLOYEES = _employees()
YEARS = list(range(2016, 2024))
SALARIES = list(range(50000, 111000, 10000))
CITIES = sorted({d[2] for d in DEPARTMENTS})

# The system prompt as a template: ``{schema}`` is where the database's schema goes.
SYSTEM_TEMPLATE = "You translate questions into SQLite queries for this database:\n{schema}\nReply with one SQL query only."


def render(template: str, schema: str = SCHEMA) -> str:
    """The system prompt from a template: the schema where ``{schema}`` is, else on a line after the text.

    A plain replace, not ``str.format``: a template written by an optimizer may hold other braces.
    """
    return template.replace("{schema}", schema) if "{schema}" in template else f"{template.rstrip()}\n{schema}"


SYSTEM_PROMPT = render(SYSTEM_TEMPLATE)
# The JOIN first and a one-table query last: this small model copies the most recent example's shape.
EXAMPLES: list[tuple[str, str]] = [
    ("List the names of employees in Boston.",
     "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.city = 'Boston';"),
    ("How many departments are there?", "SELECT COUNT(*) FROM departments;"),
    ("What is the budget of the Support department?", "SELECT budget FROM departments WHERE name = 'Support';"),
]


# Hand-written candidate prompts for APO's dry run (``rolloutbus demo --task sql --algorithm apo``). Their
# examples use values and wordings that no question of the task uses, so nothing held out leaks in.
_RULES = ("You translate questions into SQLite queries for this database:\n{schema}\n"
          "Use only these tables and columns. An employee's department name or city needs "
          "JOIN departments d ON e.department_id = d.id. Reply with one SQL query only.")
_MORE_EXAMPLES: list[tuple[str, str]] = [
    ("List the names of employees in departments with a budget over 350000.",
     "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.budget > 350000;"),
    ("Which department has the smallest budget?", "SELECT name FROM departments ORDER BY budget ASC LIMIT 1;"),
    ("What is the total budget of the departments in Denver?", "SELECT SUM(budget) FROM departments WHERE city = 'Denver';"),
    ("How many employees were hired in 2015?", "SELECT COUNT(*) FROM employees WHERE hire_year = 2015;"),
    ("List the names of employees who earn less than 45000.", "SELECT name FROM employees WHERE salary < 45000;"),
]
HAND_WRITTEN: list[tuple[str, str, list[tuple[str, str]]]] = [  # (name, template, examples)
    ("rules", _RULES, EXAMPLES),
    ("more examples", SYSTEM_TEMPLATE, _MORE_EXAMPLES),
    ("rules + more examples", _RULES, _MORE_EXAMPLES),
]

@dataclass(frozen=True)
class Question:
    qid: str
    level: int  # 1 single table, 2 WHERE, 3 aggregate, 4 ORDER BY/LIMIT, 5 JOIN
    text: str
    gold: str

    def to_json(self) -> str:
        return json.dumps({"qid": self.qid, "level": self.level, "question": self.text, "gold": self.gold})

    @classmethod
    def from_json(cls, data: str | dict[str, Any]) -> Question:
        d = json.loads(data) if isinstance(data, str) else data
        return cls(str(d["qid"]), int(d["level"]), str(d["question"]), str(d["gold"]))


def _join(where: str, select: str = "e.name") -> str:
    return f"SELECT {select} FROM employees e JOIN departments d ON e.department_id = d.id WHERE {where}"


def questions() -> list[Question]:
    """Every question of the task (about 350), in a fixed order."""
    out: list[Question] = []

    def add(level: int, key: str, text: str, gold: str) -> None:
        out.append(Question(f"L{level}-{key}", level, text, gold))

    add(1, "names", "List the names of all employees.", "SELECT name FROM employees")
    add(1, "depts", "List the names of all departments.", "SELECT name FROM departments")
    add(1, "count", "How many employees are there?", "SELECT COUNT(*) FROM employees")
    add(1, "cities", "List the cities of all departments.", "SELECT city FROM departments")
    for _, name, *_rest in EMPLOYEES:
        add(2, f"salary-{name}", f"What is the salary of {name}?", f"SELECT salary FROM employees WHERE name = '{name}'")
        add(2, f"year-{name}", f"In which year was {name} hired?", f"SELECT hire_year FROM employees WHERE name = '{name}'")
        add(5, f"dept-{name}", f"Which department does {name} work in?", _join(f"e.name = '{name}'", "d.name"))
        add(5, f"city-{name}", f"In which city does {name} work?", _join(f"e.name = '{name}'", "d.city"))
    for y in YEARS:
        add(2, f"hired-{y}", f"List the names of employees hired in {y}.", f"SELECT name FROM employees WHERE hire_year = {y}")
        add(3, f"after-{y}", f"How many employees were hired after {y}?", f"SELECT COUNT(*) FROM employees WHERE hire_year > {y}")
        add(3, f"avg-{y}", f"What is the average salary of employees hired in {y}?",
            f"SELECT AVG(salary) FROM employees WHERE hire_year = {y}")
        add(3, f"max-{y}", f"What is the highest salary of employees hired before {y}?",
            f"SELECT MAX(salary) FROM employees WHERE hire_year < {y}")
    for s in SALARIES:
        add(2, f"more-{s}", f"List the names of employees who earn more than {s}.", f"SELECT name FROM employees WHERE salary > {s}")
        add(3, f"less-{s}", f"How many employees earn less than {s}?", f"SELECT COUNT(*) FROM employees WHERE salary < {s}")
    for n in range(1, 9):
        add(4, f"top-{n}", f"Who are the {n} highest-paid employees?", f"SELECT name FROM employees ORDER BY salary DESC LIMIT {n}")
        add(4, f"bottom-{n}", f"Who are the {n} lowest-paid employees?", f"SELECT name FROM employees ORDER BY salary ASC LIMIT {n}")
    for _, dname, _city, _b in DEPARTMENTS:
        add(2, f"budget-{dname}", f"What is the budget of the {dname} department?", f"SELECT budget FROM departments WHERE name = '{dname}'")
        add(5, f"in-{dname}", f"List the names of employees in the {dname} department.", _join(f"d.name = '{dname}'"))
        add(5, f"count-{dname}", f"How many employees work in the {dname} department?", _join(f"d.name = '{dname}'", "COUNT(*)"))
        add(5, f"avg-{dname}", f"What is the average salary in the {dname} department?", _join(f"d.name = '{dname}'", "AVG(e.salary)"))
    for c in CITIES:
        add(2, f"deptcity-{c}", f"Which departments are in {c}?", f"SELECT name FROM departments WHERE city = '{c}'")
        add(5, f"empcity-{c}", f"List the names of employees who work in {c}.", _join(f"d.city = '{c}'"))
    return out


def split(items: Sequence[Question], held_out: int, seed: int = 0) -> tuple[list[Question], list[Question]]:
    """``(train, held_out)``: disjoint by question, each level represented in proportion on both sides."""
    rng = random.Random(seed)
    by_level: dict[int, list[Question]] = {}
    for q in items:
        by_level.setdefault(q.level, []).append(q)
    if held_out >= len(items):
        raise ValueError(f"held_out={held_out} leaves no training questions out of {len(items)}")
    test: list[Question] = []
    for level in sorted(by_level):
        qs = by_level[level][:]
        rng.shuffle(qs)
        k = round(held_out * len(qs) / len(items))
        test.extend(qs[:k])
    test = test[:held_out]
    rest = [q for q in items if q not in set(test)]
    while len(test) < held_out:  # rounding: top up from the rest
        test.append(rest.pop(rng.randrange(len(rest))))
    taken = set(test)
    train = [q for q in items if q not in taken]
    rng.shuffle(train)
    return train, test


def connect() -> sqlite3.Connection:
    """A fresh in-memory copy of the database (cheap: ~45 rows)."""
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    db.executemany("INSERT INTO departments VALUES (?, ?, ?, ?)", DEPARTMENTS)
    db.executemany("INSERT INTO employees VALUES (?, ?, ?, ?, ?)", EMPLOYEES)
    return db


def execute(db: sqlite3.Connection, sql: str, max_rows: int = 200) -> tuple[bool, list[tuple[Any, ...]] | str]:
    """Run one read-only statement: ``(True, rows)`` or ``(False, the error message)``."""
    statement = sql.strip().rstrip(";").strip()
    if not statement:
        return False, "empty query"
    if ";" in statement:
        return False, "only one statement is allowed"
    if not re.match(r"(?is)^\s*(select|with)\b", statement):
        return False, "only SELECT queries are allowed"
    try:
        cur = db.execute(statement)
        return True, cur.fetchmany(max_rows)
    except sqlite3.Error as exc:
        return False, str(exc)


def _norm(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(round(v, 2) if isinstance(v, float) else v for v in r) for r in rows)


def execution_match(db: sqlite3.Connection, predicted: list[tuple[Any, ...]], gold_sql: str) -> bool:
    """Same rows as the gold query (as a multiset; floats to 2 decimals; column names ignored)."""
    ok, gold = execute(db, gold_sql, max_rows=10_000)
    assert ok, f"gold query failed: {gold}"
    return _norm(predicted) == _norm(gold)  # type: ignore[arg-type]


_FENCE = re.compile(r"```(?:sql|sqlite)?\s*(.*?)```", re.S | re.I)
_SELECT = re.compile(r"(?is)\b(select|with)\b.*")


def extract_sql(text: str) -> str:
    """The query in a model's reply: a fenced block if there is one, else from the first SELECT to ``;``."""
    m = _FENCE.search(text)
    body = m.group(1) if m else text
    s = _SELECT.search(body)
    if not s:
        return body.strip()
    query = s.group(0)
    return query.split(";", 1)[0].strip()


def retry_message(error: object) -> dict[str, str]:
    """The user turn that shows the model its failed query's error and asks for a corrected one."""
    return {"role": "user", "content": f"That query failed: {error}. Reply with a corrected SQL query only."}


def messages(question: str, system: str = SYSTEM_PROMPT, examples: Sequence[tuple[str, str]] = EXAMPLES) -> list[dict[str, str]]:
    """The chat the agent sends: the schema, worked examples as earlier turns, then the question."""
    msgs = [{"role": "system", "content": system}]
    for q, a in examples:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    msgs.append({"role": "user", "content": question})
    return msgs


def prompt_config(template: str = SYSTEM_TEMPLATE, examples: Sequence[tuple[str, str]] | None = EXAMPLES) -> dict[str, str]:
    """A ``prompt_template`` resource's config for the SQL agent: ``template`` and ``examples`` (JSON pairs)."""
    config = {"template": template}
    if examples is not None:
        config["examples"] = json.dumps([list(e) for e in examples])
    return config


def from_prompt_config(config: dict[str, str]) -> tuple[str, list[tuple[str, str]]]:
    """``(system prompt, examples)`` from a ``prompt_template`` resource's config (missing parts: the defaults)."""
    template = config.get("template") or SYSTEM_TEMPLATE
    if "examples" in config:
        try:
            pairs = json.loads(config["examples"])
            examples = [(str(q), str(a)) for q, a in pairs]
        except (ValueError, TypeError) as exc:
            raise ValueError(f"the prompt's examples must be a JSON list of [question, sql] pairs: {exc}") from exc
    else:
        examples = list(EXAMPLES)
    return render(template), examples


__all__ = ["EXAMPLES", "HAND_WRITTEN", "Question", "SCHEMA", "SYSTEM_PROMPT", "SYSTEM_TEMPLATE", "connect", "execute", "execution_match",
           "extract_sql", "from_prompt_config", "messages", "prompt_config", "questions", "render", "retry_message", "split"]
