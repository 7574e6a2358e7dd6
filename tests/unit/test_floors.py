"""The floors of the house, read from the code's own imports (every ``import``, also inside functions).

    bench/        the benchmarks (and the venv maker the tests share)                 may import all below
    rolloutbus/   applications: the command, demo, dashboard, store server            may import all below
      runs/       what any run on the local stack uses (stack, namespace, live view)  no demo, no public API
      trainer_api/ the public API (Trainer, fit, dev, LitAgent)                        runs/, never the demo
    trainer/      GRPO, serving, APO                                                  producers, schemas, foundation
    producers/    agent library: SDK, span transport, runners  |  streams/ processors schemas, foundation
      ingest/     the ingest service: gateway, Agent Lightning's APIs, LLM proxy      the agent library too
    schemas/      the Avro contract                                                   foundation
    foundation/   errors, settings, flags, command entry, Kafka admin, ClickHouse     nothing of the project

Within producers/ the ingest service (``producers.ingest``, what servers run) stands on the agent library
(what an agent installs), never the reverse. The pure cores (trajectory assembly, rewards, credit, groups,
the GRPO loss, APO's search) import no Kafka, ClickHouse, faust or HTTP library, and no shell module of
their own package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("foundation", "schemas", "producers", "streams", "trainer", "rolloutbus", "bench")
MAY_IMPORT = {
    "foundation": {"foundation"},
    "schemas": {"schemas", "foundation"},
    "producers": {"producers", "schemas", "foundation"},
    "streams": {"streams", "schemas", "foundation"},
    "trainer": {"trainer", "producers", "schemas", "foundation"},
    "rolloutbus": set(PROJECT) - {"bench"},  # `rolloutbus bench` runs the benches as processes, never imports them
    "bench": set(PROJECT),
}
# The ingest service: it may import the agent library (the rest of producers/); the agent library never imports it.
INGEST = "producers.ingest"
PURE = {
    "streams": ["assembly", "attempts", "credit", "grouping", "rewards", "rollout", "transitions", "rowbinary"],
    "trainer": ["grpo", "apo", "policy_losses"],
    "schemas": ["checks", "codec", "models"],
}
IO_LIBRARIES = {"faust", "aiokafka", "confluent_kafka", "clickhouse_connect", "chdb", "aiohttp", "mode", "kafka"}


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """Every module ``path`` imports, as (line, dotted name); relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def modules(package: str, root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)


def floor_violations(package: str, root: Path = ROOT) -> list[str]:
    allowed = MAY_IMPORT[package]
    bad = []
    for path in modules(package, root):
        for line, name in imports_of(path, root):
            top = name.split(".")[0]
            if top in PROJECT and top not in allowed:
                bad.append(f"{path.relative_to(root)}:{line} imports {name} (a floor above {package}/)")
    return bad


def agent_library_violations(root: Path = ROOT) -> list[str]:
    """Imports of the ingest service from the agent library (producers/ outside producers/ingest/)."""
    bad = []
    for path in modules("producers", root):
        if path.relative_to(root).parts[:2] == ("producers", "ingest"):
            continue
        for line, name in imports_of(path, root):
            if name == INGEST or name.startswith(INGEST + "."):
                bad.append(f"{path.relative_to(root)}:{line} imports {name} (the agent library imports no ingest service)")
    return bad


@pytest.mark.parametrize("package", PROJECT)
def test_no_import_runs_back_up(package: str) -> None:
    assert floor_violations(package) == []


def test_the_agent_library_does_not_import_the_ingest_service() -> None:
    assert agent_library_violations() == []


def test_the_check_sees_the_agent_library_import_the_ingest_service(tmp_path: Path) -> None:
    """The guard fails when it should: an agent module importing the gateway, inside a function; the ingest
    service importing the agent library is allowed."""
    (tmp_path / "producers" / "ingest").mkdir(parents=True)
    (tmp_path / "producers" / "emit.py").write_text("def f():\n    from producers.ingest.gateway import Gateway\n    return Gateway\n")
    (tmp_path / "producers" / "ingest" / "gateway.py").write_text("from producers.emit import f\nfrom . import otlp\n")
    assert agent_library_violations(tmp_path) == [
        "producers/emit.py:2 imports producers.ingest.gateway (the agent library imports no ingest service)"]


@pytest.mark.parametrize(("package", "module"), [(p, m) for p, ms in PURE.items() for m in ms])
def test_pure_cores_import_no_io(package: str, module: str) -> None:
    path = ROOT / package / f"{module}.py"
    bad = []
    for line, name in imports_of(path):
        top = name.split(".")[0]
        if top in IO_LIBRARIES:
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
        elif top == package and name.split(".")[1:2] and name.split(".")[1] not in PURE[package]:
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}, a shell of {package}/")
        elif top in PROJECT and top not in (package, "schemas", "foundation"):
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert bad == []


