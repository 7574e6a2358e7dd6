"""The span stage's pure decisions, with its Kafka clients replaced by a recording fake."""

from __future__ import annotations

from typing import Any

from streams.rollout import Settings
from streams.sink import ClickHouseSink
from streams.spans_stage import SpanStage


class FakeConsumer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    def assignment(self) -> list[int]:
        return [0, 1]

    def pause(self, parts: list[int]) -> None:
        self.calls.append(("pause", parts))

    def resume(self, parts: list[int]) -> None:
        self.calls.append(("resume", parts))


def stage() -> SpanStage:
    s = SpanStage({"bootstrap.servers": "127.0.0.1:1"}, group="g", spans_topic="s", done_topic="d", dlq_topic="q",
                  state_topic="c", sink=ClickHouseSink(client=None), flush_sink=lambda: None, core=Settings())
    s.consumer.close()
    s.consumer = FakeConsumer()  # type: ignore[assignment]
    return s


def test_hold_pauses_once_keeps_new_partitions_paused_and_resumes_once() -> None:
    s = stage()
    fake: Any = s.consumer
    s.hold(False)
    assert fake.calls == []
    s.hold(True)
    s.hold(True)
    s.hold(False)
    s.hold(False)
    assert fake.calls == [("pause", [0, 1]), ("pause", [0, 1]), ("resume", [0, 1])]


def _finished(rid: str, task_id: str, mode: str = "train") -> tuple[Any, Any]:
    from schemas.models import RolloutEvent
    from streams.attempts import Attempt, PartitionState
    from streams.rollout import finish_attempt

    st = PartitionState(0)
    att = Attempt(rid, f"{rid}-a", 0, 0.0)
    ev = RolloutEvent(rollout_id=rid, attempt_id=f"{rid}-a", event="FINISHED", time_ns=1, task_id=task_id, mode=mode,
                      status="succeeded", final_reward=1.0, span_count=0)
    return st, (att, finish_attempt([], ev, Settings()))


def test_rollouts_without_a_task_are_stored_and_never_grouped(caplog: Any) -> None:
    """Grouped under the empty task, task-less rollouts all fell into one group "@None": its first four were
    trained against each other and every later one was refused as arriving after the group was emitted."""
    s = stage()
    sent: list[tuple[str, bytes]] = []
    s._produce = lambda topic, key, value: sent.append((topic, key))  # type: ignore[method-assign]
    for i, task in enumerate(["", "", "t1", ""]):
        st, (att, result) = _finished(f"r{i}", task)
        s._complete(st, att, result, i)
    assert sent == [("d", b"t1@None")], "only the rollout with a task goes to the group stage"
    rollouts = [r for r in s.sink._buffers["rollouts"].rows]
    assert [(r["rollout_id"], r["group_id"]) for r in rollouts] == [("r0", ""), ("r1", ""), ("r2", "t1@None"), ("r3", "")]
    assert sum("has no task id" in r.getMessage() for r in caplog.records) == 1, "said once"
