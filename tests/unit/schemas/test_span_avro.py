"""The generated Span and RolloutEvent codecs against fastavro, their reference: same bytes, same dicts, same errors."""

from __future__ import annotations

import copy
import io
import json
import math

import fastavro
import pytest

from tests.installs import missing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundation.errors import DecodeError, EncodeError
from schemas import codec, span_avro

SPAN = "rolloutbus.Span"
PARSED = codec.schema_set().parsed[SPAN]
HEADER = codec.MAGIC_SINGLE_OBJECT + codec.schema_set().fingerprints[SPAN]


def ref_write(d: dict, parsed: object = PARSED) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, d)
    return buf.getvalue()


def ref_read(body: bytes, parsed: object = PARSED) -> dict:
    buf = io.BytesIO(body)
    out = fastavro.schemaless_reader(buf, parsed, None)
    if buf.tell() != len(body):
        raise ValueError("trailing bytes")
    return out


text = st.text(max_size=80) | st.text(min_size=60, max_size=300)  # lengths across the 1-byte varint boundary
longs = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
maps = st.dictionaries(text, text, max_size=5)
floats = st.floats(allow_nan=False)
llm = st.fixed_dictionaries({
    "model": st.none() | text, "prompt_token_ids": st.binary(max_size=9000), "response_token_ids": st.binary(max_size=64),
    "response_logprobs": st.binary(max_size=64), "response_mask": st.binary(max_size=16),
    "resource_version": st.none() | longs, "request_id": st.none() | text, "finish_reason": st.none() | text,
})
spans = st.fixed_dictionaries({
    "span_id": text, "trace_id": text, "parent_id": st.none() | text, "rollout_id": text, "attempt_id": text,
    "sequence_id": longs, "name": text, "kind": text, "start_time_ns": longs, "end_time_ns": longs,
    "status_code": text, "status_message": st.none() | text, "attributes": maps,
    "events": st.lists(st.fixed_dictionaries({"name": text, "time_ns": longs, "attributes": maps}), max_size=3),
    "resource": maps, "llm": st.none() | llm,
    "reward": st.none() | st.fixed_dictionaries({"value": floats, "primary": text,
                                                 "dimensions": st.dictionaries(text, floats, max_size=3)}),
    "tool": st.none() | st.fixed_dictionaries({"name": text, "arguments": text, "result": st.none() | text,
                                               "ok": st.booleans(), "error": st.none() | text}),
    "agent_name": st.none() | text,
})


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN (a hostile body can carry one)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(spans)
def test_random_spans_same_bytes_and_dicts(d: dict) -> None:
    body = span_avro.write_span(d)
    assert body == ref_write(d)
    assert same(span_avro.read_span(body, 0), ref_read(body))
    assert codec.decode_raw(codec.encode_raw(SPAN, d)) == (SPAN, ref_read(body))


