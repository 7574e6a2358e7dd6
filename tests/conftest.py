"""Shared fixtures.

Integration tests run against the real Kafka broker and the real ClickHouse engine:

* Kafka: ``ROLLOUTBUS_KAFKA_BOOTSTRAP`` if set; otherwise a real local broker (the one ``rolloutbus up``
  starts) in a scratch data dir, started once for the session and stopped at its end, on
  ``ROLLOUTBUS_TEST_KAFKA_PORT`` or else a free port pair (broker, controller) chosen for the session,
  so two test sessions on one machine (or a published container port) never meet on one broker.
* ClickHouse: ``ROLLOUTBUS_TEST_CLICKHOUSE_DSN`` if set; otherwise the embedded chDB engine in a scratch
  directory. Every test gets a fresh topic prefix and a fresh database.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rolloutbus.localproc import ephemeral_low


def free_port_run(offsets: tuple[int, ...] = (0,)) -> int:
    """A port p with p + d free on 127.0.0.1 now for every d in ``offsets``, below the kernel's ephemeral range
    (see :func:`_free_port_pair`; with no room below it, any port the kernel gives): for a broker a test starts
    itself (its port and, at p + 1, its controller's)."""
    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
            return True

    top = ephemeral_low() - max(offsets) - 1
    for _ in range(200):
        port = random.randrange(10000, top) if top > 10000 else _kernel_port()
        if port + max(offsets) < 65000 and all(free(port + d) for d in offsets):
            return port
    raise RuntimeError(f"no free ports at offsets {offsets}")


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_port_pair() -> int:
    """A port p with p, p + 1, p + 500 and p + 501 free on 127.0.0.1 now (the session broker's and its
    controller's, and the same for the broker `rolloutbus up` starts in its test). Below the ephemeral
    range: a port from it, free when the session starts, can be any connection's own port by the time a
    broker binds it minutes later (seen: `rolloutbus up` failing with its controller port in use)."""
    return free_port_run((0, 1, 500, 501))


# ------------------------------------------------------------------------------------------ skips in CI

# What a test may skip for in CI (``CI=true``, which ``.ci/run`` sets): what this machine kind lacks and the project
# cannot install. Any other skip fails the session in CI, listed at its end, so a green `make test` never hides a
# test that did not run (a missing install already fails where it is found: ``tests/installs.py``).
CI_MAY_SKIP = (
    "needs CUDA",  # a GPU: this machine kind has none (the GPU check runs where one is lent)
    "this machine has CUDA",  # the no-GPU messages, where a GPU is present
)
_SKIPPED: list[tuple[str, str]] = []


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


_DURATIONS: list[tuple[str, float]] = []  # (node id, seconds) of every phase, for --record-durations


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", metavar="FILE", default=None,
                     help="write the seconds each test file took into FILE (merged with what it holds), the order "
                          "make test's parallel pass hands files out in (tests/schedule.py)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the slowest files first (tests/schedule.py)
        from tests import schedule

        schedule.reorder(items, schedule.read())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append((report.nodeid, _skip_reason(report)))
    _DURATIONS.append((report.nodeid, report.duration))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A whole module skipped at import (``pytest.skip(..., allow_module_level=True)``, ``importorskip``) is a skip
    too; under xdist the controller gets the workers' skipped collections through this same hook."""
    if report.skipped:
        _SKIPPED.append((report.nodeid, _skip_reason(report)))


def unexpected_skips(skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The skips in ``skipped`` (node id, reason) whose reason is none of :data:`CI_MAY_SKIP`. Pure."""
    return [(node, why) for node, why in skipped if not any(ok in why for ok in CI_MAY_SKIP)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.installs import strict

    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: its reports reach the controller, which judges them all once
    if session.config.getoption("--record-durations"):
        from tests import schedule

        schedule.record(Path(session.config.getoption("--record-durations")), _DURATIONS)
    bad = unexpected_skips(_SKIPPED)
    if strict() and bad:
        lines = "\n".join(f"  {node}: {why}" for node, why in bad)
        print(f"\n{len(bad)} test(s) skipped in CI for a reason CI_MAY_SKIP (tests/conftest.py) does not allow:\n{lines}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def session_port(env: dict[str, str], choose: Any = _free_port_pair) -> tuple[int, str]:
    """The session broker's port and who chose it, from ``env`` (pure but for ``choose``). Under pytest-xdist each
    worker process is a session of its own with a broker of its own: a port chosen by another process's session (the
    controller's, inherited) is chosen again; one the user gave is kept, shifted by 1000 per worker (gw1: +1000)."""
    me = env.get("PYTEST_XDIST_WORKER", "main")
    given, owner = env.get("ROLLOUTBUS_TEST_KAFKA_PORT"), env.get("ROLLOUTBUS_TEST_KAFKA_PORT_OWNER")
    if given and owner is None:
        return int(given) + 1000 * int(me.removeprefix("gw") if me != "main" else 0), "user"
    if given and owner == me:
        return int(given), me
    return choose(), me


TEST_PORT, _owner = session_port(dict(os.environ))
# Exported, so the tests' subprocesses and modules that derive their own ports (port + 500) agree.
os.environ["ROLLOUTBUS_TEST_KAFKA_PORT"] = str(TEST_PORT)
if _owner != "user":
    os.environ["ROLLOUTBUS_TEST_KAFKA_PORT_OWNER"] = _owner


@pytest.fixture(scope="session")
def scratch_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rolloutbus-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_bootstrap(scratch_dir: Path) -> Iterator[str]:
    """Bootstrap servers of a real broker."""
    external = os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    from rolloutbus.local_kafka import LocalKafka

    broker = LocalKafka(scratch_dir / "broker", TEST_PORT)
    broker.start()
    yield broker.bootstrap
    broker.stop()


@pytest.fixture(scope="session")
def local_broker(kafka_bootstrap: str, scratch_dir: Path) -> Any:
    """The local broker object, for tests that stop and start it. Skips on an external cluster."""
    if os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP"):
        pytest.skip("the broker is external; cannot restart it")
    from rolloutbus.local_kafka import LocalKafka

    return LocalKafka(scratch_dir / "broker", TEST_PORT)


@pytest.fixture
def kafka_conf(kafka_bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": kafka_bootstrap}


@pytest.fixture
def topics(kafka_conf: dict[str, Any]) -> Any:
    """A fresh topic namespace, created on the real broker."""
    from foundation.config import Topics
    from foundation.kafka_admin import ensure_topics, topic_specs

    t = Topics(f"t{uuid.uuid4().hex[:10]}.")
    ensure_topics(kafka_conf, topic_specs(t, span_partitions=4))
    return t


@pytest.fixture
def test_env(kafka_bootstrap: str, topics: Any, tmp_path: Path) -> dict[str, str]:
    """Environment for a subprocess of ours: this test's broker, topics and its own ClickHouse store."""
    env = dict(os.environ)
    env.update(
        {
            "ROLLOUTBUS_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "ROLLOUTBUS_TOPIC_PREFIX": topics.prefix,
            "ROLLOUTBUS_DATA_DIR": str(tmp_path / "data"),
            # The embedded engine under each process's own data dir, not the local store's HTTP default.
            "ROLLOUTBUS_CLICKHOUSE_DSN": "chdb://",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@pytest.fixture(scope="session")
def clickhouse_dsn(scratch_dir: Path) -> str:
    return os.environ.get("ROLLOUTBUS_TEST_CLICKHOUSE_DSN") or f"chdb://{scratch_dir / 'clickhouse'}"


@pytest.fixture
def ch(clickhouse_dsn: str) -> Iterator[Any]:
    """A client on a fresh, migrated database in the real ClickHouse engine."""
    from foundation.clickhouse import connect, migrate

    database = f"t_{uuid.uuid4().hex[:12]}"
    client = connect(clickhouse_dsn, database=database)
    migrate(client, database)
    yield client
    try:
        client.command(f"DROP DATABASE IF EXISTS {database}")
    finally:
        client.close()


@pytest.fixture(autouse=True)
def _no_leaked_workers() -> Iterator[None]:
    """A failing test must not leave its processes running (eating the CPU of the tests after it)."""
    yield
    import sys

    helpers = sys.modules.get("tests.integration.streams.helpers")
    for proc in list(helpers.LIVE) if helpers is not None else []:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
