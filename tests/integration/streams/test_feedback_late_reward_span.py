"""Agent Lightning's reward span sent after its rollout was completed and written: late feedback, through the
stream worker, on the real broker and the real ClickHouse engine (chDB)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from producers.mapping import otel_to_span
from schemas import codec
from schemas.models import GroupBatch
from tests.integration.streams.helpers import encoded, produce, query, read_topic, rollout, start_worker, stop_worker
from tests.integration.streams.test_feedback_worker import FINISHED, _committed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _al_reward(rid: str, span_id: str, value: float, seq: int, after_s: float) -> tuple[str, bytes]:
    """A reward span as Agent Lightning 0.3's ``emit_reward`` writes it (``agentlightning.reward.0.*``), mapped as the
    gateway maps an OTLP span."""
    end = FINISHED + int(after_s * 1e9)
    span = otel_to_span(name="agentlightning.annotation", span_id=span_id, trace_id="ab" * 16, parent_id=None,
                        start_ns=end - 1000, end_ns=end, attributes={
                            "agentlightning.rollout_id": rid, "agentlightning.attempt_id": f"{rid}-a1",
                            "agentlightning.span_sequence_id": seq,
                            "agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": value})
    return rid, codec.encode_raw("rolloutbus.Span", span)


def _stats(out: str, name: str) -> int:
    m = re.search(rf"'{name}': (\d+)", out)
    assert m is not None, out[-3000:]
    return int(m.group(1))


def test_al_reward_span_after_its_rollout_completed_is_applied_once_a_second_one_dead_lettered(kafka_conf: Any, topics: Any,
                                                                                               test_env: Any) -> None:
    flags = ("--feedback-window", "60", "--feedback-baseline", "none")
    done_spans, done_ev = rollout("al-r1", "", reward=0.0)  # task-less, completed with 0.0
    open_spans, open_ev = rollout("al-r2", "", reward=0.0)
    open_ev = open_ev.model_copy(update={"final_reward": None, "span_count": 5})  # its reward is the span's
    produce(kafka_conf, topics.spans, encoded(done_spans, done_ev) + [(s.rollout_id, codec.encode(s)) for s in open_spans]
            + [_al_reward("al-r2", "00000000000000c1", 1.0, 5, -1), (open_ev.rollout_id, codec.encode(open_ev))])
    proc = start_worker(test_env, *flags)
    _committed(kafka_conf, f"{topics.prefix}streams.spans", topics.spans, proc)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    assert query(test_env, {"ro": "SELECT rollout_id, final_reward FROM rollouts FINAL ORDER BY rollout_id"})["ro"] == [
        ["al-r1", 0.0], ["al-r2", 1.0]], "both stored: al-r1 completed and written before its late reward comes"

    # A worker restarted from the completed attempts' changelog reads them late.
    first = _al_reward("al-r1", "00000000000000a1", 1.0, 5, 5)
    produce(kafka_conf, topics.spans, [
        first,
        first,                                                  # the same span again (an exporter's retry): counts once
        _al_reward("al-r1", "00000000000000b2", -1.0, 6, 8),    # a second reward: the first wins
    ])
    proc = start_worker(test_env, *flags)
    _committed(kafka_conf, f"{topics.prefix}streams.spans", topics.spans, proc)  # → its feedback delivered
    _committed(kafka_conf, f"{topics.prefix}streams", topics.feedback, proc)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    assert _stats(out, "late_feedback") == 3 and _stats(out, "late") == 3, out[-3000:]
    assert (_stats(out, "feedback_applied"), _stats(out, "feedback_redelivered"), _stats(out, "feedback_dead")) == (1, 1, 1)

    batches = [codec.decode(v) for _, v in read_topic(kafka_conf, topics.batches, 99, 5)]
    assert all(isinstance(b, GroupBatch) for b in batches)
    assert {(b.group_id, tuple(b.rewards)) for b in batches} == {("feedback:al-r1", (1.0,))}  # trained once, on 1.0
    rows = query(test_env, {
        "ro": "SELECT rollout_id, final_reward, metadata['rolloutbus.feedback_id'], metadata['rolloutbus.feedback_source'], "
              "metadata['rolloutbus.reward_before_feedback'] FROM rollouts FINAL ORDER BY rollout_id",
        "late": "SELECT rollout_id, countIf(late), uniqExact(span_id) FROM spans FINAL GROUP BY rollout_id ORDER BY rollout_id",
        "dlq": "SELECT reason, count(), any(detail) FROM dead_letters FINAL "
               f"WHERE source_topic = '{topics.feedback}' GROUP BY reason",
    })
    assert rows["ro"] == [["al-r1", 1.0, "span:al-r1-a1:00000000000000a1", "late_span", "0.0"],
                          ["al-r2", 1.0, "", "", ""]], "the open rollout's reward span is its reward, as before; no feedback"
    assert rows["late"] == [["al-r1", 2, 6], ["al-r2", 0, 5]], "the late spans are stored, flagged late, as before"
    assert [r[:2] for r in rows["dlq"]] == [["feedback.duplicate", 1]]
    assert "already has feedback span:al-r1-a1:00000000000000a1; span:al-r1-a1:00000000000000b2 not applied" in rows["dlq"][0][2]
