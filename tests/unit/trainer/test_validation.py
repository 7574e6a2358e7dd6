"""Validation of versions: scores per recorded version, the best kept, early stopping; the shell with fakes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foundation.errors import ConfigError
from schemas import Task, decode
from trainer.validation import Validator, VersionScore, best, load_tasks, scores_from_rows, should_stop


def test_scores_one_answer_per_version_and_task() -> None:
    rows = [(0, 0, 1.0), (0, 1, 0.0), (0, 1, 0.0), (1, 0, 1.0), (1, 1, 1.0), (1, 7, 1.0), (None, 0, 1.0), (2, 0, None)]
    scores = scores_from_rows(rows, tasks=2)
    assert scores[0] == VersionScore(0, 2, 0.5)
    assert scores[1] == VersionScore(1, 2, 1.0), "index 7 is outside the set: ignored"
    assert scores[2] == VersionScore(2, 1, 0.0)
    assert None not in scores


def test_best_is_the_highest_complete_version_ties_to_the_older() -> None:
    scores = {0: VersionScore(0, 4, 0.25), 1: VersionScore(1, 4, 0.5), 2: VersionScore(2, 4, 0.5), 3: VersionScore(3, 2, 1.0)}
    assert best(scores, 4) == VersionScore(1, 4, 0.5), "version 3 answered only 2 of 4: not a candidate yet"
    assert best({}, 4) is None


def test_early_stop_after_patience_versions_without_a_better_score() -> None:
    scores = {0: VersionScore(0, 3, 0.1), 1: VersionScore(1, 3, 0.6), 2: VersionScore(2, 3, 0.5)}
    assert not should_stop(scores, 3, patience=2)
    scores[3] = VersionScore(3, 3, 0.6)  # equal is not better
    assert should_stop(scores, 3, patience=2)
    assert not should_stop(scores, 3, patience=0), "0: never"
    scores[4] = VersionScore(4, 3, 0.7)
    assert not should_stop(scores, 3, patience=2), "a new best resets the count"


def test_load_tasks_reads_lines_and_refuses_an_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "val.jsonl"
    f.write_text('{"question": "a"}\n\n{"question": "b"}\n')
    assert load_tasks(f) == ['{"question": "a"}', '{"question": "b"}']
    f.write_text("\n")
    with pytest.raises(ConfigError, match="no task"):
        load_tasks(f)
    with pytest.raises(ConfigError, match="cannot read"):
        load_tasks(tmp_path / "missing.jsonl")


class _Result:
    def __init__(self, rows: list[tuple[int, int, float]]) -> None:
        self.result_rows = rows


class _Client:
    def __init__(self) -> None:
        self.rows: list[tuple[int, int, float]] = []
        self.queries: list[str] = []

    def query(self, sql: str) -> _Result:
        self.queries.append(sql)
        return _Result(self.rows)


def test_validator_publishes_test_tasks_for_every_nth_version_and_stops_on_patience() -> None:
    sent: list[tuple[str, str, bytes]] = []
    client = _Client()
    inputs = [json.dumps({"question": "q0"}), json.dumps({"question": "q1"})]
    v = Validator(inputs, "run1", "rb.tasks", lambda t, k, b: sent.append((t, k, b)), lambda: client,
                  every=2, patience=1, poll_s=0.0)
    assert v.on_version(0) == 2 and v.on_version(1) == 0 and v.on_version(2) == 2
    tasks = [decode(b) for _, _, b in sent]
    assert all(isinstance(t, Task) and t.mode == "test" and t.group_size == 1 for t in tasks)
    assert [t.task_id for t in tasks] == ["val-run1-v0-0000", "val-run1-v0-0001", "val-run1-v2-0000", "val-run1-v2-0001"]
    assert tasks[1].metadata["validation.run"] == "run1" and tasks[1].metadata["validation.task"] == "1"
    assert tasks[2].metadata["validation.for"] == "2" and tasks[2].metadata["question"] == "q0"
    assert tasks[0].input == inputs[0]
    client.rows = [(0, 0, 0.0), (0, 1, 1.0), (2, 0, 1.0), (2, 1, 1.0)]
    assert not v.should_stop()
    assert v.best == VersionScore(2, 2, 1.0)
    client.rows += [(3, 0, 1.0), (3, 1, 0.0)]
    assert v.should_stop()
    assert "'run1'" in client.queries[-1] and "best version 2 (100.0%)" in v.summary()


def test_validator_keeps_the_last_scores_when_the_store_fails() -> None:
    calls = {"n": 0}

    class Broken:
        def query(self, sql: str) -> None:
            raise OSError("connection refused")

    def factory() -> object:
        calls["n"] += 1
        return Broken()

    v = Validator(["{}"], "r", "t", lambda *a: None, factory, poll_s=0.0)
    v.scores = {0: VersionScore(0, 1, 1.0)}
    assert v.poll() == {0: VersionScore(0, 1, 1.0)}
    v.poll()
    assert calls["n"] == 2, "a failed client is dropped and made again on the next poll"


def test_early_stop_without_a_validation_set_is_refused_with_the_flag_named(tmp_path: Path) -> None:
    from trainer.cli import add_arguments, settings_from_args
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(ConfigError, match="validation_tasks"):
        settings_from_args(p.parse_args(["--early-stop-patience", "2"]))
    f = tmp_path / "v.jsonl"
    f.write_text("{}\n")
    s = settings_from_args(p.parse_args(["--early-stop-patience", "2", "--validation-tasks", str(f), "--validate-every", "3"]))
    assert (s.early_stop_patience, s.validation_tasks, s.validate_every) == (2, f, 3)


def test_prune_keeps_the_protected_checkpoint(tmp_path: Path) -> None:
    from trainer.checkpoint import MANIFEST, CheckpointStore

    store = CheckpointStore(tmp_path)
    for step in range(6):
        store.path(step).mkdir(parents=True)
        (store.path(step) / MANIFEST).write_text("{}")
    store.prune(2, protect=frozenset({1}))
    assert store.steps() == [1, 4, 5], "the best validated version's checkpoint survives pruning"


def test_restale_finds_tasks_an_older_version_answered() -> None:
    from trainer.validation import restale

    rows = [(0, 2), (1, 1), (2, 1), (2, 2), (3, None), (9, 1)]  # (task index, recorded version) of tasks published for 2
    assert restale(rows, version=2, tasks=4) == [1, 3], "2 was answered by version 2 too; 9 is outside the set"


def test_validator_publishes_again_what_the_old_version_answered() -> None:
    sent: list[tuple[str, str, bytes]] = []

    class C(_Client):
        def query(self, sql: str) -> _Result:
            self.queries.append(sql)
            if "validation.for" in sql:
                return _Result([(0, 4), (1, 5)])  # task 0 answered by version 4 before the server loaded 5
            return _Result([(4, 0, 1.0), (5, 1, 1.0)])

    client = C()
    v = Validator(["{}", "{}"], "r", "rb.tasks", lambda t, k, b: sent.append((t, k, b)), lambda: client, poll_s=0.0)
    v.on_version(5)
    sent.clear()
    v.poll()
    assert [decode(b).task_id for _, _, b in sent] == ["val-r-v5-0000-r1"]
    assert decode(sent[0][2]).metadata["validation.for"] == "5"
    for _ in range(5):
        v.poll()
    assert len(sent) == 3, "at most MAX_RESENDS times a version"
