"""The SQL demo's task: Text-to-SQL on small generated SQLite databases, rewarded by execution match.

Everything here is pure and deterministic. Eight databases of two tables each (a parent and a child
with a foreign key), in different domains with different column names: ``company`` (the original
one, unchanged) and seven more. Each has question / gold-SQL pairs from templates at five levels
(single table, WHERE, aggregates, ORDER BY/LIMIT, JOIN). Two splits:

- :func:`split` — by question, over one list (the company database's, historically);
- :func:`split_databases` — by database as well as by question: whole databases are held out, so the
  test set measures reading a schema never seen in training, not recalling a memorised one.

Also the prompt (one builder, :func:`question_messages`, with the question's own schema and worked
examples on that database), SQL extraction from a model's reply, execution, execution match and the
single-turn reward :func:`score`.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from dataclasses import dataclass
from collections.abc import Hashable
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
    db: str = "company"  # the database (a key of DATABASES) the question is about

    @property
    def family(self) -> str:
        """Its kind of query (task selection judges an unseen question by its level's recent rollouts)."""
        return f"level-{self.level}"

    def to_json(self) -> str:
        return json.dumps({"qid": self.qid, "level": self.level, "question": self.text, "gold": self.gold, "db": self.db})

    @classmethod
    def from_json(cls, data: str | dict[str, Any]) -> Question:
        """A question from its JSON (a task's input); one written before databases had names is a company one."""
        d = json.loads(data) if isinstance(data, str) else data
        return cls(str(d["qid"]), int(d["level"]), str(d["question"]), str(d["gold"]), str(d.get("db") or "company"))


# --------------------------------------------------------------------------- the company database


def _join(where: str, select: str = "e.name") -> str:
    return f"SELECT {select} FROM employees e JOIN departments d ON e.department_id = d.id WHERE {where}"


def _company_questions() -> list[Question]:
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


# --------------------------------------------------------------------------- the other databases


@dataclass(frozen=True)
class _Domain:
    """A two-table database's description: tables, rows and the words its questions use.

    The parent table is ``(id, name, place, number)``, the child ``(id, name, fk, number, year)``; the
    column names differ per domain, which is the point. The parent's number column is asked about by no
    question: it is what the worked examples use. The last parent is named by no question either.
    """

    name: str
    parent: tuple[str, str, str, str, str]  # table, alias, name column, place column, number column
    child: tuple[str, str, str, str, str, str]  # table, alias, name column, fk column, number column, year column
    parents: tuple[tuple[str, str, int], ...]  # (name, place, number); the last is reserved for the examples
    children: tuple[tuple[str, ...], ...]  # the children's names, grouped by parent
    number: tuple[int, int]  # child number = base + k * step, k a permutation of 0..n-1 (no ties)
    cuts: tuple[int, int, int]  # thresholds for the child number
    year0: int  # child years: year0 .. year0 + 7
    words: dict[str, str]  # phrases and question templates (see _domain_questions)
    example_cuts: tuple[int, int]  # parent number thresholds of the JOIN and COUNT examples


def _a(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _domain_rows(d: _Domain) -> tuple[tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]]:
    parents = tuple((i + 1, name, place, n) for i, (name, place, n) in enumerate(d.parents))
    names = [(c, pid + 1) for pid, group in enumerate(d.children) for c in group]
    base, step = d.number
    # 7 and 5 are prime to the child count (24): numbers are a permutation (distinct), each year has 3 children.
    children = tuple((i + 1, c, pid, base + ((i * 7) % len(names)) * step, d.year0 + (i * 5) % 8)
                     for i, (c, pid) in enumerate(names))
    return parents, children


def _domain_questions(d: _Domain) -> list[Question]:
    P, pa, pn, pplace, _pnum = d.parent
    C, ca, cn, fk, num, year = d.child
    w = d.words
    out: list[Question] = []

    def add(level: int, key: str, text: str, gold: str) -> None:
        out.append(Question(f"{d.name}:L{level}-{re.sub(r'[^A-Za-z0-9]+', '-', key)}", level, text, gold, d.name))

    def join(where: str, select: str = f"{ca}.{cn}") -> str:
        return f"SELECT {select} FROM {C} {ca} JOIN {P} {pa} ON {ca}.{fk} = {pa}.id WHERE {where}"

    names = [c for group in d.children for c in group]

    def pick(start: int) -> list[str]:  # three children spread over the table
        return [names[start + 8 * k] for k in range(3)]

    parents = [p[0] for p in d.parents[:-1]]
    places = list(dict.fromkeys(p[1] for p in d.parents))
    years = [d.year0 + 1, d.year0 + 3, d.year0 + 6]
    nn, cs, cp, names_of = w["num"], w["one"], w["many"], w["names"]

    add(1, "names", f"List the {names_of} of all {cp}.", f"SELECT {cn} FROM {C}")
    add(1, "parents", f"List the names of all {w['parents']}.", f"SELECT {pn} FROM {P}")
    add(1, "count", f"How many {cp} are there?", f"SELECT COUNT(*) FROM {C}")
    add(1, "places", f"List the {w['places']} of all {w['parents']}.", f"SELECT {pplace} FROM {P}")
    for x in pick(1):
        add(2, f"num-{x}", f"What is the {nn} of {x}?", f"SELECT {num} FROM {C} WHERE {cn} = '{x}'")
    for x in pick(4):
        add(2, f"year-{x}", f"In which year was {x} {w['verb']}?", f"SELECT {year} FROM {C} WHERE {cn} = '{x}'")
    for y in years:
        add(2, f"in-{y}", f"List the {names_of} of {cp} {w['verb']} in {y}.", f"SELECT {cn} FROM {C} WHERE {year} = {y}")
        add(3, f"after-{y}", f"How many {cp} were {w['verb']} after {y}?", f"SELECT COUNT(*) FROM {C} WHERE {year} > {y}")
        add(3, f"avg-{y}", f"What is the average {nn} of {cp} {w['verb']} in {y}?", f"SELECT AVG({num}) FROM {C} WHERE {year} = {y}")
        add(3, f"max-{y}", f"What is the highest {nn} of {cp} {w['verb']} before {y}?", f"SELECT MAX({num}) FROM {C} WHERE {year} < {y}")
    for v in d.cuts:
        add(2, f"above-{v}", f"List the {names_of} of {cp} with {_a(nn)} above {v}.", f"SELECT {cn} FROM {C} WHERE {num} > {v}")
        add(3, f"below-{v}", f"How many {cp} have {_a(nn)} below {v}?", f"SELECT COUNT(*) FROM {C} WHERE {num} < {v}")
    for c in places:
        add(2, f"place-{c}", w["parents_in"].format(c=c), f"SELECT {pn} FROM {P} WHERE {pplace} = '{c}'")
    for n in (1, 2, 3):
        for key, most, order in (("top", "highest", "DESC"), ("bottom", "lowest", "ASC")):
            text = (f"Which {cs} has the {most} {nn}?" if n == 1 else f"List the {names_of} of the {n} {cp} with the {most} {nn}.")
            add(4, f"{key}-{n}", text, f"SELECT {cn} FROM {C} ORDER BY {num} {order} LIMIT {n}")
    for x in pick(2):
        add(5, f"parent-{x}", w["parent_of"].format(x=x), join(f"{ca}.{cn} = '{x}'", f"{pa}.{pn}"))
    for x in pick(6):
        add(5, f"place-of-{x}", w["place_of"].format(x=x), join(f"{ca}.{cn} = '{x}'", f"{pa}.{pplace}"))
    for p in parents:
        rel = w["of_parent"].format(p=p)
        add(5, f"of-{p}", f"List the {names_of} of {cp} {rel}.", join(f"{pa}.{pn} = '{p}'"))
        add(5, f"count-{p}", f"How many {cp} are there {rel}?", join(f"{pa}.{pn} = '{p}'", "COUNT(*)"))
    for p in parents[:2]:
        add(5, f"avg-{p}", f"What is the average {nn} of {cp} {w['of_parent'].format(p=p)}?",
            join(f"{pa}.{pn} = '{p}'", f"AVG({ca}.{num})"))
    for c in places:
        add(5, f"in-place-{c}", f"List the {names_of} of {cp} {w['of_place'].format(c=c)}.", join(f"{pa}.{pplace} = '{c}'"))
    return out


def _domain_examples(d: _Domain) -> tuple[tuple[str, str], ...]:
    """A JOIN, a COUNT, a WHERE (EXAMPLES' order), on the parent's number column and the reserved parent."""
    P, pa, pn, pplace, pnum = d.parent
    C, ca, cn, fk, _num, _year = d.child
    below, above = d.example_cuts
    w = d.words
    return (
        (w["ex_join"].format(v=below), f"SELECT {ca}.{cn} FROM {C} {ca} JOIN {P} {pa} ON {ca}.{fk} = {pa}.id WHERE {pa}.{pnum} < {below};"),
        (w["ex_count"].format(v=above), f"SELECT COUNT(*) FROM {P} WHERE {pnum} > {above};"),
        (w["ex_where"].format(p=d.parents[-1][0]), f"SELECT {pplace} FROM {P} WHERE {pn} = '{d.parents[-1][0]}';"),
    )


def _schema(d: _Domain) -> str:
    P, _pa, pn, pplace, pnum = d.parent
    C, _ca, cn, fk, num, year = d.child
    return (f"CREATE TABLE {P} (id INTEGER PRIMARY KEY, {pn} TEXT, {pplace} TEXT, {pnum} INTEGER);\n"
            f"CREATE TABLE {C} (id INTEGER PRIMARY KEY, {cn} TEXT, {fk} INTEGER, {num} INTEGER, {year} INTEGER);")


_DOMAINS = (
    _Domain(
        "library", ("authors", "a", "name", "country", "born"), ("books", "b", "title", "author_id", "pages", "published_year"),
        (("Mira Holt", "Chile", 1931), ("Tomas Reyes", "Peru", 1948), ("Ines Varga", "Chile", 1956),
         ("Oren Blake", "Ireland", 1962), ("Lucia Ferro", "Peru", 1975)),
        (("Silent River", "Glass Harbor", "The Last Orchard", "Paper Moons", "Winter Ledger"),
         ("Salt and Iron", "The Quiet Engine", "Amber Roads", "Night Cartography", "The Clockmaker"),
         ("Field of Lanterns", "Cold Meridian", "The Ninth Bridge", "Hollow Pines", "Letters to Nobody"),
         ("Copper Sky", "The Long Tide", "Small Gods of Rain", "Borrowed Light", "The Salt Garden"),
         ("North of Memory", "Iron Psalms", "The Blue Hour", "Stone Orchestra")),
        (120, 17), (200, 300, 400), 2004,
        {"one": "book", "many": "books", "names": "titles", "parents": "authors", "places": "countries", "num": "page count",
         "verb": "published", "parents_in": "Which authors are from {c}?", "parent_of": "Who wrote {x}?",
         "place_of": "Which country is the author of {x} from?", "of_parent": "by {p}", "of_place": "by authors from {c}",
         "ex_join": "List the titles of books by authors born before {v}.", "ex_count": "How many authors were born after {v}?",
         "ex_where": "Which country is {p} from?"},
        (1950, 1960),
    ),
    _Domain(
        "school", ("classes", "c", "label", "building", "capacity"), ("students", "s", "name", "class_id", "score", "enrolled_year"),
        (("7A", "North Hall", 28), ("7B", "South Hall", 31), ("8A", "North Hall", 24), ("8B", "West Hall", 35), ("9A", "South Hall", 22)),
        (("Aiko Tanaka", "Ben Okafor", "Clara Weiss", "Dmitri Volkov", "Esme Clarke"),
         ("Farid Haddad", "Greta Lind", "Hector Ruiz", "Isla Moreau", "Jonah Price"),
         ("Kira Novak", "Liam Byrne", "Mina Sato", "Niko Laine", "Olga Petrov"),
         ("Pedro Alves", "Rhea Kapoor", "Soren Dahl", "Talia Ross", "Umar Siddiq"),
         ("Vera Kova", "Wes Turner", "Xena Marsh", "Yusuf Demir")),
        (41, 2), (52, 64, 76), 2014,
        {"one": "student", "many": "students", "names": "names", "parents": "classes", "places": "buildings", "num": "score",
         "verb": "enrolled", "parents_in": "Which classes are in {c}?", "parent_of": "Which class is {x} in?",
         "place_of": "In which building is the class of {x}?", "of_parent": "in class {p}", "of_place": "in classes in {c}",
         "ex_join": "List the names of students in classes with a capacity below {v}.",
         "ex_count": "How many classes have a capacity above {v}?", "ex_where": "In which building is class {p}?"},
        (29, 26),
    ),
    _Domain(
        "shop", ("categories", "c", "title", "warehouse", "shelves"),
        ("products", "p", "product_name", "category_id", "price", "launch_year"),
        (("Garden", "Leeds", 14), ("Kitchen", "Bristol", 22), ("Toys", "Leeds", 9), ("Outdoor", "Cardiff", 17),
         ("Stationery", "Bristol", 6)),
        (("Watering Can", "Hose Reel", "Seed Tray", "Pruning Shears", "Flower Pot"),
         ("Chef Knife", "Cutting Board", "Salad Spinner", "Tea Kettle", "Garlic Press"),
         ("Puzzle Cube", "Box Kite", "Toy Train", "Rubber Duck", "Yo-Yo"),
         ("Camp Stove", "Trail Lantern", "Rain Poncho", "Folding Chair", "Sleeping Bag"),
         ("Notebook", "Fountain Pen", "Desk Lamp", "Glue Stick")),
        (4, 3), (20, 35, 55), 2011,
        {"one": "product", "many": "products", "names": "names", "parents": "categories", "places": "warehouses", "num": "price",
         "verb": "launched", "parents_in": "Which categories are stored in {c}?", "parent_of": "Which category is {x} in?",
         "place_of": "In which warehouse is the category of {x} stored?", "of_parent": "in the {p} category",
         "of_place": "in categories stored in {c}",
         "ex_join": "List the names of products in categories with fewer than {v} shelves.",
         "ex_count": "How many categories have more than {v} shelves?", "ex_where": "Which warehouse stores the {p} category?"},
        (12, 15),
    ),
    _Domain(
        "hospital", ("wards", "w", "ward_name", "wing", "beds"), ("patients", "p", "patient_name", "ward_id", "age", "admitted_year"),
        (("Cardiology", "East Wing", 18), ("Oncology", "North Wing", 26), ("Pediatrics", "East Wing", 14),
         ("Neurology", "South Wing", 21), ("Orthopedics", "North Wing", 30)),
        (("Abel Stone", "Bianca Lund", "Cyrus Webb", "Delia Frost", "Emil Sauer"),
         ("Fiona Grant", "Gus Hale", "Hanna Berg", "Ivo Marsh", "Julia Crane"),
         ("Kai Rowe", "Lara Quist", "Milo Vance", "Nina Falk", "Oscar Reed"),
         ("Pia Holm", "Rafael Cruz", "Sanna Ek", "Theo Nash", "Ulrike Bauer"),
         ("Viktor Sand", "Willa Hart", "Ximena Soto", "Zane Kirby")),
        (19, 3), (30, 50, 70), 2016,
        {"one": "patient", "many": "patients", "names": "names", "parents": "wards", "places": "wings", "num": "age",
         "verb": "admitted", "parents_in": "Which wards are in the {c}?", "parent_of": "Which ward is {x} in?",
         "place_of": "In which wing is the ward of {x}?", "of_parent": "in the {p} ward", "of_place": "in wards in the {c}",
         "ex_join": "List the names of patients in wards with fewer than {v} beds.",
         "ex_count": "How many wards have more than {v} beds?", "ex_where": "In which wing is the {p} ward?"},
        (19, 24),
    ),
    _Domain(
        "league", ("teams", "t", "team_name", "hometown", "founded"), ("players", "p", "player", "team_id", "goals", "signed_year"),
        (("Harbor Hawks", "Tampere", 1902), ("Iron Bulls", "Lahti", 1921), ("River Foxes", "Tampere", 1935),
         ("Granite Owls", "Oulu", 1948), ("Coast Wolves", "Lahti", 1967)),
        (("Arto Niemi", "Bruno Costa", "Carl Eklund", "Dario Conti", "Eero Koski"),
         ("Filip Horak", "Gabriel Lenz", "Hugo Lindqvist", "Ivan Petric", "Jari Salo"),
         ("Kalle Virta", "Lukas Meier", "Marco Bellini", "Nils Aaberg", "Otto Kern"),
         ("Paavo Rinne", "Rico Santos", "Sami Aho", "Timo Jokela", "Urho Lampi"),
         ("Ville Harju", "Waltteri Oja", "Yrjo Mattila", "Zlatko Kovac")),
        (2, 1), (8, 14, 20), 2009,
        {"one": "player", "many": "players", "names": "names", "parents": "teams", "places": "hometowns", "num": "goal total",
         "verb": "signed", "parents_in": "Which teams are from {c}?", "parent_of": "Which team does {x} play for?",
         "place_of": "What is the hometown of the team of {x}?", "of_parent": "on the {p}", "of_place": "on teams from {c}",
         "ex_join": "List the names of players on teams founded before {v}.",
         "ex_count": "How many teams were founded after {v}?", "ex_where": "What is the hometown of the {p}?"},
        (1930, 1940),
    ),
    _Domain(
        "fleet", ("ports", "p", "port", "sea", "berths"), ("ships", "s", "ship", "port_id", "tonnage", "built"),
        (("Kiel", "Baltic", 12), ("Bergen", "North Sea", 20), ("Gdansk", "Baltic", 16), ("Cadiz", "Atlantic", 9),
         ("Rostock", "Baltic", 25)),
        (("Aurora", "Boreas", "Calypso", "Dagny", "Elsa Marie"),
         ("Fjord Star", "Gull", "Hanna B", "Iris", "Juno"),
         ("Kestrel", "Lodestar", "Mistral", "Nordkap", "Osprey"),
         ("Polaris", "Quillon", "Rana", "Sirocco", "Tern"),
         ("Ulla", "Valkyrie", "Wren", "Zephyr")),
        (1200, 350), (3000, 5000, 7000), 2001,
        {"one": "ship", "many": "ships", "names": "names", "parents": "ports", "places": "seas", "num": "tonnage",
         "verb": "built", "parents_in": "Which ports are on the {c}?", "parent_of": "What is the home port of {x}?",
         "place_of": "On which sea is the home port of {x}?", "of_parent": "based in {p}", "of_place": "based at ports on the {c}",
         "ex_join": "List the names of ships based at ports with fewer than {v} berths.",
         "ex_count": "How many ports have more than {v} berths?", "ex_where": "On which sea is {p}?"},
        (15, 18),
    ),
    _Domain(
        "cinema", ("studios", "s", "studio", "city", "opened"), ("films", "f", "title", "studio_id", "minutes", "release_year"),
        (("Northlight", "Lyon", 1952), ("Red Lantern", "Turin", 1961), ("Blue Quarry", "Lyon", 1974),
         ("Paper Kite", "Porto", 1983), ("Silver Reel", "Turin", 1990)),
        (("Dust and Neon", "The Orchard Thief", "Low Tide", "Mercury Falls", "A Room Upstairs"),
         ("Parallel Winter", "The Lighthouse Keeper", "Static", "Glass Animals", "Slow Fire"),
         ("Harvest Moonlight", "The Cartographer", "Echo Valley", "Second Summer", "Velvet Road"),
         ("The Sleeping Coast", "Wire and Bone", "Midnight Ferry", "Open Water", "Saltwind"),
         ("Quiet Revolution", "The Paper Crown", "Afterglow", "Last Train South")),
        (78, 4), (100, 120, 150), 2012,
        {"one": "film", "many": "films", "names": "titles", "parents": "studios", "places": "cities", "num": "running time",
         "verb": "released", "parents_in": "Which studios are in {c}?", "parent_of": "Which studio made {x}?",
         "place_of": "In which city is the studio that made {x}?", "of_parent": "made by {p}", "of_place": "made by studios in {c}",
         "ex_join": "List the titles of films made by studios opened before {v}.",
         "ex_count": "How many studios opened after {v}?", "ex_where": "In which city is {p}?"},
        (1970, 1980),
    ),
)


# --------------------------------------------------------------------------- the databases


@dataclass(frozen=True)
class Database:
    """One generated SQLite database: its schema, its rows, its questions and its worked examples."""

    name: str
    schema: str  # the CREATE TABLE statements, as shown to the model
    tables: tuple[tuple[str, tuple[tuple[Any, ...], ...]], ...]  # (table, rows), in creation order
    questions: tuple[Question, ...]
    examples: tuple[tuple[str, str], ...]  # three worked examples: a JOIN, a COUNT, a WHERE


def _from_domain(d: _Domain) -> Database:
    parents, children = _domain_rows(d)
    return Database(d.name, _schema(d), ((d.parent[0], parents), (d.child[0], children)),
                    tuple(_domain_questions(d)), _domain_examples(d))


DATABASES: dict[str, Database] = {
    "company": Database("company", SCHEMA, (("departments", tuple(DEPARTMENTS)), ("employees", tuple(EMPLOYEES))),
                        tuple(_company_questions()), tuple(EXAMPLES)),
    **{d.name: _from_domain(d) for d in _DOMAINS},
}


def database(db: str = "company") -> Database:
    """The database named ``db``; a ``ValueError`` names the known ones."""
    try:
        return DATABASES[db]
    except KeyError:
        raise ValueError(f"no SQL demo database {db!r}: use one of {', '.join(DATABASES)}") from None


def connect(db: str = "company") -> sqlite3.Connection:
    """A fresh in-memory copy of a database (cheap: under 70 rows)."""
    spec = database(db)
    conn = sqlite3.connect(":memory:")
    conn.executescript(spec.schema)
    for table, rows in spec.tables:
        conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    conn.commit()  # no transaction left open: sqlite3's backup() of this connection would wait on it forever
    return conn


def schema(db: str = "company") -> str:
    """A database's CREATE TABLE statements, as the prompt shows them."""
    return database(db).schema


def questions(db: str = "company") -> list[Question]:
    """Every question about one database, in a fixed order (company: 252; the others: 56 each)."""
    return list(database(db).questions)


def all_questions() -> list[Question]:
    """Every question of every database, database by database in ``DATABASES`` order."""
    return [q for spec in DATABASES.values() for q in spec.questions]


def example_pairs(db: str) -> list[tuple[str, str]]:
    """Three worked examples on ``db`` (a JOIN, a COUNT, a WHERE; ``EXAMPLES`` for company).

    Outside company they filter on a column and name a row that no question of any database uses, so
    an example never gives away a held-out answer.
    """
    return list(database(db).examples)


# --------------------------------------------------------------------------- splits


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


def subset(train: Sequence[Question], k: int, seed: int = 0) -> list[Question]:
    """``k`` of the training questions, levels in proportion and databases in proportion within a level, shuffled
    (deterministic for a seed); all of them when ``k`` is 0 or not fewer than there are."""
    if not k or k >= len(train):
        return list(train)
    rng = random.Random(seed + 7)
    picked = _stratified(train, k, rng)
    rng.shuffle(picked)
    return picked


def demo_split(held_out: int, validation: int, train_questions: int = 0, seed: int = 0) -> tuple["Split", list[Question]]:
    """The SQL demo's split (two thirds of ``held_out`` on the databases never trained on) and the questions it trains
    on (:func:`subset` of its ``train``): what the demo and the learning bench's TRL row both train and score on.
    ValueError (the demo's and the bench's one line) when ``train_questions`` exceeds the training pool."""
    unseen = max(1, round(held_out * 2 / 3)) if held_out > 1 else 1
    try:
        s = split_databases(seed=seed, validation=validation, test_seen=held_out - unseen, test_unseen=unseen)
    except ValueError as exc:
        raise ValueError(f"--held-out {held_out} and --validation {validation} do not fit the SQL task's questions "
                         f"({unseen} of the held-out from the databases never trained on): {exc}") from None
    if train_questions > len(s.train):
        raise ValueError(f"--train-questions {train_questions}: the SQL task has {len(s.train)} training questions beside "
                         f"--held-out {held_out} and --validation {validation}; give at most {len(s.train)} (0: all of them)")
    return s, subset(s.train, train_questions, seed=seed)


@dataclass(frozen=True)
class Split:
    """A split by database and by question (see :func:`split_databases`)."""

    train: list[Question]
    validation: list[Question]  # from the training databases, never trained on
    test_seen: list[Question]  # held-out questions of the training databases
    test_unseen: list[Question]  # questions of the held-out databases: schema never seen in training
    held_out_dbs: tuple[str, ...]

    @property
    def test(self) -> list[Question]:
        return self.test_seen + self.test_unseen


def _shares(sizes: dict[Hashable, int], k: int) -> dict[Hashable, int]:
    """``k`` shared in proportion to ``sizes`` (largest remainders, ties to the first); none above its size."""
    total = sum(sizes.values())
    quota = {g: k * n / total if total else 0.0 for g, n in sizes.items()}
    counts = {g: int(quota[g]) for g in sizes}
    order = list(sizes)
    for g in sorted(order, key=lambda g: (counts[g] - quota[g], order.index(g)))[: k - sum(counts.values())]:
        counts[g] += 1
    return counts


def _stratified(items: Sequence[Question], k: int, rng: random.Random) -> list[Question]:
    """``k`` of ``items``: levels in proportion, then databases in proportion within a level, then at random."""
    by_level: dict[Hashable, list[Question]] = {}
    for q in items:
        by_level.setdefault(q.level, []).append(q)
    picked: list[Question] = []
    for level, n in _shares({g: len(qs) for g, qs in by_level.items()}, k).items():
        by_db: dict[Hashable, list[Question]] = {}
        for q in by_level[level]:
            by_db.setdefault(q.db, []).append(q)
        for db, m in _shares({g: len(qs) for g, qs in by_db.items()}, n).items():
            qs = by_db[db][:]
            rng.shuffle(qs)
            picked.extend(qs[:m])
    return picked


def split_databases(seed: int = 0, held_out_dbs: int = 2, validation: int = 30, test_seen: int = 50,
                    test_unseen: int = 100) -> Split:
    """Hold out whole databases, then questions of the rest. Deterministic for a seed.

    ``held_out_dbs`` databases (never company: its worked examples are the prompt's) give ``test_unseen``
    questions; from the other databases, ``test_seen`` and ``validation`` questions are held out and the
    rest is ``train`` (shuffled). Every sample is stratified by level, then by database within a level. The lists are disjoint
    and no held-out database appears in ``train`` or ``validation``. Sizes that do not fit: ``ValueError``.
    """
    candidates = [name for name in DATABASES if name != "company"]
    if min(held_out_dbs, validation, test_seen, test_unseen) < 0:
        raise ValueError("split_databases: every size must be >= 0")
    if held_out_dbs > len(candidates):
        raise ValueError(f"held_out_dbs={held_out_dbs}: only {len(candidates)} databases besides company can be held out")
    rng = random.Random(seed)
    chosen = set(rng.sample(candidates, held_out_dbs))
    held = tuple(name for name in candidates if name in chosen)
    unseen_pool = [q for q in all_questions() if q.db in chosen]
    seen_pool = [q for q in all_questions() if q.db not in chosen]
    if test_unseen > len(unseen_pool):
        raise ValueError(f"test_unseen={test_unseen}: the held-out databases {held} have {len(unseen_pool)} questions")
    if validation + test_seen >= len(seen_pool):
        raise ValueError(f"validation={validation} + test_seen={test_seen} leave no training questions "
                         f"out of {len(seen_pool)}")
    unseen = _stratified(unseen_pool, test_unseen, rng)
    seen = _stratified(seen_pool, test_seen, rng)
    taken = set(seen)
    val = _stratified([q for q in seen_pool if q not in taken], validation, rng)
    taken |= set(val)
    train = [q for q in seen_pool if q not in taken]
    rng.shuffle(train)
    position = {q: i for i, q in enumerate(all_questions())}  # held-out lists in a fixed order
    val, seen, unseen = (sorted(qs, key=position.__getitem__) for qs in (val, seen, unseen))
    return Split(train, val, seen, unseen, held)


# --------------------------------------------------------------------------- execution and reward


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
    return rows_match(predicted, gold)  # type: ignore[arg-type]


def rows_match(predicted: Sequence[Sequence[Any]], gold: Sequence[Sequence[Any]]) -> bool:
    """:func:`execution_match` of rows already fetched. Pure."""
    return _norm(predicted) == _norm(gold)


def row_f1(predicted: Sequence[Sequence[Any]], gold: Sequence[Sequence[Any]]) -> float:
    """F1 of the predicted rows against the gold rows, as multisets normalised as :func:`execution_match` does.

    0.0 when either side is empty or their rows have different column counts (``SELECT *`` against a one-column
    answer shares no row), 1.0 on a match. Pure.
    """
    if not predicted or not gold or len(predicted[0]) != len(gold[0]):
        return 0.0
    left: dict[tuple[Any, ...], int] = {}
    for r in _norm(predicted):
        left[r] = left.get(r, 0) + 1
    shared = 0
    for r in _norm(gold):
        if left.get(r, 0) > 0:
            left[r] -= 1
            shared += 1
    if not shared:
        return 0.0
    precision, recall = shared / len(predicted), shared / len(gold)
    return 2 * precision * recall / (precision + recall)


# The training rollouts' reward (the agent's ``ROLLOUTBUS_AGENT_REWARD``, the demo's --sql-reward). Validation and
# held-out rollouts are always scored by execution match, so every measured figure means the same whichever is chosen.
REWARDS = {
    "match": "1 if the query returns the gold rows, else 0",
    "graded": "1 if the query returns the gold rows; else, where the gold has several rows, half the F1 of the rows the "
              "query returns against them when that F1 is at least 0.5 (two of three gold rows and nothing else: 0.4); else 0",
}
# A partial answer's reward is GRADED_WEIGHT x its row F1, always below a match's 1. Only an answer whose row F1 reaches
# GRADED_MIN_F1 earns it, and only where the gold has several rows: group advantages are normalised by the group's
# spread, so any credit at all in a group that otherwise fails is worth as much as a match, and a small credit for
# returning many rows (a query that lists a whole table, or every integer, holds most counts) would be learnt as one.
GRADED_WEIGHT = 0.5
GRADED_MIN_F1 = 0.5


def graded_reward(kind: str, db: sqlite3.Connection, predicted: list[tuple[Any, ...]] | None, gold_sql: str) -> float:
    """The reward ``kind`` (one of :data:`REWARDS`) of the rows a query returned (None: it failed) for ``gold_sql``
    on ``db``: execution match, or with ``graded`` partial credit for an answer with most of a several-row gold's rows
    and few others."""
    if kind not in REWARDS:
        raise ValueError(f"unknown SQL reward {kind!r}: choose one of {', '.join(REWARDS)}")
    if predicted is None:
        return 0.0
    ok, gold = execute(db, gold_sql, max_rows=10_000)  # once: the match and the partial credit read the same rows
    assert ok, f"gold query failed: {gold}"
    try:
        if rows_match(predicted, gold):  # type: ignore[arg-type]
            return 1.0
        if kind == "match":
            return 0.0
        f1 = row_f1(predicted, gold) if len(gold) > 1 else 0.0  # type: ignore[arg-type]
        return GRADED_WEIGHT * f1 if f1 >= GRADED_MIN_F1 else 0.0
    except (TypeError, ValueError):  # rows that mix NULLs and numbers do not sort (as in score)
        return 0.0


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


def score(q: Question, reply_text: str) -> float:
    """The single-turn reward: 1.0 if the reply's query returns the gold rows on ``q``'s database, else 0.0.

    A query that fails (or a reply with no query) scores 0.0; it never raises.
    """
    conn = connect(q.db)
    try:
        ok, rows = execute(conn, extract_sql(reply_text), max_rows=10_000)
        # The gold runs on a fresh copy: a ``WITH ... DELETE`` passes execute()'s SELECT/WITH check.
        return 1.0 if ok and execution_match(connect(q.db), rows, q.gold) else 0.0  # type: ignore[arg-type]
    except (sqlite3.Error, TypeError, ValueError):  # e.g. rows that mix NULLs and numbers do not sort
        return 0.0
    finally:
        conn.close()


# --------------------------------------------------------------------------- prompts


def retry_message(error: object) -> dict[str, str]:
    """The user turn that shows the model its failed query's error and asks for a corrected one."""
    return {"role": "user", "content": f"That query failed: {error}. Reply with a corrected SQL query only."}


def messages(question: str, system: str | None = None, examples: Sequence[tuple[str, str]] | None = None,
             db: str = "company") -> list[dict[str, str]]:
    """The chat the agent sends: the schema, worked examples as earlier turns, then the question.

    Defaults: the system prompt shows ``db``'s schema (``SYSTEM_PROMPT`` for company) and the examples
    are ``example_pairs(db)`` (``EXAMPLES`` for company); a ``system`` or ``examples`` given is used as is.
    """
    if system is None:
        system = SYSTEM_PROMPT if db == "company" else render(SYSTEM_TEMPLATE, schema(db))
    msgs = [{"role": "system", "content": system}]
    for q, a in (example_pairs(db) if examples is None else examples):
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    msgs.append({"role": "user", "content": question})
    return msgs


def question_messages(q: Question, template: str | None = None,
                      examples: Sequence[tuple[str, str]] | None = None) -> list[dict[str, str]]:
    """The chat for one question: ``template`` (default ``SYSTEM_TEMPLATE``) rendered with ``q``'s schema,
    the worked examples (default ``example_pairs(q.db)``), then the question.

    The one prompt builder the agent, the evaluation and a single-turn baseline all use.
    """
    return messages(q.text, render(template or SYSTEM_TEMPLATE, schema(q.db)), examples, db=q.db)


def prompt_config(template: str = SYSTEM_TEMPLATE, examples: Sequence[tuple[str, str]] | None = EXAMPLES) -> dict[str, str]:
    """A ``prompt_template`` resource's config for the SQL agent: ``template`` and ``examples`` (JSON pairs)."""
    config = {"template": template}
    if examples is not None:
        config["examples"] = json.dumps([list(e) for e in examples])
    return config


def template_from_config(config: dict[str, str]) -> tuple[str, list[tuple[str, str]] | None]:
    """``(template, examples or None)`` from a ``prompt_template`` resource's config, for :func:`question_messages`.

    The template is unrendered (``{schema}`` is filled per question's database). Examples a resource
    supplies are used as given for every database: they are written on the company database (the
    optimizer's starting prompt is ``prompt_config()``). ``None``: each question's own ``example_pairs``.
    """
    template = config.get("template") or SYSTEM_TEMPLATE
    if "examples" not in config:
        return template, None
    try:
        pairs = json.loads(config["examples"])
        return template, [(str(q), str(a)) for q, a in pairs]
    except (ValueError, TypeError) as exc:
        raise ValueError(f"the prompt's examples must be a JSON list of [question, sql] pairs: {exc}") from exc


def from_prompt_config(config: dict[str, str]) -> tuple[str, list[tuple[str, str]]]:
    """``(system prompt, examples)`` on the company database from a ``prompt_template`` resource's config
    (missing parts: the defaults). For another database, use :func:`template_from_config`."""
    template, examples = template_from_config(config)
    return render(template), list(EXAMPLES) if examples is None else examples


__all__ = ["DATABASES", "EXAMPLES", "HAND_WRITTEN", "Database", "Question", "SCHEMA", "SYSTEM_PROMPT", "SYSTEM_TEMPLATE", "Split",
           "all_questions", "connect", "database", "example_pairs", "execute", "execution_match", "rows_match", "extract_sql",
           "from_prompt_config", "messages", "prompt_config", "question_messages", "questions", "render", "retry_message",
           "schema", "score", "split", "REWARDS", "GRADED_MIN_F1", "GRADED_WEIGHT", "graded_reward", "row_f1", "split_databases", "demo_split", "subset", "template_from_config"]
