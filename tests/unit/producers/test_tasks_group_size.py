"""`rolloutbus tasks publish`: train tasks that would run once (no group_size) get one warning as they are published."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from producers.tasks_cli import parse_tasks, run, single_rollout_line


def test_train_tasks_without_a_group_size_are_named_once() -> None:
    lines = ['{"input": "a"}', '{"input": "b", "group_size": 4}', '{"input": "c", "mode": "test"}', '{"input": "d"}']
    line = single_rollout_line(parse_tasks(lines))
    assert line is not None and line.startswith("warning: 2 of 4 train tasks have group_size 1")
    assert "publish with --group-size 4" in line and "rolloutbus process --group-size" in line
    assert single_rollout_line(parse_tasks(lines, group_size=4)) is None  # --group-size fills the lines without one
    assert single_rollout_line(parse_tasks(['{"input": "x", "mode": "test"}'])) is None


class FakeProducer:
    sent: list[bytes] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        FakeProducer.sent.append(key)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


def test_publish_says_it_on_stderr_and_still_publishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("confluent_kafka.Producer", FakeProducer)
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"task_id": "t1", "input": "a"}\n{"task_id": "t2", "input": "b"}\n')
    assert run(argparse.Namespace(file=path, group_size=None)) == 0
    out = capsys.readouterr()
    assert [ln for ln in out.err.splitlines() if ln.strip()] == [single_rollout_line(parse_tasks(path.read_text().splitlines()))]
    assert "published 2 tasks" in out.out and FakeProducer.sent[-2:] == [b"t1", b"t2"]
    assert run(argparse.Namespace(file=path, group_size=4)) == 0
    assert capsys.readouterr().err == ""
