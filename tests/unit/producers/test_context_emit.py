"""Rollout context and emit_* helpers: attribution, sequence ids, lifecycle events (no broker)."""

from __future__ import annotations

import asyncio
import threading
from array import array
from typing import Any

import pytest

from producers import arollout, emit_exception, emit_llm_call, emit_message, emit_reward, emit_state, emit_tool_call, rollout
from producers.litagent import function_runner
from rolloutbus import LitAgent
from foundation.errors import RolloutContextError
from schemas.codec import decode, encode_raw, unpack_tokens
from schemas.models import RolloutEvent, Span


class Recorder:
    """Collects what a transport would send, and checks each record encodes with its schema."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def emit(self, key: str, name: str, record: dict[str, Any]) -> bool:
        decoded = decode(encode_raw(name, record))  # the real codec and the validators
        with self.lock:
            self.records.append((key, name, decoded))
        return True

    def spans(self) -> list[Span]:
        return [r for _k, n, r in self.records if n == "rolloutbus.Span"]  # type: ignore[misc]

    def events(self) -> list[RolloutEvent]:
        return [r for _k, n, r in self.records if n == "rolloutbus.RolloutEvent"]  # type: ignore[misc]


def test_rollout_emits_lifecycle_and_first_class_fields() -> None:
    rec = Recorder()
    with rollout("task-1", mode="train", resource_version=3, agent_name="solver", transport=rec) as r:  # type: ignore[arg-type]
        emit_state({"board": [1, 2]})
        emit_message("hello", role="assistant")
        emit_tool_call("calc", {"x": 1}, result=2, ok=True)
        emit_tool_call("web", "q", ok=False, error="timeout")
        emit_llm_call([1, 2, 3], [4, 5], [-0.1, -0.2], model="tiny")
        emit_reward({"acc": 1.0, "len": -0.1}, primary="acc")
    assert all(k == r.rollout_id for k, _n, _r in rec.records)
    started, finished = rec.events()
    assert started.event.value == "STARTED" and started.resource_version == 3
    assert finished.status == "succeeded" and finished.final_reward == 1.0 and finished.span_count == 6
    spans = rec.spans()
    assert [s.sequence_id for s in spans] == [1, 2, 3, 4, 5, 6]
    assert [s.kind for s in spans] == ["state", "message", "tool", "tool", "llm", "reward"]
    assert all(s.agent_name == "solver" and s.attempt_id == r.attempt_id for s in spans)
    assert spans[1].attributes["message.body"] == "hello"
    assert spans[2].tool is not None and spans[2].tool.arguments == '{"x": 1}' and spans[2].tool.result == "2"
    assert spans[3].status_code == "ERROR" and spans[3].tool is not None and spans[3].tool.error == "timeout"
    assert spans[4].llm is not None and spans[4].llm.response_token_ids == [4, 5] and spans[4].llm.resource_version == 3
    assert spans[5].reward is not None and spans[5].reward.dimensions == {"acc": 1.0, "len": -0.1}


def test_exception_in_rollout_is_recorded_and_reraised() -> None:
    rec = Recorder()
    with pytest.raises(ZeroDivisionError):
        with rollout("t", transport=rec):  # type: ignore[arg-type]
            1 / 0
    exc_span = rec.spans()[-1]
    assert exc_span.kind == "exception" and exc_span.attributes["exception.type"] == "ZeroDivisionError"
    assert rec.events()[-1].status == "failed" and "ZeroDivisionError" in (rec.events()[-1].error or "")


def test_outside_a_rollout_raises_or_ignores(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RolloutContextError, match="outside a rollout"):
        emit_state(1)
    monkeypatch.setenv("ROLLOUTBUS_EMIT_OUTSIDE_ROLLOUT", "ignore")
    emit_state(1)
    emit_reward(1.0)


def test_threads_of_one_rollout_never_share_a_sequence_id() -> None:
    rec = Recorder()
    with rollout("t", transport=rec) as r:  # type: ignore[arg-type]
        import contextvars

        def work() -> None:
            for _ in range(200):
                emit_state(0)

        threads = [threading.Thread(target=contextvars.copy_context().run, args=(work,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    seqs = sorted(s.sequence_id for s in rec.spans())
    assert seqs == list(range(1, 801)) and r.span_count == 800


def test_async_rollouts_are_attributed_to_their_own_task() -> None:
    rec = Recorder()

    async def one(n: int) -> str:
        async with arollout(f"t{n}", transport=rec) as r:  # type: ignore[arg-type]
            for i in range(5):
                emit_state(i)
                await asyncio.sleep(0)
            return r.rollout_id

    async def main() -> list[str]:
        return await asyncio.gather(*(one(n) for n in range(3)))

    ids = asyncio.run(main())
    for rid in ids:
        assert [s.sequence_id for s in rec.spans() if s.rollout_id == rid] == [1, 2, 3, 4, 5]


def test_nan_reward_is_not_recorded_and_not_raised() -> None:
    rec = Recorder()
    with rollout("t", transport=rec):  # type: ignore[arg-type]
        emit_reward(float("nan"))
    assert rec.spans() == [] and rec.events()[-1].final_reward is None


def test_litagent_return_value_is_the_final_reward_and_failures_are_data() -> None:
    rec = Recorder()

    class Good(LitAgent):
        name = "good"

        def rollout(self, task: Any, resources: Any, rollout: Any) -> float:
            emit_state(task)
            return 0.5

    async def raises(task: Any, resources: Any, rollout: Any) -> float:
        emit_state(task)
        raise ValueError("boom")

    bad = function_runner(raises, name="bad")  # a plain function of the bus's records, as `rolloutbus run-agent module:fn` runs it

    ok = Good().run({"q": 1}, task_id="t1", transport=rec)
    assert ok.status == "succeeded" and ok.reward == 0.5
    failed = asyncio.run(bad.arun({"q": 2}, task_id="t2", transport=rec, attempt=2))
    assert failed.status == "failed" and failed.error == "ValueError: boom"
    finished = [e for e in rec.events() if e.event.value == "FINISHED"]
    assert [(e.status, e.final_reward, e.attempt) for e in finished] == [("succeeded", 0.5, 1), ("failed", None, 2)]
    assert [s.agent_name for s in rec.spans()] == ["good", "bad", "bad"]
    assert rec.spans()[-1].kind == "exception"


def test_exception_helper_and_llm_token_roundtrip() -> None:
    rec = Recorder()
    with rollout("t", transport=rec):  # type: ignore[arg-type]
        try:
            raise KeyError("k")
        except KeyError as exc:
            emit_exception(exc)
        emit_llm_call(list(range(1000)), [5, 6], sequence_id=10)
        emit_state("after")
    spans = rec.spans()
    assert spans[0].status_code == "ERROR" and spans[0].events[0].name == "exception"
    assert spans[1].llm is not None and spans[1].llm.prompt_token_ids == list(range(1000)) and spans[1].sequence_id == 10
    assert spans[2].sequence_id == 11, "an explicit sequence id moves the counter past it"
    assert unpack_tokens(b"\x05\x00\x00\x00") == [5]


@pytest.mark.parametrize("make", [list, tuple, lambda x: array("I", x), lambda x: array("l", x), lambda x: (i for i in x)])
def test_llm_record_packs_any_sequence_of_token_ids_alike(make: Any) -> None:
    from producers.emit import llm_record

    ids = [5, 6, 7]
    got = llm_record(make(ids), make(ids), [-0.5, -0.25])
    assert got["prompt_token_ids"] == got["response_token_ids"] == llm_record(ids, ids)["prompt_token_ids"]
    assert unpack_tokens(got["prompt_token_ids"]) == ids
    with pytest.raises(OverflowError):  # a negative id: refused as before (array("I", [-1]) by make itself)
        llm_record(make([-1]), [])
