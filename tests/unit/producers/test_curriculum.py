"""Tasks chosen by what teaches (pure): the rule, and the feeder's round passing over what does not teach."""

from __future__ import annotations

import random

from producers.curriculum import Curriculum, Recent, take, task_key, teach_probability, teaches
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


def test_a_family_s_pass_rate_gives_the_chance_that_a_group_of_it_teaches() -> None:
    assert teach_probability(0.0, 4) == 0.0 == teach_probability(1.0, 4)
    assert abs(teach_probability(0.5, 4) - 0.875) < 1e-12  # 1 - 1/16 - 1/16
    assert abs(teach_probability(0.1, 4) - (1 - 0.1 ** 4 - 0.9 ** 4)) < 1e-12
    assert teach_probability(0.1, 8) > teach_probability(0.1, 4)  # a larger group more often has one success


def test_an_unknown_task_is_taken_with_its_family_s_chance_of_teaching() -> None:
    rng = random.Random(1)
    half, hopeless = Recent(32, 0.0, 1.0, 16), Recent(32, 0.0, 0.0, 0)
    drawn = sum(take(None, 4, 0.0, rng, family=half) for _ in range(4000))
    assert 3300 < drawn < 3700  # 0.875 of 4000
    assert sum(take(None, 4, 0.05, rng, family=hopeless) for _ in range(4000)) < 300  # explored only (0.05)
    assert take(None, 4, 0.0, rng, family=Recent(3, 0.0, 0.0, 0))  # a family with fewer than k rollouts: unknown, taken
    assert take(Recent(4, 0.0, 1.0, 1), 4, 0.0, rng, family=hopeless)  # the task's own history comes first
    assert all(take(Recent(2, 0.0, 1.0, 1), 4, 0.0, rng, family=hopeless) for _ in range(50))  # two of its own that differ
    assert not take(Recent(4, 1.0, 1.0, 4), 4, 0.0, rng, family=half)


class _P:
    def __init__(self, n: int, family: str | None = None) -> None:
        self.n = n
        self.family = family

    def to_json(self) -> str:
        return f'{{"n": {self.n}}}'


def _feeder(curriculum: Curriculum | None, problems: list[_P] | None = None) -> TaskFeeder:
    f = TaskFeeder.__new__(TaskFeeder)
    f.problems = problems or [_P(i) for i in range(5)]
    f.keys = [task_key(p.to_json()) for p in f.problems]
    f.families = [p.family for p in f.problems]
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


def test_the_feeder_passes_over_unseen_problems_of_a_family_that_does_not_teach() -> None:
    problems = [_P(i, "hard" if i % 2 else "easy") for i in range(6)]
    families = {"hard": Recent(32, 0.0, 0.0, 0), "easy": Recent(32, 0.0, 1.0, 16)}
    cur = Curriculum(lambda: {}, k=4, explore=0.0, read_families=lambda: families, rng=random.Random(3))
    f = _feeder(cur, problems)
    picked = [f.next_problem() for _ in range(200)]
    hard = sum(i % 2 for i in picked)  # none of the hard family but when a whole round drew no easy one (0.125^3 a round)
    assert hard <= 4 and cur.skipped_family >= 200 and cur.skipped_solved == cur.skipped_unsolved == 0


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
    fam = ['{"task_id": "n1", "input": "4+4", "mode": "train", "group_size": 4, "metadata": {"task_family": "carry"}}',
           '{"task_id": "n2", "input": "5+5", "mode": "train", "group_size": 4, "metadata": {"task_family": "plain"}}']
    never = Curriculum(lambda: {}, k=8, explore=0.0, read_families=lambda: {"carry": Recent(32, 0.0, 0.0, 0)})
    kept, left_out = select_tasks(parse_tasks(fam), never)
    assert [t.task_id for t in kept] == ["n2"] and left_out == 1  # n1's family never passes; n2's is unknown


def test_a_line_without_a_task_id_is_known_by_its_input_s_digest() -> None:
    from producers.tasks_cli import parse_tasks

    a, b = parse_tasks(['{"input": {"q": 1}, "mode": "train", "group_size": 4}'] * 2)
    assert a.task_id != b.task_id and a.metadata["task_key"] == b.metadata["task_key"] == task_key('{"q": 1}')
    (c,) = parse_tasks(['{"task_id": "x", "input": "1"}'])
    assert "task_key" not in c.metadata  # a task with its own id is known by it
