"""A reward span that comes after its attempt completed is feedback (streams.feedback.from_late_span), in every
reward encoding the mapping reads; the span stage sends it once its rows are written (no broker here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.installs import missing

from producers.ingest.agl.v1_events import event_to_span
from producers.mapping import otel_to_span
from schemas import codec
from schemas.checks import check_span
from schemas.models import Feedback
from streams.attempts import PartitionState, span_view
from streams.checkpoint import at_once
from streams.feedback import AGAIN, APPLY, DUPLICATE, LATE_SPAN, StoredRollout, from_late_span, verdict
from streams.rollout import Settings
from streams.sink import ClickHouseSink
from streams.spans_stage import SpanStage

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import bench_paths  # noqa: E402 - its stand-ins for a consumed record and the consumer

SPAN = "rolloutbus.Span"
EVENT = "rolloutbus.RolloutEvent"
T_END = 1_800_000_000_000_000_000
IDS = {"agentlightning.rollout_id": "ro-1", "agentlightning.attempt_id": "at-1", "agentlightning.span_sequence_id": 4}


def _otel(attrs: dict[str, Any], name: str = "reward", span_id: str = "00000000000000a1", end_ns: int = T_END) -> dict[str, Any]:
    return otel_to_span(name=name, span_id=span_id, trace_id="ab" * 16, parent_id=None, start_ns=end_ns - 10, end_ns=end_ns,
                        attributes={**IDS, **attrs})


def _view(d: dict[str, Any]) -> Any:
    """The span as the span stage holds it (decoded from its Avro bytes, checked)."""
    _, raw = codec.decode_raw(codec.encode_raw(SPAN, d), (SPAN,))
    check_span(raw)
    return span_view(raw)


ENCODINGS = {
    "agl 0.3 agentlightning.reward.{i}": _otel({"agentlightning.reward.0.name": "task", "agentlightning.reward.0.value": 0.75,
                                                "agentlightning.reward.1.name": "style", "agentlightning.reward.1.value": 0.1}),
    "agl 0.2 annotation reward": _otel({"reward": 0.75}, name="agentlightning.annotation"),
    "agentops reward output": _otel({"agentops.task.output": json.dumps({"type": "reward", "value": 0.75})}),
    "agl 1.x reward event": event_to_span("ro-1", "at-1", {"event_type": "reward", "data": {"value": 0.75}}, sequence_id=0,
                                          span_id="00000000000000a1", time_ns=T_END),
    "ours rolloutbus.reward": _otel({"rolloutbus.reward": 0.75}),
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_a_late_reward_span_in_any_encoding_is_one_feedback(encoding: str) -> None:
    span = _view(ENCODINGS[encoding])
    fb = from_late_span(span, True, arrived_ns=5)
    assert fb == {"feedback_id": "span:at-1:00000000000000a1", "rollout_id": "ro-1", "value": 0.75, "time_ns": T_END,
                  "source": LATE_SPAN, "metadata": {"rolloutbus.attempt_id": "at-1", "rolloutbus.span_id": "00000000000000a1",
                                                    "rolloutbus.span_name": span.name}}
    assert isinstance(codec.decode(codec.encode_raw("rolloutbus.Feedback", fb)), Feedback)  # a valid record
    assert from_late_span(span, False, 5) is None, "a reward span of an attempt still open stays in its trajectory"


def test_only_reward_spans_and_their_time() -> None:
    llm = _view(_otel({"gen_ai.request.model": "m", "prompt_token_ids": [1, 2], "response_token_ids": [3]}, name="openai.chat"))
    assert llm.reward is None and from_late_span(llm, True, 5) is None
    no_value = _view(_otel({"agentops.task.output": json.dumps({"type": "reward", "value": None})}))
    assert from_late_span(no_value, True, 5) is None, "a reward operation that gave no reward"
    timeless = SimpleNamespace(rollout_id="r", attempt_id="a", span_id="s", name="n", start_time_ns=0, end_time_ns=0,
                               reward=SimpleNamespace(value=1.0))
    assert from_late_span(timeless, True, 77)["time_ns"] == 77  # type: ignore[index]
    nan = SimpleNamespace(**{**vars(timeless), "reward": SimpleNamespace(value=float("nan"))})
    assert from_late_span(nan, True, 77) is None


def test_decided_like_any_feedback_the_same_span_again_counts_once_a_second_span_is_a_duplicate() -> None:
    row = StoredRollout({"rollout_id": "ro-1", "attempt_id": "at-1", "mode": "train", "final_reward": 0.0,
                         "finished_ns": T_END - 10**9, "group_id": "", "metadata": {}, "updated_ns": T_END - 10**9})
    first = Feedback(**from_late_span(_view(ENCODINGS["agl 0.3 agentlightning.reward.{i}"]), True, 5))  # type: ignore[arg-type]
    assert verdict(first, row, None, 60) == APPLY
    assert verdict(first, row, first.feedback_id, 60) == AGAIN
    second = Feedback(**from_late_span(_view(_otel({"agentlightning.reward.0.value": 1.0}, span_id="00000000000000b2")),  # type: ignore[arg-type]
                                       True, 5))
    assert verdict(second, row, first.feedback_id, 60) == DUPLICATE


# --------------------------------------------------------------------------- the span stage


class _Msg(bench_paths._Msg):
    """A consumed record, with the time the broker gave it."""

    __slots__ = ()

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


def _event(rid: str, kind: str, count: int = 0) -> bytes:
    return codec.encode_raw(EVENT, {"rollout_id": rid, "attempt_id": "at-1", "event": kind, "time_ns": T_END - 10**9, "task_id": "",
                                    "mode": "train", "attempt": 1, "resource_version": None, "status": "succeeded" if kind == "FINISHED" else None,
                                    "final_reward": None, "span_count": count, "error": None, "metadata": {}})


def _span(rid: str, span_id: str, attrs: dict[str, Any], seq: int) -> bytes:
    d = otel_to_span(name="reward", span_id=span_id, trace_id="ab" * 16, parent_id=None, start_ns=T_END - 10, end_ns=T_END,
                     attributes={"agentlightning.rollout_id": rid, "agentlightning.attempt_id": "at-1",
                                 "agentlightning.span_sequence_id": seq, **attrs})
    return codec.encode_raw(SPAN, d)


@pytest.mark.parametrize("native", [True, False])
def test_the_span_stage_sends_a_late_reward_span_as_feedback_once_its_rows_are_written(native: bool) -> None:
    s = SpanStage({"bootstrap.servers": "127.0.0.1:1"}, group="g", spans_topic="rb.spans", done_topic="d", dlq_topic="q",
                  state_topic="c", sink=ClickHouseSink(client=None), flush_sink=lambda: None, core=Settings(), native=native,
                  feedback_topic="rb.feedback")
    if native and s.decoder is None:
        missing("the compiled decoder (rolloutbus_native)", "make native (needs cargo; make setup builds it)")
    s.consumer.close()
    reward = {"agentlightning.reward.0.value": 1.0}
    values = [
        _event("r1", "STARTED"), _span("r1", "s1", {"x": "y"}, 1), _event("r1", "FINISHED", 1),
        _span("r1", "s2", reward, 2),                    # after r1 completed: feedback
        _span("r1", "s3", {"x": "z"}, 3),                # late, no reward: stored late only
        _event("r2", "STARTED"), _span("r2", "t1", reward, 1), _event("r2", "FINISHED", 1),  # r2's reward while open
    ]
    s.consumer = bench_paths._Batches([_Msg(i, v, b"k") for i, v in enumerate(values)], 3)  # type: ignore[assignment]
    s.parts[0] = PartitionState(0)
    sent: list[tuple[str, bytes | None, bytes | None]] = []
    s._produce = lambda topic, key, value, partition=-1: sent.append((topic, key, value))  # type: ignore[method-assign]
    s._flush = lambda deadline: None  # type: ignore[method-assign]
    try:
        while s.poll():
            pass
        assert s.stats["late"] == 2 and s.stats["late_feedback"] == 1 and s.stats["rollouts"] == 2
        assert not [t for t, *_ in sent if t == "rb.feedback"], "nothing goes before its rows are written"
        point = s.take(False)
        at_once(s.send_changelog([point], 0.0))
    finally:
        s._closed = True
    fbs = [(k, codec.decode(v)) for t, k, v in sent if t == "rb.feedback"]
    assert len(fbs) == 1
    key, fb = fbs[0]
    assert key == b"r1" and isinstance(fb, Feedback)
    assert (fb.feedback_id, fb.rollout_id, fb.value, fb.time_ns, fb.source) == ("span:at-1:s2", "r1", 1.0, T_END, LATE_SPAN)
    rows = {r["rollout_id"]: r for r in s.sink._buffers["rollouts"].rows}
    assert rows["r2"]["final_reward"] == 1.0, "a reward span of an open attempt is its final reward, as before"
    assert rows["r1"]["final_reward"] is None
