import statistics

import pytest

from streams.grouping import (GroupPolicy, ShortGroupWarnings, advantages, build_batch, group_id, merge, ready,
                             short_at_timeout, short_group_line, sibling_groups)
from streams.rollout import Settings, finish_attempt
from tests.unit.streams.spans import finished, llm


def _result(rid, r, attempt=1, agent="solver", task="task1", rv=3, time_ns=10_000):
    spans = [llm(1, rid=rid, att=f"{rid}-{attempt}", agent=agent), llm(2, rid=rid, att=f"{rid}-{attempt}", agent="critic")]
    ev = finished(rid, f"{rid}-{attempt}", task=task, reward_=r, span_count=2, resource_version=rv, attempt=attempt, time_ns=time_ns)
    return finish_attempt(spans, ev, Settings(agent_match="solver"))


def test_group_id_is_deterministic():
    assert group_id("task1", 3) == "task1@3"
    assert _result("x", 1.0).resource_version == 3


def test_advantages_normalised_and_unscaled():
    a = advantages([1.0, 0.0, 0.0, 1.0])
    assert a.mean == 0.5 and a.std == pytest.approx(statistics.pstdev([1.0, 0.0, 0.0, 1.0]))
    assert a.values == pytest.approx([0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6)] * 1 + [-0.5 / (0.5 + 1e-6), 0.5 / (0.5 + 1e-6)])
    assert sum(a.values) == pytest.approx(0.0)
    assert advantages([3.0, 1.0], scale_by_std=False).values == [1.0, -1.0]


def test_zero_variance_group_is_marked_not_dropped():
    batch = build_batch([_result("a", 1.0), _result("b", 1.0)], GroupPolicy(group_size=2), 1, True)
    assert batch.zero_variance and batch.advantages == [0.0, 0.0]
    assert len(batch.transitions) == 2  # one trained (solver) turn per rollout


def test_batch_copies_rollout_advantage_to_its_trained_transitions():
    results = [_result("b", 0.0), _result("a", 1.0)]
    batch = build_batch(results, GroupPolicy(group_size=2), 5, True)
    assert batch.group_id == "task1@3" and batch.rollout_ids == ["a", "b"] and batch.rewards == [1.0, 0.0]
    assert [t.rollout_id for t in batch.transitions] == ["a", "b"]
    assert [t.advantage for t in batch.transitions] == pytest.approx(batch.advantages)
    # untrained (critic) steps get the advantage too, for analysis, but are not in the batch
    assert all(s.advantage == batch.advantages[1] for s in results[0].steps)


def test_ready_on_size_or_on_timeout_with_enough_rollouts():
    p = GroupPolicy(group_size=4, min_rollouts=2, timeout_s=10)
    assert ready(4, 0, 0, p) == "complete"
    assert ready(3, 0, 9 * 10**9, p) is None
    assert ready(3, 0, 10 * 10**9, p) == "timeout"
    assert ready(1, 0, 100 * 10**9, p) is None


def test_merge_keeps_the_latest_attempt_only():
    members: dict = {}
    assert merge(members, _result("a", 0.0, attempt=1))
    assert not merge(members, _result("a", 0.0, attempt=1))  # re-delivery
    assert merge(members, _result("a", 1.0, attempt=2, time_ns=20_000))
    assert not merge(members, _result("a", 0.0, attempt=1))  # older attempt arriving late
    assert members["a"].attempt == 2 and members["a"].reward == 1.0


def test_policy_validation():
    with pytest.raises(ValueError, match="min_rollouts"):
        GroupPolicy(group_size=2, min_rollouts=3)


@pytest.mark.parametrize("mode, task, version, group", [
    ("train", "t1", 3, "t1@3"), ("train", "t1", None, "t1@None"), ("test", "t1", 3, ""), ("train", "", 3, ""),
])
def test_which_rollouts_join_a_group(mode: str, task: str, version: int | None, group: str) -> None:
    from streams.grouping import group_of

    assert group_of(mode, task, version) == group


S = 1_000_000_000


def test_a_group_short_at_its_timeout_is_one_that_ready_never_emits() -> None:
    policy = GroupPolicy(group_size=4, min_rollouts=2, timeout_s=10.0)
    for n in range(0, 6):
        for waited in (5, 10, 1000):
            never = ready(n, 0, waited * S, policy) is None and waited >= 10
            assert short_at_timeout(n, 0, waited * S, policy) == never, (n, waited)


def test_the_short_group_line_names_the_task_and_what_to_set() -> None:
    line = short_group_line("sql-7@3", 1, 300.4, GroupPolicy(group_size=4, min_rollouts=2), others=2)
    assert line.startswith("group sql-7@3 (task 'sql-7') has 1 rollout 300 s after its first and needs 2 to be emitted (group size 4)")
    assert "(2 more groups like it since the last such line)" in line
    for what in ("group_size=4", "rolloutbus tasks --group-size 4", "ROLLOUTBUS_GROUP_MIN_ROLLOUTS", "defaults to 1"):
        assert what in line, what


def test_a_group_split_across_versions_is_said_as_such() -> None:
    """A task whose group ran but whose rollouts two versions answered: the line says so, not group_size."""
    assert sibling_groups("sql-7@3") == ["sql-7@1", "sql-7@2", "sql-7@4", "sql-7@5"]
    assert sibling_groups("sql-7@0") == ["sql-7@1", "sql-7@2"] and sibling_groups("x@None") == []
    assert sibling_groups("a@b@1", span=1) == ["a@b@0", "a@b@2"]
    line = short_group_line("sql-7@3", 1, 300.0, GroupPolicy(group_size=4, min_rollouts=2), split=True)
    assert "answered by another policy version" in line and "defaults to 1" not in line
    w = ShortGroupWarnings(GroupPolicy(group_size=4, min_rollouts=2, timeout_s=10.0), every_s=60.0)
    asked: list[str] = []
    assert w.note("t1@1", 2, 0, 20 * S, split=lambda: asked.append("x") or True) is None and not asked  # not short
    said = w.note("t1@1", 1, 0, 20 * S, split=lambda: asked.append("x") or True)
    assert said is not None and "another policy version" in said and asked == ["x"]


def test_short_groups_are_said_at_most_once_per_window() -> None:
    w = ShortGroupWarnings(GroupPolicy(group_size=4, min_rollouts=2, timeout_s=10.0), every_s=60.0)
    assert w.note("t1@0", 1, 0, 5 * S) is None  # not past its timeout yet
    assert w.note("t1@0", 2, 0, 20 * S) is None  # enough rollouts: the timeout emits it
    first = w.note("t1@0", 1, 0, 20 * S)
    assert first is not None and first.startswith("group t1@0 ") and "more groups" not in first
    assert [w.note(g, 1, 0, t * S) for g, t in (("t1@0", 21), ("t2@0", 30), ("t3@0", 70))] == [None, None, None]
    again = w.note("t4@0", 1, 0, 81 * S)  # the window passed: one line, counting the others met meanwhile
    assert again is not None and again.startswith("group t4@0 ") and "(3 more groups like it" in again
    assert w.note("t1@0", 1, 0, 90 * S) is None
