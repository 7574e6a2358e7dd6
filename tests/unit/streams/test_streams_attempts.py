"""In-flight attempts of one partition: completion, late spans, replay after a crash, commit offsets."""

from __future__ import annotations

from typing import Any

from schemas import codec
from schemas.models import RolloutEvent
from streams.attempts import PartitionState, span_view
from streams.rollout import RolloutResult, Settings, finish_attempt
from tests.unit.streams.spans import finished, llm, span, tool


def view(s: Any) -> Any:
    return span_view(codec.decode_raw(codec.encode(s))[1])


def run(st: PartitionState, records: list[tuple[int, Any]], now: float = 0.0) -> tuple[list[int], list[int], list[tuple[str, int]]]:
    """Feed (offset, record); → (offsets whose span row is written, offsets flagged late, completions)."""
    written, late, completed = [], [], []
    for offset, rec in records:
        if isinstance(rec, RolloutEvent):
            att = st.on_event(rec, offset, now)
        else:
            write, is_late, att = st.on_span(view(rec), offset, now)
            if write:
                written.append(offset)
            if is_late:
                late.append(offset)
        if att is not None:
            completed.append((att.rollout_id, offset))
            st.complete(att, max(offset, att.finished_offset))
    return written, late, completed


def test_view_has_the_shape_the_core_reads() -> None:
    spans = [llm(1, prompt=[7, 8, 2**32 - 1]), tool(2, ok=False), span(3, events=[])]
    ev = finished(span_count=3)
    from_views, from_models = finish_attempt([view(s) for s in spans], ev, Settings()), finish_attempt(spans, ev, Settings())
    assert from_views.to_bytes() == from_models.to_bytes()
    assert RolloutResult.from_bytes(from_views.to_bytes()).to_bytes() == from_models.to_bytes()
    v = view(spans[0])
    assert list(v.llm.prompt_token_ids) == [7, 8, 2**32 - 1] and v.llm.response_mask == [] and v.tool is None


def test_an_attempt_completes_when_finished_finds_every_span() -> None:
    st = PartitionState(0)
    written, late, completed = run(st, [(0, span(1)), (1, finished(span_count=3)), (2, span(2)), (3, span(3))])
    assert written == [0, 2, 3] and late == [] and completed == [("r1", 3)]
    assert st.finished_offset(("r1", "a1")) == 3


def test_commit_is_the_position_and_replay_starts_at_the_oldest_inflight_attempt() -> None:
    st = PartitionState(0)
    run(st, [(10, span(1, rid="old")), (11, span(1, rid="r1")), (12, finished(rid="r1", span_count=1)), (13, span(2, rid="old"))])
    entries, commit = st.commit_point(now_ns=5, retention_ns=100)
    assert commit == (14, 10) and entries == [(("r1", "a1"), 12)]
    run(st, [(14, finished(rid="old", span_count=2))])
    entries, commit = st.commit_point(now_ns=6, retention_ns=100)
    assert commit == (15, 15) and entries == [(("old", "a1"), 14)]
    assert st.commit_point(now_ns=7, retention_ns=100) == ([], None)  # nothing new


def test_late_spans_are_written_and_flagged_replays_are_not_written() -> None:
    st = PartitionState(0)
    run(st, [(0, span(1)), (1, finished(span_count=1))])
    st.commit_point(1, 100)
    written, late, completed = run(st, [(0, span(1)), (1, finished(span_count=1)), (5, span(2))])
    assert written == [5] and late == [5] and completed == []


def test_crash_and_replay_completes_each_attempt_once_and_writes_each_span() -> None:
    records = [
        (0, span(1, rid="a")), (1, span(1, rid="b")), (2, finished(rid="a", span_count=1)),
        (3, span(2, rid="b")), (4, span(1, rid="c")), (5, finished(rid="c", span_count=1)),
        (6, finished(rid="b", span_count=2)),
    ]
    first = PartitionState(0)
    w1, _, c1 = run(first, records[:4])  # a completes; b in flight
    entries, commit = first.commit_point(now_ns=1, retention_ns=10**12)
    assert commit == (4, 1) and c1 == [("a", 2)]
    position, replay_from = commit
    w1b, _, c1b = run(first, records[4:6])  # c completes, then the process dies before its next commit

    # restart: the changelog gives the done attempts, the commit metadata how far rows were written
    second = PartitionState(0, sunk_below=position)
    for key, off in entries:
        second.restore(key, off)
    replay = [r for r in records if r[0] >= replay_from]
    w2, late, c2 = run(second, replay)
    assert late == []
    assert sorted(c1 + c2) == [("a", 2), ("b", 6), ("c", 5)]  # c again: its completion was not committed
    assert sorted(set(w1 + w1b + w2)) == [0, 1, 3, 4]
    assert [o for o in w2 if o < second.sunk_below] == []  # rows written before the commit are not written again


