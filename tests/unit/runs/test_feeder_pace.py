"""The task feeder's pace (pure, a recording producer): ahead of generation, or ahead of the trainer."""

from __future__ import annotations

import pytest

from rolloutbus.runs.live import Live, TaskFeeder, waiting_for_trainer


class _Producer:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.sent.append(key)

    def poll(self, timeout: float) -> None:
        pass


class _P:
    text = "q"

    def __init__(self, n: int) -> None:
        self.n = n

    def to_json(self) -> str:
        return f'{{"n": {self.n}}}'


def _feeder(pace: str, live: Live, ahead: int = 8) -> TaskFeeder:
    f = TaskFeeder.__new__(TaskFeeder)
    f.producer, f.topic, f.problems = _Producer(), "rb.tasks", [_P(i) for i in range(50)]
    f.keys, f.families = [str(i) for i in range(50)], [None] * 50
    f.group_size, f.live, f.published, f.cursor, f.curriculum = 4, live, 0, 0, None
    f.ahead, f.pace = ahead, pace
    return f


def _seen(live: Live, groups: int, teaching: int) -> None:
    live.groups_seen.update(f"g{i}" for i in range(len(live.groups_seen), len(live.groups_seen) + groups))
    live.groups_teaching += teaching


def test_the_groups_that_wait_for_the_trainer_are_those_that_teach_less_what_its_steps_took() -> None:
    steps = [{"groups": 2.0, "batches_dropped_stale": 1.0}, {"groups": 2.0, "batches_skipped_backlog": 3.0}]
    assert waiting_for_trainer(10, steps) == 2 and waiting_for_trainer(10, []) == 10
    assert waiting_for_trainer(3, steps) == 0  # never below nothing
    # A trainer without --skip-zero-variance trains groups that teach nothing too: they are not what the feeder counts.
    assert waiting_for_trainer(4, [{"groups": 2.0, "zero_variance_groups": 1.0}] * 2) == 2


@pytest.mark.parametrize("pace", ["generation", "trainer"])
def test_ahead_of_generation_the_runners_never_wait_and_ahead_of_the_trainer_they_wait_for_it(pace: str) -> None:
    live = Live()
    f = _feeder(pace, live)
    f.top_up()
    assert f.published == 8  # nothing generated yet: the allowance either way
    _seen(live, groups=6, teaching=6)  # six groups came back, all teach; the trainer has taken none
    f.top_up()
    assert f.published == (14 if pace == "generation" else 8)  # ahead of the trainer: 2 in flight + 6 waiting = 8
    live.steps.extend([{"groups": 2.0}, {"groups": 2.0}])  # the trainer took four of them
    f.top_up()
    assert f.published == (14 if pace == "generation" else 12)


def test_groups_that_do_not_teach_never_hold_generation_back() -> None:
    live = Live()
    f = _feeder("trainer", live)
    f.top_up()
    _seen(live, groups=8, teaching=1)  # all back, one teaches: the trainer waits for a second one
    f.top_up()
    assert f.published == 8 + 7  # in flight 0 + waiting 1: seven more, so the trainer is not starved


def test_an_unknown_pace_is_refused() -> None:
    with pytest.raises(ValueError, match="pace must be one of generation, trainer"):
        TaskFeeder(None, [], Live(), group_size=4, runners=4, groups_per_step=2, pace="fast")  # type: ignore[arg-type]
    from foundation.errors import ConfigError
    from rolloutbus.trainer_api import GRPO

    with pytest.raises(ConfigError, match="pace"):
        GRPO(pace="fast")