def test_the_check_sees_an_arrow_running_back_up(tmp_path: Path) -> None:
    """The guard fails when it should: a foundation module importing an application, inside a function."""
    (tmp_path / "foundation").mkdir()
    (tmp_path / "foundation" / "probe.py").write_text("import os\n\ndef f():\n    from rolloutbus.cli import main\n    return main\n")
    (tmp_path / "foundation" / "ok.py").write_text("from .probe import f\nfrom foundation.errors import ConfigError\n")
    assert floor_violations("foundation", tmp_path) == ["foundation/probe.py:4 imports rolloutbus.cli (a floor above foundation/)"]


# Within rolloutbus/: the public API stands on runs/, never on the demo (the demo is one of its users); runs/
# stands on neither.
APP_FLOORS = {"rolloutbus.trainer_api": ("rolloutbus.demo",), "rolloutbus.runs": ("rolloutbus.demo", "rolloutbus.trainer_api")}


def app_floor_violations(root: Path = ROOT) -> list[str]:
    bad = []
    for package, banned in APP_FLOORS.items():
        for path in modules(package.replace(".", "/"), root):
            for line, name in imports_of(path, root):
                if any(name == b or name.startswith(b + ".") for b in banned):
                    bad.append(f"{path.relative_to(root)}:{line} imports {name} (a floor above {package})")
    return bad


def test_the_public_api_and_runs_do_not_stand_on_the_demo() -> None:
    assert app_floor_violations() == []


def test_the_check_sees_the_public_api_import_the_demo(tmp_path: Path) -> None:
    (tmp_path / "rolloutbus" / "trainer_api").mkdir(parents=True)
    (tmp_path / "rolloutbus" / "runs").mkdir(parents=True)
    (tmp_path / "rolloutbus" / "trainer_api" / "fit.py").write_text("def f():\n    from rolloutbus.demo.driver import Live\n")
    (tmp_path / "rolloutbus" / "runs" / "live.py").write_text("from rolloutbus.runs.procs import Supervisor\n")
    assert app_floor_violations(tmp_path) == [
        "rolloutbus/trainer_api/fit.py:2 imports rolloutbus.demo.driver (a floor above rolloutbus.trainer_api)"]


def test_every_package_is_on_a_floor() -> None:
    tops = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert tops <= set(PROJECT), tops - set(PROJECT)


# No cycle among the modules' import-time imports (the module level; under TYPE_CHECKING and inside functions are
# not run at import): a module's imports must run to the end before it does. A submodule's own packages are running
# already when it is imported, so the ``from . import sibling`` of a package's parts is no cycle; ``from pkg import
# name`` that reads a name of a package the module is inside of is.


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_time_targets(path: Path, root: Path, known: set[str]) -> list[str]:
    """The modules ``path``'s module-level imports run (a ``from X import name`` of a submodule is that submodule;
    of anything else, X itself)."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
                out.extend(subs)
                if len(subs) < len(node.names):
                    out.append(module)
            elif isinstance(node, ast.If):
                test = node.test
                if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
                    continue
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                    visit(block)

    visit(ast.parse(path.read_text(), str(path)).body)
    return out


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """The project's modules that import one another at import time, each circle as a sorted list (Tarjan's
    strongly connected components of more than one module)."""
    files = {_module_name(p, root): p for pkg in PROJECT if (root / pkg).is_dir() for p in modules(pkg, root)}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps: set[str] = set()
        for target in import_time_targets(path, root, known):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if not target or target == mod:
                continue
            deps.add(target)
            parent = target.rpartition(".")[0]
            while parent:  # the target's packages run first, but not those the module is inside of (running already)
                if parent in known and not mod.startswith(parent + "."):
                    deps.add(parent)
                parent = parent.rpartition(".")[0]
        graph[mod] = deps
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_modules_import_one_another_at_import_time() -> None:
    assert import_cycles() == []


def test_the_check_sees_a_cycle_and_not_a_packages_own_parts(tmp_path: Path) -> None:
    """The guard fails when it should: two modules importing each other at module level (one through a name its
    package re-exports); a package importing its parts, an import inside a function or under TYPE_CHECKING is none."""
    (tmp_path / "streams" / "sub").mkdir(parents=True)
    (tmp_path / "streams" / "__init__.py").write_text("from streams.a import f\n")
    (tmp_path / "streams" / "a.py").write_text("from streams import sub\n\ndef f():\n    from streams.b import g\n")
    (tmp_path / "streams" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from streams.a import f\n")
    (tmp_path / "streams" / "sub" / "__init__.py").write_text("from .c import h\n")
    (tmp_path / "streams" / "sub" / "c.py").write_text("import os\nfrom streams.b import g\n")
    assert import_cycles(tmp_path) == []
    (tmp_path / "streams" / "sub" / "c.py").write_text("from streams import f\n")  # reads its package's package's name
    assert import_cycles(tmp_path) == [["streams", "streams.a", "streams.sub", "streams.sub.c"]]
