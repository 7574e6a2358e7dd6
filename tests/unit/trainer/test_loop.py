"""Off-policy control and the crash hook, as plain functions."""

from __future__ import annotations

import pytest

from trainer.loop import staleness_weight


@pytest.mark.parametrize(
    ("batch_version", "current", "expected"),
    [
        (5, 5, 1.0),  # on-policy
        (4, 5, 1.0),  # lag 1 < bound 2
        (3, 5, 0.5),  # lag == bound: down-weighted
        (2, 5, None),  # lag 3 > bound: dropped
        (None, 5, 1.0),  # unversioned: trained on, counted separately
    ],
)
def test_staleness_weight(batch_version: int | None, current: int, expected: float | None) -> None:
    assert staleness_weight(batch_version, current, max_staleness=2, stale_weight=0.5) == expected


def test_a_version_below_the_minimum_is_dropped_whatever_its_lag() -> None:
    assert staleness_weight(2, 3, 8, 0.5, min_version=3) is None
    assert staleness_weight(3, 3, 8, 0.5, min_version=3) == 1.0
    assert staleness_weight(4, 9, 8, 0.5, min_version=3) == 1.0  # lag 5 within the bound
    assert staleness_weight(None, 3, 8, 0.5, min_version=3) == 1.0  # unversioned: as before


def test_zero_bound_only_trains_on_policy() -> None:
    assert staleness_weight(5, 5, 0, 0.5) == 1.0
    assert staleness_weight(4, 5, 0, 0.5) is None


def _admitted(skip_zero_variance: bool) -> tuple[list[str], dict[str, float], dict[str, dict[str, int]]]:
    """Feed two groups, one whose rewards are all equal, through Trainer.handle (no model, no broker)."""
    from types import SimpleNamespace

    from schemas import GroupBatch, encode
    from trainer.loop import Counters, LoopState, Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.s = SimpleNamespace(max_staleness=4, min_version=0, stale_weight=0.5, skip_zero_variance=skip_zero_variance)
    trainer.state, trainer.pending, trainer.counters, trainer.published_version = LoopState(0, 0, "run"), [], Counters(), None
    for offset, (gid, rewards, zero) in enumerate([("flat", [0.0, 0.0], True), ("mixed", [1.0, 0.0], False)]):
        batch = GroupBatch(group_id=gid, task_id="t", resource_version=0, created_ns=1, group_size=2, rollout_ids=["a", "b"],
                           rewards=rewards, advantages=[0.0, 0.0] if zero else [0.7, -0.7], transitions=[], zero_variance=zero)
        msg = SimpleNamespace(topic=lambda: "rb.batches", partition=lambda: 0, offset=lambda o=offset: o,
                              value=lambda b=batch: encode(b), key=lambda: b"t")
        trainer.handle(msg)  # type: ignore[arg-type]
    return [b.group_id for b, _ in trainer.pending], trainer.counters.as_metrics(), trainer.state.offsets


def test_groups_that_cannot_teach_are_dropped_only_when_asked() -> None:
    pending, metrics, offsets = _admitted(skip_zero_variance=True)
    assert pending == ["mixed"] and metrics["batches_dropped_zero_variance"] == 1.0
    assert offsets == {"rb.batches": {"0": 2}}  # the dropped group is consumed all the same
    pending, metrics, _ = _admitted(skip_zero_variance=False)
    assert pending == ["flat", "mixed"] and metrics["batches_dropped_zero_variance"] == 0.0


def _groups(versions: list[int | None]) -> list[tuple[object, float]]:
    from schemas import GroupBatch

    return [(GroupBatch(group_id=f"g{i}", task_id="t", resource_version=v, created_ns=1, group_size=2, rollout_ids=["a", "b"],
                        rewards=[1.0, 0.0], advantages=[0.7, -0.7], transitions=[]), 1.0) for i, v in enumerate(versions)]


