"""Tasks chosen by what teaches (pure): the rule, and the feeder's round passing over what does not teach."""

from __future__ import annotations

import random

from producers.curriculum import Curriculum, Recent, take, task_key, teaches
from rolloutbus.runs.live import TaskFeeder


def test_a_task_teaches_while_its_recent_rewards_differ_and_is_unknown_below_k() -> None:
    assert teaches(None, 4) is None and teaches(Recent(3, 0.0, 0.0, 0), 4) is None
    assert teaches(Recent(4, 0.0, 0.0, 0), 4) is False  # always failed
    assert teaches(Recent(8, 1.0, 1.0, 8), 4) is False  # always solved
    assert teaches(Recent(4, 0.0, 1.0, 1), 4) is True
    rng = random.Random(0)
    assert take(None, 4, 0.0, rng) and take(Recent(4, 0.0, 1.0, 2), 4, 0.0, rng)
    assert not take(Recent(4, 1.0, 1.0, 4), 4, 0.0, rng)
    drawn = sum(take(Recent(4, 1.0, 1.0, 4), 4, 0.25, rng) for _ in range(4000))
    assert 850 < drawn < 1150  # explored at about its rate
    assert task_key('{"q": 1}') == task_key('{"q": 1}') != task_key('{"q": 2}')


class _P:
    def __init__(self, n: int) -> None:
        self.n = n

    def to_json(self) -> str:
        return f'{{"n": {self.n}}}'


def _feeder(curriculum: Curriculum | None) -> TaskFeeder:
    f = TaskFeeder.__new__(TaskFeeder)
    f.problems = [_P(i) for i in range(5)]
    f.keys = [task_key(p.to_json()) for p in f.problems]
    f.cursor, f.curriculum = 0, curriculum
    return f


def test_the_feeder_passes_over_solved_and_hopeless_problems_and_goes_round_the_rest() -> None:
    keys = [task_key(_P(i).to_json()) for i in range(5)]
    reads = []

    def read() -> dict[str, Recent]:
        reads.append(1)
        return {keys[0]: Recent(4, 1.0, 1.0, 4), keys[1]: Recent(4, 0.0, 1.0, 2), keys[3]: Recent(6, 0.0, 0.0, 0)}

    cur = Curriculum(read, k=4, explore=0.0, refresh_s=60.0)
    f = _feeder(cur)
    assert [f.next_problem() for _ in range(6)] == [1, 2, 4, 1, 2, 4]  # 0 always solved, 3 always failed: passed over
    assert len(reads) == 1 and cur.skipped_solved == 2 and cur.skipped_unsolved == 2  # read once within refresh_s
    plain = _feeder(None)
    assert [plain.next_problem() for _ in range(6)] == [0, 1, 2, 3, 4, 0]


def test_when_no_problem_teaches_the_feeder_keeps_going_round() -> None:
    keys = [task_key(_P(i).to_json()) for i in range(5)]
    f = _feeder(Curriculum(lambda: {k: Recent(4, 1.0, 1.0, 4) for k in keys}, k=4, explore=0.0))
    assert [f.next_problem() for _ in range(6)] == [0, 1, 2, 3, 4, 0]


def test_rolloutbus_tasks_publishes_the_train_tasks_that_teach_and_every_test_task() -> None:
    from producers.tasks_cli import parse_tasks, select_tasks

    lines = ['{"task_id": "solved", "input": "1+1", "mode": "train", "group_size": 4}',
             '{"task_id": "t2", "input": "2+2", "mode": "train", "group_size": 4, "metadata": {"task_key": "mixed"}}',
             '{"task_id": "new", "input": "3+3", "mode": "train", "group_size": 4}',
             '{"task_id": "solved-test", "input": "1+1", "mode": "test", "metadata": {"task_key": "solved"}}']
    recent = {"solved": Recent(8, 1.0, 1.0, 8), "mixed": Recent(8, 0.0, 1.0, 3), "t2": Recent(8, 0.0, 0.0, 0)}
    kept, left_out = select_tasks(parse_tasks(lines), Curriculum(lambda: recent, k=8, explore=0.0))
    assert [t.task_id for t in kept] == ["t2", "new", "solved-test"] and left_out == 1  # t2 is known by its task_key


def test_a_line_without_a_task_id_is_known_by_its_input_s_digest() -> None:
    from producers.tasks_cli import parse_tasks

    a, b = parse_tasks(['{"input": {"q": 1}, "mode": "train", "group_size": 4}'] * 2)
    assert a.task_id != b.task_id and a.metadata["task_key"] == b.metadata["task_key"] == task_key('{"q": 1}')
    (c,) = parse_tasks(['{"task_id": "x", "input": "1"}'])
    assert "task_key" not in c.metadata  # a task with its own id is known by it