def test_done_attempts_are_forgotten_after_their_retention() -> None:
    st = PartitionState(0)
    run(st, [(0, finished(rid="x", span_count=0))])
    st.commit_point(now_ns=0, retention_ns=100)
    entries, _ = st.commit_point(now_ns=50, retention_ns=100)
    assert entries == [] and ("x", "a1") in st.done
    entries, _ = st.commit_point(now_ns=100, retention_ns=100)
    assert entries == [(("x", "a1"), None)] and not st.done


def test_due_after_grace_and_after_inactivity() -> None:
    st = PartitionState(0)
    run(st, [(0, span(1, rid="quiet"))], now=0.0)
    run(st, [(1, finished(rid="gap", span_count=2))], now=5.0)
    assert st.graced(now=9.0, grace_s=10.0) == [] and st.idle(now=9.0, timeout_s=10.0) == []
    assert [a.rollout_id for a in st.graced(now=15.0, grace_s=10.0)] == ["gap"]
    assert [a.rollout_id for a in st.idle(now=15.0, timeout_s=10.0)] == ["quiet"]
    assert st.graced(now=16.0, grace_s=10.0) == [], "an attempt's grace ends once"


def test_graced_attempts_come_due_in_the_order_they_finished_and_only_while_they_wait() -> None:
    st = PartitionState(0)
    for i, rid in enumerate(["a", "b", "c", "d"]):
        run(st, [(2 * i, span(1, rid=rid))], now=0.0)
        run(st, [(2 * i + 1, finished(rid=rid, span_count=2))], now=float(i))
    # "b" gets its missing span: complete at once, nothing left to wait for
    _, _, ready = st.on_span(view(span(2, rid="b")), 8, 1.5)
    assert ready is not None and ready.rollout_id == "b"
    st.complete(ready, 3)
    # "c" finishes again later (a second FINISHED): its grace counts from that one
    run(st, [(9, finished(rid="c", span_count=2))], now=3.5)
    assert [a.rollout_id for a in st.graced(now=10.0, grace_s=10.0)] == ["a"]
    assert st.graced(now=12.9, grace_s=10.0) == [], "b completed; c's grace now ends at 13.5"
    assert [a.rollout_id for a in st.graced(now=13.0, grace_s=10.0)] == ["d"]
    assert [a.rollout_id for a in st.graced(now=13.5, grace_s=10.0)] == ["c"]
    assert not st.waiting


def test_two_finished_records_read_in_one_poll_make_one_completion() -> None:
    """Both were queued at the same time and both matched the attempt's time: it completed twice."""
    st = PartitionState(0)
    run(st, [(0, span(1)), (1, finished(span_count=2)), (2, finished(span_count=2))], now=1.0)
    assert [a.rollout_id for a in st.graced(now=11.0, grace_s=10.0)] == ["r1"]


def test_replay_from_is_read_back_from_commit_metadata_only_when_it_is_ours() -> None:
    from streams.spans_stage import REPLAY_PREFIX, parse_replay_from

    assert parse_replay_from(f"{REPLAY_PREFIX}42") == 42
    assert parse_replay_from(None) is None and parse_replay_from("") is None
    assert parse_replay_from("42") is None and parse_replay_from(f"{REPLAY_PREFIX}-1") is None


