"""The one commit point: its steps in order, what waits for rows not yet written, and what a failure keeps."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from foundation.errors import KafkaUnavailable
from streams.checkpoint import Checkpoint, at_once


class Stage:
    """Records each step; ``take`` hands out numbered points; ``fail`` names a step that raises once."""

    def take(self, final: bool) -> str:
        self.taken += 1
        return f"p{self.taken}"

    def _step(self, name: str, arg: Any) -> None:
        self.calls.append((name, arg))
        if self.fail == name:
            self.fail = ""
            raise KafkaUnavailable(name)

    async def deliver(self) -> float:
        self._step("deliver", None)
        return 1.0

    async def send_changelog(self, points: list[Any], by: float | None) -> None:
        self._step("changelog", list(points))

    async def commit(self, points: list[Any], final: bool) -> None:
        self._step("commit", list(points))

    def __init__(self, takes_back: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.taken = 0
        self.fail = ""
        self.takes_back = takes_back

    def put_back(self, points: list[Any], sent: bool) -> bool:
        self.calls.append(("put_back", (list(points), sent)))
        return self.takes_back


def pipelined() -> tuple[Stage, Any, Checkpoint]:
    """A checkpoint whose rows go to a writer that writes a batch only when told (``sink.written``)."""
    stage = Stage()
    sink = SimpleNamespace(submitted=0, written=0)

    def submit() -> int:
        sink.submitted += 1
        return sink.submitted

    return stage, sink, Checkpoint(stage, sink, lambda: None, submit)


def test_the_steps_run_in_order_once_the_rows_are_written() -> None:
    stage, sink, cp = pipelined()
    cp.commit_now()
    assert stage.calls == [("commit", [])], "batch 1 is not written: nothing of p1 goes yet"
    sink.written = 1
    cp.commit_now()
    assert stage.calls[1:] == [("deliver", None), ("changelog", ["p1"]), ("commit", ["p1"])]
    assert [p for _, p in cp.unsettled] == ["p2"]


def test_a_point_whose_delivery_failed_waits_for_the_next_commit_point_and_one_whose_changelog_failed_does_not() -> None:
    stage, sink, cp = pipelined()
    cp.commit_now()
    sink.written = 2
    stage.fail = "deliver"
    with pytest.raises(KafkaUnavailable):
        cp.commit_now()
    assert stage.calls[-1] == ("put_back", (["p1", "p2"], False))
    stage.fail = "changelog"
    with pytest.raises(KafkaUnavailable):
        cp.commit_now(final=True)
    assert stage.calls[-2:] == [("changelog", ["p1", "p2", "p3"]), ("put_back", (["p1", "p2", "p3"], True))]
    assert cp.unsettled == []


def test_a_step_that_waits_on_the_event_loop_cannot_run_at_once() -> None:
    async def waits() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="waited on it"):
        at_once(waits())


def test_points_a_stage_takes_back_are_forgotten_and_do_not_pile_up_through_an_outage() -> None:
    stage = Stage(takes_back=True)
    sink = SimpleNamespace(submitted=0, written=0, pending=False, buffered=False)
    cp = Checkpoint(stage, sink, lambda: None, None, wait=True)
    for _ in range(50):
        stage.fail = "deliver"
        with pytest.raises(KafkaUnavailable):
            cp.commit_now()
        assert cp.unsettled == []
    assert stage.calls[-1] == ("put_back", (["p50"], False)), "each failed point is put back once, alone"
    cp.commit_now()
    assert stage.calls[-3:] == [("deliver", None), ("changelog", ["p51"]), ("commit", ["p51"])]
