"""RowBinary rows read back from the real ClickHouse engine equal the rows the sink builds as dicts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.installs import installed

from schemas import codec
from schemas.models import LLMCall, Reward, Span, SpanEvent, ToolCall
from streams import rowbinary
from streams.attempts import span_view
from streams.rollout import Settings, finish_attempt
from streams.sink import ClickHouseSink, span_row, transition_rows
from tests.unit.streams.spans import finished

pytestmark = pytest.mark.integration

SPANS = [
    Span(span_id="s1", trace_id="t" * 32, rollout_id="r1", attempt_id="a1", sequence_id=1, name="chat", kind="llm",
         start_time_ns=1, end_time_ns=2, agent_name="solver", attributes={"k": "v", "ünï": "cödé"},
         llm=LLMCall(model="m", prompt_token_ids=list(range(300)) + [2**32 - 1], response_token_ids=[7, 8],
                     response_logprobs=[-0.5, -1.25], response_mask=[1, 0], resource_version=3)),
    Span(span_id="s2", trace_id="t" * 32, parent_id="s1", rollout_id="r1", attempt_id="a1", sequence_id=2, name="calc",
         kind="tool", start_time_ns=3, end_time_ns=4, status_code="ERROR", status_message="boom",
         events=[SpanEvent(name="exception", time_ns=5, attributes={"type": "ValueError"})],
         resource={"service.name": "agent"}, tool=ToolCall(name="calc", arguments='{"x": 1}', ok=False, error="bad")),
    Span(span_id="s3", trace_id="t" * 32, rollout_id="r1", attempt_id="a1", sequence_id=3, name="reward", kind="reward",
         start_time_ns=6, end_time_ns=7, reward=Reward(value=0.75, dimensions={"style": -1.0, "len": 2.5})),
    Span(span_id="s4", trace_id="t" * 32, rollout_id="r1", attempt_id="a1", sequence_id=4, name="plain",
         start_time_ns=8, end_time_ns=9, tool=ToolCall(name="noargs")),
]


def _select(ch: Any, table: str, order: str) -> list[tuple[Any, ...]]:
    return ch.query(f"SELECT * FROM {table} ORDER BY {order}").result_rows


def test_spans_and_transitions_round_trip(ch: Any) -> None:
    views = [span_view(codec.decode_raw(codec.encode(s))[1]) for s in SPANS]
    result = finish_attempt(views, finished(span_count=4), Settings(credit="discounted", gamma=0.5))
    sink = ClickHouseSink(ch)
    for i, v in enumerate(views):
        sink.add("spans", span_row(v, 2, 100 + i, late=i == 3, ingested_ns=42))
    sink.add_many("transitions", transition_rows(result, "task1@3", 99))
    sink.flush()
    as_dicts = _select(ch, "spans", "span_id"), _select(ch, "transitions", "turn")
    ch.command("TRUNCATE TABLE spans")
    ch.command("TRUNCATE TABLE transitions")

    for i, v in enumerate(views):
        sink.add_encoded("spans", rowbinary.span(v, 2, 100 + i, i == 3, 42))
    for step in result.steps:
        sink.add_encoded("transitions", rowbinary.transition(step, "task1@3", result.credit, 99))
    assert sink.flush() == {"spans": 4, "transitions": 1}
    assert (_select(ch, "spans", "span_id"), _select(ch, "transitions", "turn")) == as_dicts
    assert as_dicts[0][0][17][-1] == 2**32 - 1 and len(as_dicts[0]) == 4


def test_arrays_and_lists_encode_alike() -> None:
    view = span_view(codec.decode_raw(codec.encode(SPANS[0]))[1])  # token ids as arrays
    assert rowbinary.span(view, 0, 0, False, 0) == rowbinary.span(SPANS[0], 0, 0, False, 0)  # as lists


@pytest.mark.parametrize(("n", "encoded"), [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"), (2**21, b"\x80\x80\x80\x01")])
def test_varint(n: int, encoded: bytes) -> None:
    assert rowbinary.varint(n) == encoded


def test_compiled_decoder_rows_read_back_as_the_python_rows(ch: Any) -> None:
    """The span stage's compiled path (native/): ClickHouse reads its rows as it reads the Python path's."""
    installed("rolloutbus_native", "make native (needs cargo; make setup builds it)")
    from streams.spans_stage import native_decoder

    dec = native_decoder()
    sink = ClickHouseSink(ch)
    selects = []
    for compiled in (False, True):
        for i, s in enumerate(SPANS):
            value = codec.encode(s)
            if compiled:
                view, head = dec.decode_one(value)
                row = head + rowbinary.span_tail(i == 3, 2, 100 + i, 42)
            else:
                row = rowbinary.span(span_view(codec.decode_raw(value)[1]), 2, 100 + i, i == 3, 42)
            sink.add_encoded("spans", row)
        assert sink.flush() == {"spans": 4}
        selects.append(_select(ch, "spans", "span_id"))
        ch.command("TRUNCATE TABLE spans")
    assert selects[0] == selects[1] and len(selects[1]) == 4


@pytest.mark.parametrize("flushed_between", [False, True])
def test_a_groups_transitions_replace_the_attempts_rows_still_buffered(ch: Any, flushed_between: bool) -> None:
    """A training rollout's transitions are buffered when its attempt completes and again, with their advantage,
    when its group is emitted. Still in the buffer, the first rows are replaced: ClickHouse gets one row per
    turn. Already flushed, both are written and FINAL shows the group's."""
    views = [span_view(codec.decode_raw(codec.encode(s))[1]) for s in SPANS]
    result = finish_attempt(views, finished(span_count=4), Settings())
    other = finish_attempt([span_view(codec.decode_raw(codec.encode(SPANS[0].model_copy(update={"rollout_id": "r2"})))[1])],
                           finished(span_count=1).model_copy(update={"rollout_id": "r2"}), Settings())
    sink = ClickHouseSink(ch)
    sink.add_transitions(result, "task1@3", 10, ("rb.spans", 0, 7))
    sink.add_transitions(other, "task1@3", 10, ("rb.spans", 0, 8))
    if flushed_between:
        assert sink.flush() == {"transitions": 2}
    result.steps[0].advantage = 1.5
    sink.add_transitions(result, "task1@3", 20, final=True)
    assert sink.flush() == {"transitions": 1 if flushed_between else 2}
    rows = ch.query("SELECT rollout_id, advantage, updated_ns, length(prompt_token_ids) FROM transitions ORDER BY ALL").result_rows
    kept = [("r1", 1.5, 20, 301), ("r2", 0.0, 10, 301)]
    assert rows == (sorted([("r1", 0.0, 10, 301), *kept]) if flushed_between else kept)
    assert ch.query("SELECT rollout_id, advantage FROM transitions FINAL ORDER BY ALL").result_rows == [("r1", 1.5), ("r2", 0.0)]
    assert sink.rows_dropped == (0 if flushed_between else 1)