def hostile(body: bytes, data: st.DataObject) -> bytes:
    """``body`` with one to four bytes flipped, cuts and insertions (also the span stage's tests)."""
    out = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        i = data.draw(st.integers(0, max(len(out) - 1, 0)))
        if op == "flip" and out:
            out[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del out[i:]
        else:
            out[i:i] = data.draw(st.binary(min_size=1, max_size=10))
    return bytes(out)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(spans, st.data())
def test_hostile_bytes_read_as_fastavro_reads_them(d: dict, data: st.DataObject) -> None:
    """Flipped, cut and inserted bytes: the codec returns fastavro's dict, or fails where it fails."""
    body = hostile(ref_write(d), data)
    try:
        expected = ref_read(bytes(body))
    except Exception:  # noqa: BLE001 - any fastavro failure is a DecodeError for us
        expected = None
    if expected is None or not isinstance(expected, dict):
        with pytest.raises(DecodeError):
            codec.decode_raw(HEADER + bytes(body))
    else:
        assert same(codec.decode_raw(HEADER + bytes(body))[1], expected)
    try:
        fast = span_avro.read_span(bytes(body), 0)
    except span_avro.Unusual:
        return
    assert expected is not None and same(fast, expected), "the fast reader accepted what fastavro reads otherwise"


@pytest.mark.parametrize("change", [
    {"sequence_id": True}, {"sequence_id": 1.0}, {"sequence_id": 1 << 63}, {"name": b"x"}, {"name": None},
    {"attributes": {"k": 1}}, {"attributes": [("k", "v")]}, {"parent_id": 5}, {"events": [{"name": "e"}]},
    {"reward": {"value": 1, "primary": "reward", "dimensions": {}}}, {"tool": {"name": "t"}}, {"name": "\ud800"},
    {"llm": {"model": None, "prompt_token_ids": bytearray(b"ab")}},
])
def test_unusual_values_are_written_or_refused_as_fastavro_does(change: dict) -> None:
    d = {**json.loads(json.dumps(BASE)), **change}
    try:
        expected = ref_write(d)
    except Exception:  # noqa: BLE001
        with pytest.raises(EncodeError):
            codec.encode_raw(SPAN, d)
        return
    assert codec.encode_raw(SPAN, d) == HEADER + expected


def test_missing_field_with_a_nullable_type_is_written_as_fastavro_does() -> None:
    d = {k: v for k, v in BASE.items() if k != "agent_name"}
    assert codec.encode_body(SPAN, d) == ref_write(d)


def test_varint_forms_fastavro_decides() -> None:
    """A length padded with a zero byte, a negative block count: left to fastavro, same answer."""
    body = bytearray(ref_write(BASE))
    padded = bytes([body[0] | 0x80, 0]) + bytes(body[1:])  # span_id's length, in two bytes
    with pytest.raises(span_avro.Unusual):
        span_avro.read_span(padded, 0)
    try:
        expected = ref_read(padded)
    except Exception:  # noqa: BLE001
        with pytest.raises(DecodeError):
            codec.decode_raw(HEADER + padded)
    else:
        assert codec.decode_raw(HEADER + padded)[1] == expected


def test_generated_source_follows_the_schema() -> None:
    src = span_avro.generated_source(json.loads(span_avro.SPAN_SCHEMA.read_text()))
    assert src.startswith("def read_span(data, pos):") and "def write_span(rec):" in src
    with pytest.raises(RuntimeError, match="cannot generate"):
        span_avro.generated_source({"type": "record", "name": "X", "fields": [{"name": "a", "type": "float"}]})


BASE = {
    "span_id": "s1", "trace_id": "t" * 32, "parent_id": None, "rollout_id": "ro-1", "attempt_id": "at-1",
    "sequence_id": 3, "name": "tool.search", "kind": "tool", "start_time_ns": 1, "end_time_ns": 2,
    "status_code": "OK", "status_message": None, "attributes": {"a": "b"}, "events": [], "resource": {},
    "llm": None, "reward": None, "tool": None, "agent_name": "agent",
}


EVENT = "rolloutbus.RolloutEvent"
EVENT_PARSED = codec.schema_set().parsed[EVENT]
EVENT_HEADER = codec.MAGIC_SINGLE_OBJECT + codec.schema_set().fingerprints[EVENT]
events = st.fixed_dictionaries({
    "rollout_id": text, "attempt_id": text, "event": st.sampled_from(["STARTED", "HEARTBEAT", "FINISHED"]),
    "time_ns": longs, "task_id": text, "mode": text, "attempt": st.integers(-(2**31), 2**31 - 1),
    "resource_version": st.none() | longs, "status": st.none() | text, "final_reward": st.none() | floats,
    "span_count": longs, "error": st.none() | text, "metadata": maps,
})


def ref_event_write(d: dict) -> bytes:
    return ref_write(d, EVENT_PARSED)


def ref_event_read(body: bytes) -> dict:
    return ref_read(body, EVENT_PARSED)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(events, st.data())
def test_events_same_bytes_and_dicts_also_when_hostile(d: dict, data: st.DataObject) -> None:
    body = span_avro.write_event(d)
    assert body == ref_event_write(d)
    assert same(span_avro.read_event(body, 0), ref_event_read(body))
    hostile = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, max(len(hostile) - 1, 0)))
        if data.draw(st.booleans()) and hostile:
            hostile[i] = data.draw(st.integers(0, 255))
        else:
            del hostile[i:]
    try:
        expected = ref_event_read(bytes(hostile))
    except Exception:  # noqa: BLE001
        with pytest.raises(DecodeError):
            codec.decode_raw(EVENT_HEADER + bytes(hostile))
        return
    assert same(codec.decode_raw(EVENT_HEADER + bytes(hostile))[1], expected)


@pytest.mark.parametrize("change", [{"event": "DONE"}, {"event": 1}, {"attempt": 2**31}, {"attempt": True},
                                    {"final_reward": 1}, {"metadata": {"a": None}}])
def test_unusual_events_are_written_or_refused_as_fastavro_does(change: dict) -> None:
    d = {"rollout_id": "r", "attempt_id": "a", "event": "STARTED", "time_ns": 1, "task_id": "t", "mode": "train",
         "attempt": 1, "resource_version": None, "status": None, "final_reward": None, "span_count": 0, "error": None,
         "metadata": {}, **change}
    try:
        expected = ref_event_write(d)
    except Exception:  # noqa: BLE001
        with pytest.raises(EncodeError):
            codec.encode_raw(EVENT, d)
        return
    assert codec.encode_raw(EVENT, d) == EVENT_HEADER + expected