def test_a_partition_resumes_where_its_commit_says_unless_the_commit_is_past_its_end() -> None:
    """A reset deletes and creates the topics again; a consumer group's offsets the broker kept (seen in the demo:
    every span of the new run counted as replayed, no group formed) must not make the new topic's spans old."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID

    from streams.spans_stage import REPLAY_PREFIX, resume_point

    assert resume_point(OFFSET_INVALID, None, 0) == (OFFSET_INVALID, 0)  # no commit: the reset policy (earliest)
    assert resume_point(120, f"{REPLAY_PREFIX}90", 500) == (90, 120)  # in-flight attempts read again, not rewritten
    assert resume_point(120, "not ours", 500) == (120, 0)
    assert resume_point(500, f"{REPLAY_PREFIX}450", 500) == (450, 500)  # at the end: still this topic's
    assert resume_point(5000, f"{REPLAY_PREFIX}4000", 37) == (OFFSET_BEGINNING, 0)  # an earlier topic's offsets
    assert resume_point(5000, None, 0) == (OFFSET_BEGINNING, 0)
    assert resume_point(5000, f"{REPLAY_PREFIX}4000", -1) == (4000, 5000)  # the end not known: the commit as it is


# --------------------------------------------------------------------------- numbering unnumbered spans


def numbered(st: PartitionState, records: list[tuple[int, Any]]) -> dict[str, int]:
    """Feed spans as ``run`` does, keeping the views; → span id → the sequence id its row carries."""
    out: dict[str, int] = {}
    for offset, rec in records:
        if isinstance(rec, RolloutEvent):
            att = st.on_event(rec, offset, 0.0)
        else:
            v = view(rec)
            _write, _late, att = st.on_span(v, offset, 0.0)
            out[v.span_id] = v.sequence_id
        if att is not None:
            st.complete(att, max(offset, att.finished_offset))
    return out


def test_unnumbered_spans_are_numbered_in_arrival_order_and_the_attempt_completes() -> None:
    # Six spans of one attempt through two gateway replicas: none numbered, interleaved on the partition.
    # Another rollout's span between them changes nothing.
    recs: list[Any] = [span(0, span_id=f"s{i}") for i in range(6)]
    recs.insert(3, span(1, rid="other"))
    records = list(enumerate([*recs, finished(span_count=6)]))
    st = PartitionState(0)
    got = numbered(st, records)
    assert [got[f"s{i}"] for i in range(6)] == [1, 2, 3, 4, 5, 6]
    assert st.finished_offset(("r1", "a1")) == 7, "FINISHED's span_count found 1..6 in"


def test_numbering_follows_the_highest_id_and_a_copy_keeps_its_number() -> None:
    st = PartitionState(0)
    v = view(span(0, span_id="u1"))
    st.on_span(view(span(4, span_id="p4")), 0, 0.0)
    st.on_span(v, 1, 0.0)
    assert v.sequence_id == 5 and v.attributes["rolloutbus.sequence_by"] == "stream"
    again = view(span(0, span_id="u1"))
    st.on_span(again, 2, 0.0)
    assert again.sequence_id == 5, "a re-export's row replaces the first's: the same number"
    nxt = view(span(0, span_id="u2"))
    st.on_span(nxt, 3, 0.0)
    assert nxt.sequence_id == 6 and "rolloutbus.sequence_by" not in view(span(4)).attributes


def test_a_replay_gives_every_unnumbered_span_the_number_it_had() -> None:
    records: list[tuple[int, Any]] = [(0, span(0, span_id="x1")), (1, span(0, span_id="x2", rid="b")),
                                      (2, span(0, span_id="x3")), (3, span(0, span_id="x4", rid="b")),
                                      (4, finished(span_count=2)), (5, span(0, span_id="x5", rid="b"))]
    first = PartitionState(0)
    before = numbered(first, records[:4])
    _entries, commit = first.commit_point(now_ns=1, retention_ns=10**12)
    assert commit is not None
    before.update(numbered(first, records[4:]))
    # a crash: the next owner reads from the oldest in-flight attempt, rows below the commit not rewritten
    second = PartitionState(0, sunk_below=commit[0])
    after = numbered(second, [r for r in records if r[0] >= commit[1]])
    assert after == before == {"x1": 1, "x2": 1, "x3": 2, "x4": 2, "x5": 3}


# --------------------------------------------------------------------------- a FINISHED that knows only the ids


def test_a_finished_without_task_takes_the_started_and_waits_its_grace() -> None:
    st = PartitionState(0)
    started = RolloutEvent(rollout_id="r1", attempt_id="a1", event="STARTED", time_ns=1, task_id="t7", mode="val",
                           attempt=2, resource_version=4)
    api_finished = finished(task="", span_count=0, metadata={"rolloutbus.spans_unknown": "1"})
    assert st.on_event(started, 0, 0.0) is None
    assert st.on_span(view(span(0, span_id="s1")), 1, 0.0)[2] is None
    assert st.on_event(api_finished, 2, 1.0) is None, "not complete at once: spans may still be on their way"
    assert st.on_span(view(span(0, span_id="s2")), 3, 2.0)[2] is None
    assert st.graced(now=5.0, grace_s=10.0) == []
    [att] = st.graced(now=11.0, grace_s=10.0)
    assert att.finished is not None and len(att.spans) == 2
    ev = att.finished
    assert (ev.task_id, ev.mode, ev.attempt, ev.resource_version, ev.status) == ("t7", "val", 2, 4, "succeeded")
    res = finish_attempt(list(att.spans.values()), ev, Settings())
    assert (res.task_id, res.mode, res.missing_sequence_ids) == ("t7", "val", [])
