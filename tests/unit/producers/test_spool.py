"""The on-disk spool: order, acknowledgement, torn tails, one owner per directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.spool import Spool, SpoolLocked, open_spool


def test_records_come_back_in_order_after_reopen(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s", max_bytes=1 << 20)
    for i in range(100):
        assert s.append(b"k%d" % (i % 3), b"v%d" % i) == i
    s.ack_to(40)
    s.close()
    s2 = Spool(tmp_path / "s", max_bytes=1 << 20)
    assert s2.acked == 40 and s2.head == 100
    got = s2.read_from(40, 1000)
    assert [v for _i, _k, v in got] == [b"v%d" % i for i in range(40, 100)]
    assert [i for i, _k, _v in got] == list(range(40, 100))


def test_fully_acked_spool_deletes_its_segments(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s", max_bytes=64 << 10)  # small segments
    for i in range(2000):
        s.append(b"k", b"x" * 50)
    assert len(list((tmp_path / "s").glob("*.seg"))) > 1
    s.ack_to(2000)
    assert list((tmp_path / "s").glob("*.seg")) == [] and s.size_bytes == 0 and s.pending == 0
    assert s.append(b"k", b"again") == 2000


def test_torn_tail_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s")
    for i in range(10):
        s.append(b"k", b"v%d" % i)
    s.close()
    [seg] = list((tmp_path / "s").glob("*.seg"))
    with open(seg, "ab") as fh:
        fh.write(b"\x40\x00\x00\x00garbage")  # a crash mid-frame
    s2 = Spool(tmp_path / "s")
    assert s2.head == 10 and [v for *_x, v in s2.read_from(0, 100)][-1] == b"v9"


def test_full_reports_the_bound(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s", max_bytes=10_000)
    while not s.full(100):
        s.append(b"k", b"x" * 90)
    assert s.size_bytes + 100 > 10_000


def test_a_live_owner_locks_its_slot_and_the_next_process_gets_another(tmp_path: Path) -> None:
    a = open_spool(tmp_path, "agent")
    with pytest.raises(SpoolLocked):
        Spool(a.dir)
    b = open_spool(tmp_path, "agent")
    assert a.dir.name == "agent-0" and b.dir.name == "agent-1"
    a.close()
    assert open_spool(tmp_path, "agent").dir.name == "agent-0", "a released slot is adopted (and replayed)"


def test_transport_encodes_with_the_codec_and_counts_what_it_cannot() -> None:
    """The worker's encoding is ``encode_raw`` (the generated writer, fastavro for the unusual): a
    record that does not fit the schema is counted and logged, never raised into the agent."""
    from producers.transport import SpanTransport
    from schemas.codec import encode_raw

    span = {"span_id": "ab" * 8, "trace_id": "cd" * 16, "parent_id": None, "rollout_id": "r", "attempt_id": "a",
            "sequence_id": 3, "name": "n", "kind": "llm", "start_time_ns": 1, "end_time_ns": 2, "status_code": "OK",
            "status_message": None, "attributes": {"k": "v"}, "events": [], "resource": {},
            "llm": {"model": "m", "prompt_token_ids": b"\x01\x00\x00\x00", "response_token_ids": b"", "response_logprobs": b"",
                    "response_mask": b"", "resource_version": 2, "request_id": None, "finish_reason": None},
            "reward": None, "tool": None, "agent_name": None}
    t = SpanTransport.__new__(SpanTransport)  # _encode only: no spool, no producer
    t.counters = {"encode_errors": 0}
    assert t._encode(("r", "rolloutbus.Span", span)) == (b"r", encode_raw("rolloutbus.Span", span))
    assert t._encode(("r", "rolloutbus.Span", {**span, "sequence_id": "x"})) is None
    assert t.counters["encode_errors"] == 1
