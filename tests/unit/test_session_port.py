"""Under pytest-xdist each worker is a test session with a broker of its own (tests/conftest.py ``session_port``):
a port another process's session chose is chosen again; one the user gave is kept, apart per worker."""

from __future__ import annotations

from tests.conftest import session_port


def chosen() -> int:
    return 12345


def test_a_session_alone_chooses_once_and_its_subprocesses_keep_it() -> None:
    assert session_port({}, chosen) == (12345, "main")
    assert session_port({"ROLLOUTBUS_TEST_KAFKA_PORT": "20000", "ROLLOUTBUS_TEST_KAFKA_PORT_OWNER": "main"}, chosen) == (20000, "main")


def test_a_worker_does_not_share_the_controllers_broker_port() -> None:
    env = {"ROLLOUTBUS_TEST_KAFKA_PORT": "20000", "ROLLOUTBUS_TEST_KAFKA_PORT_OWNER": "main", "PYTEST_XDIST_WORKER": "gw1"}
    assert session_port(env, chosen) == (12345, "gw1")
    # a pytest run inside that worker's test (same worker id, same owner) keeps the worker's port
    assert session_port({**env, "ROLLOUTBUS_TEST_KAFKA_PORT_OWNER": "gw1"}, chosen) == (20000, "gw1")


def test_a_port_the_user_gave_is_kept_and_shifted_per_worker() -> None:
    assert session_port({"ROLLOUTBUS_TEST_KAFKA_PORT": "20000"}, chosen) == (20000, "user")
    assert session_port({"ROLLOUTBUS_TEST_KAFKA_PORT": "20000", "PYTEST_XDIST_WORKER": "gw0"}, chosen) == (20000, "user")
    assert session_port({"ROLLOUTBUS_TEST_KAFKA_PORT": "20000", "PYTEST_XDIST_WORKER": "gw2"}, chosen) == (22000, "user")
