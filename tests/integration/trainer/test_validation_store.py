"""The validation scores query on the real ClickHouse engine: recorded versions, test rollouts of one run."""

from __future__ import annotations

from typing import Any

import pytest

from trainer.validation import VersionScore, read_scores

pytestmark = pytest.mark.integration


def _row(rid: str, version: int | None, reward: float | None, meta: dict[str, str], mode: str = "test",
         finished: int = 2, updated: int = 1) -> list[Any]:
    return [rid, rid + "-a", "task", mode, 1, version, "succeeded", reward, 1, finished, 1, 1, [], 0, "", None, meta, updated]


COLS = ["rollout_id", "attempt_id", "task_id", "mode", "attempt", "resource_version", "status", "final_reward", "started_ns",
        "finished_ns", "span_count", "spans_seen", "missing_sequence_ids", "transition_count", "group_id", "error", "metadata",
        "updated_ns"]


def test_read_scores_counts_finished_test_rollouts_of_the_run_by_recorded_version(ch: Any) -> None:
    run = {"validation.run": "r1"}
    rows = [
        _row("a", 0, 1.0, {**run, "validation.task": "0"}),
        _row("b", 0, 0.0, {**run, "validation.task": "1"}),
        _row("c", 1, 1.0, {**run, "validation.task": "0", "validation.for": "0"}),  # published for 0, answered by 1
        _row("d", 1, None, {**run, "validation.task": "1"}),  # no reward: 0
        _row("e", 1, 1.0, {"validation.run": "other", "validation.task": "1"}),  # another run
        _row("f", 2, 1.0, {**run, "validation.task": "0"}, mode="train"),  # not a test rollout
        _row("g", 2, 1.0, {**run, "validation.task": "1"}, finished=0),  # not finished
        _row("h", None, 1.0, {**run, "validation.task": "1"}),  # no version recorded
    ]
    ch.insert("rollouts", rows, column_names=COLS)
    # A newer row of rollout b (ReplacingMergeTree): the reward FINAL reads is the newest one.
    ch.insert("rollouts", [_row("b", 0, 1.0, {**run, "validation.task": "1"}, updated=5)], column_names=COLS)
    assert read_scores(ch, "r1", tasks=2) == {0: VersionScore(0, 2, 1.0), 1: VersionScore(1, 2, 0.5)}


def test_stale_answers_of_the_tasks_published_for_a_version(ch: Any) -> None:
    from trainer.validation import for_version_query, restale

    run = {"validation.run": "r2", "validation.for": "3"}
    ch.insert("rollouts", [
        _row("a", 2, 0.0, {**run, "validation.task": "0"}),  # answered by the version before
        _row("b", 3, 1.0, {**run, "validation.task": "1"}),
        _row("c", 2, 1.0, {**run, "validation.task": "2"}, finished=0),  # still running
        _row("d", 2, 1.0, {"validation.run": "r2", "validation.for": "2", "validation.task": "3"}),  # for another version
    ], column_names=COLS)
    assert restale(ch.query(for_version_query("r2", 3)).result_rows, 3, tasks=4) == [0]
