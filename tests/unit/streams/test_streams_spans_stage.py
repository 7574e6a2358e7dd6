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


def test_the_worker_completes_an_attempt_when_its_grace_ends_not_at_the_next_tick() -> None:
    """An attempt ended through the store API (its span count unknown) waits ``finish_grace_s`` for spans still on
    their way. It completed only at the worker's next tick: up to ``tick_s`` more before its rows could be written."""
    import asyncio
    import gc
    import time

    from schemas.models import RolloutEvent
    from streams.app import Config, Worker
    from streams.attempts import PartitionState
    from streams.health import StreamHealth

    s = stage()
    s.finish_grace_s = 0.05
    s.sink.interval_s = 3600.0  # no commit point (its producer would wait for a broker that is not there)
    fake: Any = s.consumer
    fake.consume = lambda n, timeout: []
    st = s.parts[0] = PartitionState(0)
    ended = RolloutEvent(rollout_id="r1", attempt_id="a1", event="FINISHED", time_ns=1, task_id="", status="succeeded",
                         final_reward=1.0, span_count=0, metadata={"rolloutbus.spans_unknown": "1"})
    assert st.on_event(ended, 0, time.monotonic()) is None  # waits its grace
    w = Worker.__new__(Worker)
    w.cfg = Config(app_id="x", broker="kafka://", topic_prefix="x.", partitions=1, tick_s=30.0)
    w.sink, w.health, w._stopping = s.sink, StreamHealth(), False
    w.make_stage = lambda: s  # type: ignore[method-assign]
    w._watch = lambda stage, now: None  # type: ignore[method-assign]

    async def run() -> float:
        started = time.monotonic()
        task = asyncio.ensure_future(w.run_stage())
        while not s.stats["rollouts"] and time.monotonic() - started < 5:
            await asyncio.sleep(0.01)
        w._stopping = True
        await task
        return time.monotonic() - started

    threshold = gc.get_threshold()
    try:
        took = asyncio.run(run())
    finally:  # the loop tunes the collector for the worker's process
        gc.set_threshold(*threshold)
        gc.unfreeze()
    assert s.stats["rollouts"] == 1 and not st.inflight, "completed, with its tick 30 s away"
    assert [r["rollout_id"] for r in s.sink._buffers["rollouts"].rows] == ["r1"]
    assert took < 5


def test_an_attempt_whose_completion_fails_is_not_left_in_flight(caplog: Any) -> None:
    """Its summary could not be produced (too large for the broker, say) after its rows were added: it stayed in
    flight for good, holding the partition's replay point back, and nothing tried it again."""
    from streams.attempts import PartitionState
    from tests.unit.streams.spans import finished, span
    from tests.unit.streams.test_streams_attempts import run

    s = stage()
    s.finish_grace_s = 0.0

    def refuse(topic: str, key: Any, value: Any, partition: int = -1) -> None:
        raise RuntimeError("Broker: Message size too large")

    s._produce = refuse  # type: ignore[method-assign]
    st = s.parts[0] = PartitionState(0)
    run(st, [(0, span(1)), (1, finished(span_count=2))])
    s.finish_graced()
    assert not st.inflight and st.completing == {("r1", "a1"): 1}
    assert "completing r1/a1 failed" in caplog.text
