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