def test_a_step_behind_takes_the_newest_groups_or_a_sample_or_the_oldest() -> None:
    import random

    from trainer.loop import select_backlog

    waiting = _groups([3, 5, None, 5, 4, 6, 3])
    ids = lambda xs: [b.group_id for b, _ in xs]  # noqa: E731
    chosen, skipped = select_backlog(waiting, 3, "newest", random.Random(0))
    assert ids(chosen) == ["g1", "g3", "g5"] and len(skipped) == 4  # versions 5, 5, 6, in the order they came
    chosen, skipped = select_backlog(waiting, 3, "oldest", random.Random(0))
    assert ids(chosen) == ["g0", "g1", "g2"] and skipped == []
    seen = set()
    for seed in range(30):
        chosen, skipped = select_backlog(waiting, 3, "sample", random.Random(seed))
        assert len(chosen) == 3 and len(skipped) == 4 and set(ids(chosen)) | set(ids(skipped)) == set(ids(waiting))
        seen |= set(ids(chosen))
    assert seen == set(ids(waiting))  # every waiting group can be drawn
    assert select_backlog(waiting[:2], 3, "newest", random.Random(0)) == (waiting[:2], [])  # a trainer keeping up
    with pytest.raises(ValueError, match="backlog policy"):
        select_backlog(waiting, 3, "fresh", random.Random(0))


def test_a_step_reads_what_waits_and_skips_what_it_does_not_choose() -> None:
    """Trainer._choose: with backlog newest it reads the waiting messages (none of it blocking) and keeps the newest."""
    import random
    from types import SimpleNamespace

    from schemas import encode
    from trainer.loop import Counters, LoopState, Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.s = SimpleNamespace(max_staleness=8, min_version=0, stale_weight=0.5, skip_zero_variance=False, groups_per_step=2,
                                backlog="newest", backlog_window=64)
    trainer.state, trainer.pending, trainer.counters, trainer.published_version = LoopState(0, 6, "run"), [], Counters(), None
    trainer.health, trainer._backlog_rng = SimpleNamespace(batch_read=lambda: None), random.Random(0)
    msgs = [SimpleNamespace(topic=lambda: "rb.batches", partition=lambda: 0, offset=lambda o=o: o, value=lambda b=b: encode(b),
                            key=lambda: b"t", error=lambda: None) for o, (b, _) in enumerate(_groups([1, 2, 6, 5, 3]))]
    for m in msgs[:2]:
        trainer.handle(m)  # type: ignore[arg-type]
    waiting = msgs[2:]
    consumer = SimpleNamespace(poll=lambda timeout: waiting.pop(0) if waiting else None)
    trainer._choose(consumer)
    assert [b.group_id for b, _ in trainer.pending] == ["g2", "g3"] and not waiting
    assert trainer.counters.as_metrics()["batches_skipped_backlog"] == 3.0
    assert trainer.state.offsets == {"rb.batches": {"0": 5}}  # what was skipped is consumed: a restart does not read it again


def _served_by(runner_saw: int | None, served: list[int | None]) -> object:
    from schemas import GroupBatch, Transition

    steps = [Transition(rollout_id="r", attempt_id="a", task_id="t", span_id=f"s{i}", turn=i, resource_version=v,
                        prompt_token_ids=[1], response_token_ids=[2]) for i, v in enumerate(served)]
    return GroupBatch(group_id="g", task_id="t", resource_version=runner_saw, created_ns=1, group_size=2, rollout_ids=["a", "b"],
                      rewards=[1.0, 0.0], advantages=[0.7, -0.7], transitions=steps)


def test_a_groups_staleness_is_its_behaviour_policys() -> None:
    """The runner labels a rollout with the newest version it saw; the tokens are the server's, which may trail it
    (a reload under way, ``serve --follow-lag``): the oldest version that served a step is the one that counts."""
    from trainer.loop import behaviour_version

    assert behaviour_version(_served_by(9, [5, 6])) == 5  # served by 5 and 6 though the runner saw 9
    assert behaviour_version(_served_by(9, [None])) == 9  # no served version recorded: the runner's
    assert behaviour_version(_served_by(None, [])) is None


def test_a_group_served_by_an_older_version_than_its_label_is_dropped_as_stale() -> None:
    from types import SimpleNamespace

    from schemas import encode
    from trainer.loop import Counters, LoopState, Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.s = SimpleNamespace(max_staleness=2, min_version=0, stale_weight=0.5, skip_zero_variance=False)
    trainer.state, trainer.pending, trainer.counters, trainer.published_version = LoopState(0, 10, "run"), [], Counters(), None
    batch = _served_by(10, [6, 6])  # labelled with the trainer's own version, generated by one four versions older
    msg = SimpleNamespace(topic=lambda: "rb.batches", partition=lambda: 0, offset=lambda: 0, value=lambda: encode(batch),
                          key=lambda: b"t")
    trainer.handle(msg)  # type: ignore[arg-type]
    assert trainer.pending == [] and trainer.counters.as_metrics()["batches_dropped_stale"] == 1.0