def test_a_replayed_batch_that_now_carries_its_groups_rows_is_written(ch: Any) -> None:
    """A worker writes an attempt's transitions and stops before it commits their offsets. Its successor
    reads the same records again; this time the group is emitted while those rows wait in the buffer and
    replaces them. Same offsets, same row count, other rows: the insert is a new batch, not a duplicate,
    and FINAL shows the group's advantages (a token naming only offsets and count dropped it)."""
    views = [span_view(codec.decode_raw(codec.encode(s))[1]) for s in SPANS]
    result = finish_attempt(views, finished(span_count=4), Settings())
    first = ClickHouseSink(ch)
    first.add_transitions(result, "task1@3", 10, ("rb.spans", 0, 7))
    assert first.flush() == {"transitions": 1}

    successor = ClickHouseSink(ch)
    successor.add_transitions(result, "task1@3", 10, ("rb.spans", 0, 7))
    result.steps[0].advantage = 1.5
    successor.add_transitions(result, "task1@3", 20, final=True)
    assert successor.flush() == {"transitions": 1}
    assert ch.query("SELECT advantage, updated_ns FROM transitions FINAL").result_rows == [(1.5, 20)]

    # The same batch again (same records, same rows) is still a duplicate: ClickHouse keeps one copy.
    again = ClickHouseSink(ch)
    again.add_transitions(result, "task1@3", 10, ("rb.spans", 0, 7))
    again.add_transitions(result, "task1@3", 20, final=True)
    again.flush()
    assert ch.query("SELECT count() FROM transitions").result_rows == [(2,)]