@settings(max_examples=500)
@given(st.binary(max_size=14), longs, st.binary(max_size=3))
def test_varints_read_as_the_avro_spec_reads_them(noise: bytes, n: int, tail: bytes) -> None:
    """The nine-byte fast path and the loop give one answer; only the shortest form is taken."""
    def by_the_spec(data: bytes, pos: int) -> tuple[int, int]:
        z = shift = 0
        while True:
            b = data[pos]
            pos += 1
            z |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 63:
                raise span_avro.Unusual
        if z > 0xFFFFFFFFFFFFFFFF or (b == 0 and shift):
            raise span_avro.Unusual
        return (z >> 1) ^ -(z & 1), pos

    for data in (span_avro._long(n) + tail, noise):
        try:
            expected: object = by_the_spec(data, 0)
        except (span_avro.Unusual, IndexError) as exc:
            expected = type(exc)
        try:
            got: object = span_avro._long_at(data, 0)
        except (span_avro.Unusual, IndexError) as exc:
            got = type(exc)
        assert got == expected


# --------------------------------------------------------------------------- the compiled Span writer (native/)


def _generated(d: object) -> bytes | None:
    try:
        return span_avro.write_span(d)  # type: ignore[arg-type]
    except span_avro.Unusual:
        return None


def _compiled(d: object) -> bytes | None:
    assert span_avro.write_span_compiled is not None
    try:
        return span_avro.write_span_compiled(d)  # type: ignore[arg-type]
    except span_avro.Unusual:
        return None


class _Str(str):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


odd = st.sampled_from([True, False, 1.0, 1, -1, 1 << 63, -(1 << 63) - 1, (1 << 63) - 1, -(1 << 63), "\ud800", "é",
                       _Str("s"), b"b", bytearray(b"b"), None, [], (), {}, _Dict(), {"k": 1}, {1: "v"}, ["x"],
                       float("nan"), float("inf"), -0.0])


odd_keys = st.sampled_from([True, 1, 1 << 64, 1.0, "\ud800", _Str("k"), b"b", None, ()])


def _paths(d: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in d.items():
        out.append(prefix + (k,))
        if isinstance(v, dict) and k in ("llm", "reward", "tool"):
            out += _paths(v, prefix + (k,))
    return out


@pytest.fixture
def needs_compiled_writer() -> None:
    if span_avro.write_span_compiled is None:
        missing("the compiled Span writer (rolloutbus_native)", "make native (needs cargo; make setup builds it)")


needs_compiled = pytest.mark.usefixtures("needs_compiled_writer")


@needs_compiled
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(spans)
def test_compiled_writer_same_bytes_as_the_generated_one(d: dict) -> None:
    assert _compiled(d) == span_avro.write_span(d)


@needs_compiled
@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(spans, st.data())
def test_compiled_writer_declines_exactly_where_the_generated_one_does(d: dict, data: st.DataObject) -> None:
    """A value of another type, a subclass, an int over 64 bits, a lone surrogate, a missing field,
    an extra field, anywhere: the same bytes or the same Unusual (fastavro then decides)."""
    d = copy.deepcopy(d)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(d)))
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        op = data.draw(st.sampled_from(["value", "delete", "extra", "map key", "event"]))
        if op == "value":
            parent[path[-1]] = data.draw(odd)
        elif op == "delete":
            del parent[path[-1]]
        elif op == "extra":
            parent["not_in_the_schema"] = data.draw(odd)
        elif op == "map key" and isinstance(d.get("attributes"), dict):
            d["attributes"][data.draw(odd_keys | text)] = data.draw(odd | text)
        elif op == "event" and isinstance(d.get("events"), list):
            d["events"].append(data.draw(odd | st.fixed_dictionaries({"name": text | odd, "time_ns": longs | odd,
                                                                      "attributes": maps | odd})))
    assert _compiled(d) == _generated(d)
    if _compiled(d) is not None:
        assert codec.encode_raw(SPAN, d) == HEADER + ref_write(d)


@needs_compiled
def test_compiled_writer_is_the_codecs_span_writer_and_declines_non_dicts() -> None:
    assert span_avro.WRITERS[SPAN] is span_avro.write_span_compiled
    for value in (None, [], _Dict(BASE), "x"):
        assert _compiled(value) is None and _generated(value) is None
    assert _compiled(BASE) == ref_write(BASE)
