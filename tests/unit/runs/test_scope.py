"""Where a ``fit`` run keeps its records (:mod:`rolloutbus.runs.scope`): on the local stack as on given
addresses a namespace of the run's own (topics, database, consumer groups), said in fit's first lines with how
to query and remove it; the demo's reset takes only its own topics; a given address that does not answer is one
line before anything starts."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from foundation.config import CommonSettings, load_settings
from foundation.errors import ClickHouseError, ConfigError, KafkaUnavailable
from rolloutbus.runs.scope import check_given, given_addresses, own_topics, run_scope, where_lines


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ROLLOUTBUS_KAFKA_BOOTSTRAP", "ROLLOUTBUS_CLICKHOUSE_DSN", "ROLLOUTBUS_TOPIC_PREFIX", "ROLLOUTBUS_CLICKHOUSE_DATABASE"):
        monkeypatch.delenv(name, raising=False)


def _settings(tmp_path: Path, **values: str) -> CommonSettings:
    return load_settings(CommonSettings, {"data_dir": tmp_path / "data", **values})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_run_on_the_local_stack_gets_a_namespace_of_its_own_too(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    scope = run_scope(settings, run="5e6f7a8b")
    assert not given_addresses(settings)
    assert (scope.settings.topic_prefix, scope.settings.clickhouse_database) == ("rb.fit-5e6f7a8b.", "rolloutbus_fit_5e6f7a8b")
    assert scope.env["ROLLOUTBUS_APP_ID"] == "rb.fit-5e6f7a8b.streams"
    assert (settings.topic_prefix, settings.clickhouse_database) == ("rb.", "rolloutbus")


def test_the_demo_s_reset_takes_its_own_topics_and_no_run_s() -> None:
    names = {"rb.spans", "rb.tasks", "rb.streams-assembly-changelog", "rb.fit-5e6f7a8b.spans", "rb.fit-5e6f7a8b.streams-x",
             "team.spans", "__consumer_offsets"}
    assert own_topics(names, "rb.") == ["rb.spans", "rb.streams-assembly-changelog", "rb.tasks"]
    assert own_topics(names, "rb.fit-5e6f7a8b.") == ["rb.fit-5e6f7a8b.spans", "rb.fit-5e6f7a8b.streams-x"]


def test_a_given_broker_gets_the_run_its_own_topics_database_and_groups(tmp_path: Path) -> None:
    settings = _settings(tmp_path, kafka_bootstrap="kafka-1:9092", topic_prefix="team.")
    scope = run_scope(settings, run="1a2b3c4d")
    s = scope.settings
    assert (s.topic_prefix, s.clickhouse_database, s.bootstrap) == ("team.fit-1a2b3c4d.", "rolloutbus_fit_1a2b3c4d", "kafka-1:9092")
    assert s.topics.spans == "team.fit-1a2b3c4d.spans"
    assert scope.env == {"ROLLOUTBUS_TOPIC_PREFIX": "team.fit-1a2b3c4d.", "ROLLOUTBUS_CLICKHOUSE_DATABASE": "rolloutbus_fit_1a2b3c4d",
                         "ROLLOUTBUS_APP_ID": "team.fit-1a2b3c4d.streams", "ROLLOUTBUS_TRAIN_GROUP": "team.fit-1a2b3c4d.trainer",
                         "ROLLOUTBUS_RUNNER_GROUP": "team.fit-1a2b3c4d.runners"}
    assert (settings.topic_prefix, settings.clickhouse_database) == ("team.", "rolloutbus")  # the user's, untouched
    # what the run's processes read from that environment is the run's scope
    assert load_settings(CommonSettings, {"data_dir": tmp_path / "data", "kafka_bootstrap": "kafka-1:9092",
                                          "topic_prefix": scope.env["ROLLOUTBUS_TOPIC_PREFIX"],
                                          "clickhouse_database": scope.env["ROLLOUTBUS_CLICKHOUSE_DATABASE"]}).topics == s.topics


def test_two_runs_never_share_a_name(tmp_path: Path) -> None:
    settings = _settings(tmp_path, clickhouse_dsn="http://clickhouse:8123")
    assert given_addresses(settings)
    first, second = run_scope(settings), run_scope(settings)
    assert first.run != second.run
    assert first.settings.topic_prefix != second.settings.topic_prefix
    assert first.settings.clickhouse_database != second.settings.clickhouse_database


def test_an_embedded_engine_dsn_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="chdb:// opens the engine in one process"):
        run_scope(_settings(tmp_path, clickhouse_dsn="chdb://"))


def test_the_first_lines_name_the_broker_the_store_and_the_runs_names(tmp_path: Path) -> None:
    given = run_scope(_settings(tmp_path, kafka_bootstrap="kafka-1:9092", clickhouse_dsn="http://analyst:secret@ch:8123"),
                      run="1a2b3c4d")
    lines = where_lines(given, SimpleNamespace(store=None))
    assert lines[0] == "kafka      kafka-1:9092 (ROLLOUTBUS_KAFKA_BOOTSTRAP): nothing started or deleted there"
    assert lines[1].startswith("store      http://analyst:") and "secret" not in lines[1]
    assert "rb.fit-1a2b3c4d.*" in lines[2] and "ROLLOUTBUS_CLICKHOUSE_DATABASE=rolloutbus_fit_1a2b3c4d" in lines[2]
    assert lines[2].endswith("remove it: rolloutbus runs rm 1a2b3c4d)")
    local_store = run_scope(_settings(tmp_path, kafka_bootstrap="kafka-1:9092"), run="1a2b3c4d")
    stack = SimpleNamespace(store=SimpleNamespace(url="http://127.0.0.1:8123"), started_store=True)
    assert where_lines(local_store, stack)[1] == "store      started on http://127.0.0.1:8123"


def test_a_given_broker_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    settings = _settings(tmp_path, kafka_bootstrap=f"127.0.0.1:{_closed_port()}", clickhouse_dsn="http://127.0.0.1:1")
    with pytest.raises(KafkaUnavailable, match="could not list the topics on Kafka at 127.0.0.1:") as err:
        check_given(settings, timeout_s=2.0)
    assert "\n" not in str(err.value)


def test_a_given_clickhouse_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    settings = _settings(tmp_path, clickhouse_dsn=f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(ClickHouseError, match="cannot reach ClickHouse at http://127.0.0.1:") as err:
        check_given(settings, timeout_s=2.0)
    assert "\n" not in str(err.value)


def test_the_stack_starts_no_broker_where_one_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rolloutbus.runs.stack import local_stack

    started: list[str] = []

    class Broker:
        def __init__(self, *args: object) -> None:
            self.bootstrap = "local"

        def start(self) -> bool:
            started.append("broker")
            return True

        def stop(self) -> bool:
            return True

    monkeypatch.setattr("rolloutbus.local_kafka.LocalKafka", Broker)
    settings = _settings(tmp_path, kafka_bootstrap="kafka-1:9092", clickhouse_dsn="http://ch:8123")
    with local_stack(settings, tmp_path / "logs") as stack:
        assert (stack.started_broker, stack.store) == (False, None)
    assert started == []
