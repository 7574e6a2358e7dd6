"""Each task's recent rewards as the real ClickHouse engine answers the curriculum's query."""

from __future__ import annotations

from typing import Any

import pytest

from producers.curriculum import Recent, recent_rewards

pytestmark = pytest.mark.integration

COLS = ["rollout_id", "attempt_id", "task_id", "mode", "attempt", "resource_version", "status", "final_reward", "started_ns",
        "finished_ns", "span_count", "spans_seen", "missing_sequence_ids", "transition_count", "group_id", "error", "metadata",
        "updated_ns"]


def _row(rid: str, task_id: str, reward: float | None, finished: int, meta: dict[str, str] | None = None, mode: str = "train",
         updated: int = 1) -> list[Any]:
    return [rid, rid + "-a", task_id, mode, 1, 0, "succeeded", reward, 1, finished, 1, 1, [], 0, "", None, meta or {}, updated]


def test_the_last_k_finished_train_rollouts_of_each_task_key(ch: Any) -> None:
    solved_lately = [_row(f"s{i}", f"train-{i:05d}", r, finished=10 + i, meta={"task_key": "add-2-3"})
                     for i, r in enumerate([0.0, 0.0, 1.0, 1.0, 1.0])]  # three task ids, one problem: learnt lately
    ch.insert("rollouts", solved_lately + [
        _row("m1", "sql-7", 0.0, 5), _row("m2", "sql-7", 1.0, 6), _row("m3", "sql-7", 0.0, 7),  # no key: its task id
        _row("x1", "sql-8", None, 5), _row("x2", "sql-8", 1.0, 0),  # no reward, not finished: not counted
        _row("t1", "sql-9", 1.0, 5, mode="test"),  # a test rollout: not the training signal
        _row("m3", "sql-7", 1.0, 7, updated=2),  # m3 again, its late feedback: the newer row counts, once
    ], column_names=COLS)
    recent = recent_rewards(ch, k=3)
    assert recent["add-2-3"] == Recent(rollouts=3, low=1.0, high=1.0, passed=3)  # only the last three
    assert recent["sql-7"] == Recent(rollouts=3, low=0.0, high=1.0, passed=2)
    assert "sql-8" not in recent and "sql-9" not in recent
    assert recent_rewards(ch, k=5)["add-2-3"] == Recent(5, 0.0, 1.0, 3)


def test_the_last_k_finished_train_rollouts_of_each_task_family(ch: Any) -> None:
    ch.insert("rollouts", [
        _row("a1", "q-1", 0.0, 1, meta={"task_family": "level-2"}), _row("a2", "q-2", 1.0, 2, meta={"task_family": "level-2"}),
        _row("a3", "q-3", 1.0, 3, meta={"task_family": "level-2"}),
        _row("b1", "q-4", 0.0, 1, meta={"task_family": "level-5"}), _row("b2", "q-5", 0.0, 2, meta={"task_family": "level-5"}),
        _row("c1", "q-6", 1.0, 1),  # no family: not counted for any
    ], column_names=COLS)
    families = recent_rewards(ch, k=2, families=True)
    assert families == {"level-2": Recent(2, 1.0, 1.0, 2), "level-5": Recent(2, 0.0, 0.0, 0)}  # the last two of each
    assert recent_rewards(ch, k=8, families=True)["level-2"] == Recent(3, 0.0, 1.0, 2)


def test_one_scan_gives_the_tasks_and_the_families_each_with_its_own_depth(ch: Any) -> None:
    """What a curriculum refresh reads: both halves in one query, tasks over their last k, families over theirs."""
    ch.insert("rollouts", [
        _row("a1", "q-1", 0.0, 1, meta={"task_family": "level-2", "task_key": "k1"}),
        _row("a2", "q-1", 1.0, 2, meta={"task_family": "level-2", "task_key": "k1"}),
        _row("a3", "q-2", 1.0, 3, meta={"task_family": "level-2"}),
        _row("c1", "q-6", 1.0, 1),  # no family: a task only
    ], column_names=COLS)
    from producers.curriculum import recent_tasks_and_families

    tasks, families = recent_tasks_and_families(ch, k=1, family_k=3)
    assert tasks == {"k1": Recent(1, 1.0, 1.0, 1), "q-2": Recent(1, 1.0, 1.0, 1), "q-6": Recent(1, 1.0, 1.0, 1)}
    assert families == {"level-2": Recent(3, 0.0, 1.0, 2)}
    assert (tasks, families) == (recent_rewards(ch, k=1), recent_rewards(ch, k=3, families=True))
