"""The demos' local stack stops what it started, and only that: on a normal exit, on an exception and on
Ctrl-C; it leaves a broker or store it found running, everything with ``keep_running``, the store with
``keep_store``. The broker and the store are stand-ins that record start and stop (their own start and
stop are tested with the real processes); the demo's processes are real ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from foundation.config import CommonSettings, load_settings
from foundation.errors import ServiceError
from rolloutbus.runs.procs import Managed
from rolloutbus.runs.stack import LocalStack, local_stack

EVENTS: list[str] = []


class _Service:
    """A local service that was running before (``running``) or is started by ``start``."""

    running = False
    name = ""

    def __init__(self, *args: object) -> None:
        self.bootstrap = self.url = f"{self.name}-address"

    def start(self) -> bool:
        EVENTS.append(f"start {self.name}")
        return not self.running

    def stop(self) -> bool:
        EVENTS.append(f"stop {self.name}")
        return True


class _Broker(_Service):
    name = "broker"


class _Store(_Service):
    name = "store"


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CommonSettings:
    EVENTS.clear()
    _Broker.running = _Store.running = False
    monkeypatch.setattr("rolloutbus.local_kafka.LocalKafka", _Broker)
    monkeypatch.setattr("rolloutbus.store.local.LocalStore", _Store)
    monkeypatch.delenv("ROLLOUTBUS_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("ROLLOUTBUS_CLICKHOUSE_DSN", raising=False)
    return load_settings(CommonSettings, {"data_dir": tmp_path / "data"})


def _sleeper(stack: LocalStack, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A real process under the stack's supervisor (in its own process group, as the demo starts them)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    stack.procs.procs.append(Managed("sleeper", proc, tmp_path / "sleeper.log"))
    return proc


def test_on_an_exception_it_stops_the_processes_then_the_store_then_the_broker(settings: CommonSettings,
                                                                                 tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with local_stack(settings, tmp_path / "logs") as stack:
            proc = _sleeper(stack, tmp_path)
            assert (stack.started_broker, stack.started_store) == (True, True)
            assert stack.procs.env["ROLLOUTBUS_DATA_DIR"] == str(settings.data_dir)
            raise RuntimeError("boom")
    assert proc.poll() is not None
    assert EVENTS == ["start broker", "start store", "stop store", "stop broker"]


def test_ctrl_c_stops_everything_it_started(settings: CommonSettings, tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        with local_stack(settings, tmp_path / "logs") as stack:
            proc = _sleeper(stack, tmp_path)
            raise KeyboardInterrupt
    assert proc.poll() is not None
    assert EVENTS[-2:] == ["stop store", "stop broker"]


def test_what_was_running_before_is_left_running(settings: CommonSettings, tmp_path: Path) -> None:
    _Broker.running = _Store.running = True
    with local_stack(settings, tmp_path / "logs") as stack:
        assert (stack.started_broker, stack.started_store) == (False, False)
    assert EVENTS == ["start broker", "start store"]


def test_keep_running_leaves_broker_and_store_but_stops_the_processes(settings: CommonSettings, tmp_path: Path) -> None:
    with local_stack(settings, tmp_path / "logs", keep_running=True) as stack:
        proc = _sleeper(stack, tmp_path)
    assert proc.poll() is not None
    assert EVENTS == ["start broker", "start store"]


def test_a_finished_run_keeps_its_store_to_be_queried_and_stops_the_broker(settings: CommonSettings, tmp_path: Path) -> None:
    with local_stack(settings, tmp_path / "logs") as stack:
        stack.keep_store = True
    assert EVENTS == ["start broker", "start store", "stop broker"]


def test_no_store_when_the_settings_name_another(tmp_path: Path, settings: CommonSettings,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTBUS_CLICKHOUSE_DSN", "chdb://")
    other = load_settings(CommonSettings, {"data_dir": tmp_path / "data"})
    with local_stack(other, tmp_path / "logs") as stack:
        assert stack.store is None
    assert EVENTS == ["start broker", "stop broker"]


def test_a_store_that_fails_to_start_still_stops_the_broker(settings: CommonSettings, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: _Store) -> bool:
        raise ServiceError("the store did not answer")

    monkeypatch.setattr(_Store, "start", fail)
    with pytest.raises(ServiceError, match="did not answer"):
        with local_stack(settings, tmp_path / "logs"):
            pass
    assert EVENTS == ["start broker", "stop broker"]
