"""The compiled span decoder (native/, ``rolloutbus_native``) against the Python path, its reference.

For any value the stage consumes, the compiled path (the decoder's view and row head, the stage's
tail; or, where it declines, the Python path) must give what the Python path gives: the same span
view, the same ``spans`` row byte for byte, the same event, the same dead-letter reason and detail.
The decoder must also take the common span (else it would be equal by never running). Random spans,
hostile bytes (flipped, cut, inserted), and the forms it leaves to the reference by design
(duplicate map keys, negative block counts, padded and overlong varints, values the checks refuse).
"""

from __future__ import annotations

import array
import math
import struct
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from tests.installs import installed
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from foundation.errors import DecodeError, ValidationError
from schemas import checks, codec
from schemas.checks import check_span
from schemas.models import MAX_ATTRIBUTE_VALUE_BYTES, MAX_ATTRIBUTES
from streams import rowbinary
from streams import spans_stage as stage_mod
from streams.attempts import PartitionState, span_view
from streams.rollout import Settings
from streams.sink import ClickHouseSink
from tests.unit.schemas.test_span_avro import BASE, hostile, spans

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import bench_paths  # noqa: E402 - its stand-ins for a consumed record and the consumer

native = installed("rolloutbus_native", "make native (needs cargo; make setup builds it)")

SPAN = "rolloutbus.Span"
EVENT = "rolloutbus.RolloutEvent"
HEADER = codec.MAGIC_SINGLE_OBJECT + codec.schema_set().fingerprints[SPAN]
TAIL = (True, 3, 1 << 40, 1_795_000_000_000_000_000)  # late, partition, offset, ingested_ns


def decoder(max_attributes: int = MAX_ATTRIBUTES, max_chars: int = MAX_ATTRIBUTE_VALUE_BYTES) -> Any:
    return native.SpanDecoder(codec.schema_set().fingerprints[SPAN], max_attributes, max_chars,
                              types.SimpleNamespace, array.array)


DECODER = decoder()


def norm(x: Any) -> Any:
    """A comparable form: namespaces as dicts, arrays as (typecode, bytes), floats by their bits."""
    if isinstance(x, types.SimpleNamespace):
        return ("ns", norm(vars(x)))
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items()}, list(x)  # the order too (RowBinary maps follow it)
    if isinstance(x, list):
        return [norm(v) for v in x]
    if isinstance(x, array.array):
        return (x.typecode, x.tobytes())
    if isinstance(x, float):
        return ("f", struct.pack("<d", x))
    if isinstance(x, BaseException):
        return (type(x).__name__, str(x))
    if hasattr(x, "model_dump"):
        return norm(x.model_dump())
    return x


def reference(value: Any) -> tuple:
    """The Python path of SpanStage.poll for one record."""
    try:
        name, d = codec.decode_raw(value, (SPAN, EVENT))
        if name == SPAN:
            check_span(d)
            view = span_view(d)
            return ("span", norm(view), rowbinary.span(view, TAIL[1], TAIL[2], TAIL[0], TAIL[3]))
        return ("event", norm(codec.from_avro(name, d)))
    except (DecodeError, ValidationError) as exc:
        return ("dead letter", stage_mod.dead_letter_reason(exc), str(exc))


def compiled(value: Any, dec: Any = DECODER) -> tuple[tuple, bool]:
    """What the stage does with the decoder in: (its result, whether the decoder took the record)."""
    done = dec.decode_one(value)
    if done is None:
        return reference(value), False
    view, head = done
    return ("span", norm(view), head + rowbinary.span_tail(*TAIL)), True


def valid(d: dict) -> dict:
    """A random span made one the checks pass (the ids set, token fields whole, logprobs <= 0)."""
    d = {**d, "rollout_id": d["rollout_id"] or "r", "attempt_id": d["attempt_id"] or "a", "span_id": d["span_id"] or "s",
         "sequence_id": abs(d["sequence_id"]) >> 1}
    if d["llm"] is not None:
        llm = d["llm"] = dict(d["llm"])
        for key in ("prompt_token_ids", "response_token_ids"):
            llm[key] = llm[key][: len(llm[key]) - len(llm[key]) % 4]
        n = len(llm["response_logprobs"]) // 4
        xs = struct.unpack(f"<{n}f", llm["response_logprobs"][: 4 * n])
        llm["response_logprobs"] = struct.pack(f"<{n}f", *(0.0 if math.isnan(x) else -abs(x) for x in xs))
    if d["reward"] is not None:
        r = d["reward"]
        d["reward"] = {**r, "value": r["value"] if math.isfinite(r["value"]) else 0.5,
                       "dimensions": {k: (x if math.isfinite(x) else 0.0) for k, x in r["dimensions"].items()}}
    return d


# --------------------------------------------------------------------------- random and hostile values


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(spans)
def test_valid_spans_taken_by_the_decoder_and_equal(d: dict) -> None:
    value = codec.encode_raw(SPAN, valid(d))
    got, taken = compiled(value)
    assert taken, "the decoder declined a common span"
    assert got == reference(value)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(spans)
def test_random_spans_equal_also_those_the_checks_refuse(d: dict) -> None:
    value = codec.encode_raw(SPAN, d)
    got, _ = compiled(value)
    assert got == reference(value)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(spans, st.data())
def test_hostile_bytes_equal_outputs_and_reasons(d: dict, data: st.DataObject) -> None:
    """Flipped, cut and inserted bytes anywhere (the header too): same view and row, or same dead letter."""
    value = hostile(codec.encode_raw(SPAN, valid(d) if data.draw(st.booleans()) else d), data)
    got, _ = compiled(value)
    assert got == reference(value)


@given(st.binary(max_size=64) | st.none() | st.just(bytearray(HEADER)) | st.just(memoryview(HEADER + b"\x02")))
def test_not_a_span_at_all(value: Any) -> None:
    assert compiled(value) == (reference(value), False)


def body(d: dict) -> bytes:
    return codec.encode_body(SPAN, d)


def _at(value: bytes, needle: bytes) -> int:
    i = value.find(needle)
    assert i > 0
    return i


@pytest.mark.parametrize("case", [
    "duplicate attribute key", "duplicate resource key", "duplicate event attribute key", "duplicate reward dimension",
    "negative block count", "padded varint", "overlong varint", "ten-byte varint over 64 bits", "bad union index",
    "bad boolean", "trailing byte", "invalid utf-8", "surrogate in utf-8", "empty rollout id", "negative sequence id",
    "token ids not whole", "positive logprob", "NaN logprob", "infinite reward", "NaN reward dimension",
    "old writer schema", "rollout event", "confluent wire format", "too short", "tombstone",
])
def test_forms_left_to_the_reference(case: str) -> None:
    """Each is declined by the decoder and gets the reference's answer (a dead letter, or a result)."""
    d = {**BASE, "attributes": {"a1": "x", "b1": "y"}, "resource": {"r1": "1", "r2": "2"},
         "events": [{"name": "e", "time_ns": 5, "attributes": {"k1": "1", "k2": "2"}}],
         "reward": {"value": 1.0, "primary": "reward", "dimensions": {"d1": 1.0, "d2": 2.0}},
         "tool": {"name": "t", "arguments": "{}", "result": None, "ok": True, "error": None},
         "llm": {"model": "m", "prompt_token_ids": b"\1\0\0\0", "response_token_ids": b"\2\0\0\0",
                 "response_logprobs": struct.pack("<f", -0.5), "response_mask": b"\1", "resource_version": 4,
                 "request_id": None, "finish_reason": "stop"}}
    value = codec.encode_raw(SPAN, d)
    assert compiled(value)[1], "the base span is a common one"
    b = bytearray(value)
    if case.startswith("duplicate"):
        pair = {"duplicate attribute key": (b"\x04a1", b"\x04b1"), "duplicate resource key": (b"\x04r1", b"\x04r2"),
                "duplicate event attribute key": (b"\x04k1", b"\x04k2"),
                "duplicate reward dimension": (b"\x04d1", b"\x04d2")}[case]
        i = _at(value, pair[1])
        b[i:i + 3] = pair[0]
    elif case == "negative block count":  # attributes {a1: x, b1: y} as one block of -2 items with its size
        i = _at(value, b"\x04\x04a1")
        b[i:i + 1] = b"\x03\x14"
    elif case == "padded varint":  # span_id's length in two bytes
        b[10:11] = bytes([b[10] | 0x80, 0])
    elif case == "overlong varint":  # sequence_id in eleven bytes
        i = _at(value, b"\x08ro-1\x08at-1") + 10
        b[i:i + 1] = b"\x86" + b"\x80" * 9 + b"\x00"
    elif case == "ten-byte varint over 64 bits":
        i = _at(value, b"\x08ro-1\x08at-1") + 10
        b[i:i + 1] = b"\x86" + b"\x80" * 8 + b"\x7f"
    elif case == "bad union index":  # parent_id's null as index 2
        i = _at(value, b"\x40" + b"t" * 32) + 33
        b[i] = 4
    elif case == "bad boolean":
        i = _at(value, b"\x02t\x04{}\x00") + 6
        b[i] = 2
    elif case == "trailing byte":
        b += b"\x00"
    elif case == "invalid utf-8":
        i = _at(value, b"\x04a1")
        b[i + 1] = 0xFF
    elif case == "surrogate in utf-8":
        i = _at(value, b"\x16tool.search")
        b[i + 1:i + 4] = b"\xed\xa0\x80"
    elif case == "empty rollout id":
        b = bytearray(codec.encode_raw(SPAN, {**d, "rollout_id": ""}))
    elif case == "negative sequence id":
        b = bytearray(codec.encode_raw(SPAN, {**d, "sequence_id": -1}))
    elif case == "token ids not whole":
        b = bytearray(codec.encode_raw(SPAN, {**d, "llm": {**d["llm"], "prompt_token_ids": b"\1\0\0"}}))
    elif case in ("positive logprob", "NaN logprob"):
        x = 0.5 if case == "positive logprob" else math.nan
        b = bytearray(codec.encode_raw(SPAN, {**d, "llm": {**d["llm"], "response_logprobs": struct.pack("<f", x)}}))
    elif case == "infinite reward":
        b = bytearray(codec.encode_raw(SPAN, {**d, "reward": {**d["reward"], "value": math.inf}}))
    elif case == "NaN reward dimension":
        b = bytearray(codec.encode_raw(SPAN, {**d, "reward": {**d["reward"], "dimensions": {"d": math.nan}}}))
    elif case == "old writer schema":
        ss = codec.schema_set()
        old = next(fp for fp, (name, parsed) in ss.writers.items() if name == SPAN and fp != ss.fingerprints[SPAN])
        b[2:10] = old
    elif case == "rollout event":
        b = bytearray(codec.encode_raw(EVENT, {"rollout_id": "r", "attempt_id": "a", "event": "STARTED", "time_ns": 1,
                                               "task_id": "t", "mode": "train", "attempt": 1, "resource_version": None,
                                               "status": None, "final_reward": None, "span_count": 0, "error": None,
                                               "metadata": {}}))
    elif case == "confluent wire format":
        b[0:2] = b"\x00\x00"
    elif case == "too short":
        b = b[:9]
    got, taken = compiled(None if case == "tombstone" else bytes(b))
    assert not taken
    assert got == reference(None if case == "tombstone" else bytes(b))


@pytest.mark.parametrize(("values", "taken"), [
    ({"a": "é" * 10}, True),  # 20 bytes, 10 characters: within a limit of 10 characters
    ({"a": "é" * 11}, False),
    ({"a": "x" * 11}, False),
    ({str(i): "" for i in range(4)}, True),
    ({str(i): "" for i in range(5)}, False),
])
def test_attribute_limits_count_characters_as_the_checks_do(monkeypatch: pytest.MonkeyPatch, values: dict, taken: bool) -> None:
    monkeypatch.setattr(checks, "MAX_ATTRIBUTES", 4)
    monkeypatch.setattr(checks, "MAX_ATTRIBUTE_VALUE_BYTES", 10)
    dec = decoder(4, 10)
    for field in ("attributes", "resource"):
        value = codec.encode_raw(SPAN, {**BASE, field: values})
        got, was_taken = compiled(value, dec)
        assert was_taken == taken
        assert got == reference(value)


def test_maps_of_many_keys_and_in_several_blocks() -> None:
    attrs = {f"k{i}": f"v{i}" for i in range(40)}
    value = codec.encode_raw(SPAN, {**BASE, "attributes": attrs})
    got, taken = compiled(value)
    assert taken and got == reference(value)
    dup = value.replace(b"\x06k39", b"\x06k38")  # a duplicate among many keys
    got, taken = compiled(dup)
    assert not taken and got == reference(dup)
    # two blocks: {a: 1} then {b: 2}
    i = _at(value, b"\x50\x04k0")
    blocks = value[:i] + b"\x02\x04a1\x02x\x02\x04b1\x02y\x00" + value[value.index(b"\x00", value.index(b"\x06k39") + 6) + 1:]
    got, taken = compiled(blocks)
    assert taken and got == reference(blocks)
    assert got[1][1][0]["attributes"][1] == ["a1", "b1"]


# --------------------------------------------------------------------------- the stage, both ways


def run_stage(values: list[Any], native_on: bool, sunk_below: int = 0) -> tuple:
    """SpanStage.poll over ``values``: its rows, what it produced (dead letters, summaries), its stats."""
    sink = ClickHouseSink(client=None)
    s = stage_mod.SpanStage({"bootstrap.servers": "127.0.0.1:1"}, group="g", spans_topic="rb.spans", done_topic="d",
                            dlq_topic="q", state_topic="c", sink=sink, flush_sink=lambda: None, core=Settings(),
                            native=native_on)
    assert (s.decoder is not None) == native_on
    s.consumer.close()
    s.consumer = bench_paths._Batches([bench_paths._Msg(i, v, b"k") for i, v in enumerate(values)], 7)  # type: ignore[assignment]
    s.parts[0] = PartitionState(0, sunk_below=sunk_below)
    produced: list[tuple] = []
    s._produce = lambda topic, key, value, partition=-1: produced.append((topic, key, value, partition))  # type: ignore[method-assign]
    try:
        while s.poll():
            pass
    finally:
        s._closed = True
    rows = {t: (list(b.encoded), norm(b.rows), b.ranges) for t, b in sink._buffers.items()}
    return rows, produced, s.stats


def workload_values() -> list[Any]:
    def span(rid: str, sid: str, seq: int, **kw: Any) -> bytes:
        return codec.encode_raw(SPAN, {**BASE, "rollout_id": rid, "attempt_id": "a", "span_id": sid, "sequence_id": seq, **kw})

    def event(rid: str, kind: str, count: int = 0) -> bytes:
        return codec.encode_raw(EVENT, {"rollout_id": rid, "attempt_id": "a", "event": kind, "time_ns": 10, "task_id": "t",
                                        "mode": "train", "attempt": 1, "resource_version": None, "status": None,
                                        "final_reward": 1.0 if kind == "FINISHED" else None, "span_count": count,
                                        "error": None, "metadata": {}})

    llm = {"model": "m", "prompt_token_ids": struct.pack("<3I", 1, 2, 3), "response_token_ids": struct.pack("<2I", 4, 5),
           "response_logprobs": struct.pack("<2f", -0.1, -0.2), "response_mask": b"\1\1", "resource_version": None,
           "request_id": None, "finish_reason": "stop"}
    good = span("r1", "s1", 1, kind="llm", llm=llm)
    return [
        event("r1", "STARTED"), good, span("r1", "s2", 0), span("r1", "s3", 0, attributes={"rolloutbus.sequence_by": "x"}),
        good,  # a duplicate span
        b"\xc3\x01garbage!", None, good[:-3], span("", "s9", 1), span("r1", "s4", 5, reward={"value": math.nan,
                                                                                               "primary": "r", "dimensions": {}}),
        span("r2", "x1", 0), event("r1", "FINISHED", 3), span("r1", "s5", 0), span("r1", "s6", 7),  # late, unnumbered or not
        event("r2", "STARTED"), span("r2", "x2", 2, kind="reward", reward={"value": 0.5, "primary": "reward", "dimensions": {}}),
        event("r2", "FINISHED", 2),
    ]


@pytest.mark.parametrize("sunk_below", [0, 6, 100])
def test_stage_with_and_without_the_decoder_writes_and_dead_letters_the_same(monkeypatch: pytest.MonkeyPatch, sunk_below: int) -> None:
    """Rows (spans, rollouts, transitions), numbering, late and replayed spans, dead letters and their
    reasons, summaries and stats: the same with the decoder and without it."""
    monkeypatch.setattr(time, "time_ns", lambda: 1_795_000_000_000_000_000)
    values = workload_values()
    with_native = run_stage(values, True, sunk_below)
    without = run_stage(values, False, sunk_below)
    assert with_native == without
    rows, produced, stats = with_native
    if sunk_below == 0:
        assert stats["dlq"] == 5 and stats["rollouts"] == 2 and stats["late"] == 2
        assert len(rows["spans"][0]) == 8
        reasons = [codec.decode(v).reason for t, _, v, _ in produced if t == "q"]  # type: ignore[attr-defined]
        assert sorted(reasons) == ["decode.invalid", "decode.invalid", "decode.unknown_fingerprint", "validation", "validation"]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(st.lists(spans, min_size=1, max_size=4), st.data())
def test_stage_on_random_and_hostile_streams(monkeypatch: pytest.MonkeyPatch, ds: list[dict], data: st.DataObject) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_795_000_000_000_000_000)
    values: list[Any] = []
    for d in ds:
        d = valid(d) if data.draw(st.booleans()) else d
        d = {**d, "rollout_id": data.draw(st.sampled_from(["r1", "r2", d["rollout_id"]])), "attempt_id": "a"}
        v = bytearray(codec.encode_raw(SPAN, d))
        if data.draw(st.booleans()):
            i = data.draw(st.integers(0, len(v) - 1))
            v[i] = data.draw(st.integers(0, 255))
        values.append(bytes(v))
    assume(values)
    assert run_stage(values, True) == run_stage(values, False)


def test_the_stage_says_once_when_it_runs_the_python_path(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import builtins

    real_import = builtins.__import__

    def no_native(name: str, *a: Any, **kw: Any) -> Any:
        if name == "rolloutbus_native":
            raise ImportError("No module named 'rolloutbus_native'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_native)
    monkeypatch.setattr(stage_mod, "_NATIVE_SAID", False)
    with caplog.at_level("WARNING", logger="rolloutbus.streams"):
        assert stage_mod.native_decoder() is None
        assert stage_mod.native_decoder() is None
    said = [r.getMessage() for r in caplog.records if "compiled decoder" in r.getMessage()]
    assert len(said) == 1 and "Python path" in said[0]


def test_the_decoder_is_for_the_current_span_schema() -> None:
    """span.avsc changed: update native/src/lib.rs (read_span, row_head, SPAN_FINGERPRINT) with it."""
    assert native.SPAN_FINGERPRINT == codec.schema_set().fingerprints[SPAN]
    with pytest.raises(ValueError, match="rebuild native/"):
        native.SpanDecoder(b"\0" * 8, 1, 1, types.SimpleNamespace, array.array)


# --------------------------------------------------------------------------- transitions rows


def _step(**kw: Any) -> Any:
    from streams.transitions import Step

    base = dict(rollout_id="r", attempt_id="a", task_id="t", span_id="s", turn=0, sequence_id=1, agent_name=None,
                resource_version=None, prompt_token_ids=array.array("I", [1, 2]), response_token_ids=array.array("I", [3]),
                response_logprobs=array.array("f", [-0.5]), response_mask=[1], trained=True, reward=0.0, return_=1.0,
                advantage=-0.5)
    return Step(**{**base, **kw})


def _row(fn: Any, step: Any, group: Any, credit: Any, updated: Any) -> Any:
    try:
        return fn(step, group, credit, updated)
    except Exception as exc:  # noqa: BLE001 - compared by type
        return type(exc)


texts = st.text(max_size=40) | st.text(min_size=120, max_size=200)
u32 = st.integers(0, 2**32 - 1)
steps = st.builds(
    _step,
    rollout_id=texts, attempt_id=texts, task_id=texts, span_id=texts, turn=st.integers(0, 2**32 - 1),
    agent_name=st.none() | texts, resource_version=st.none() | st.integers(-(2**63), 2**63 - 1),
    prompt_token_ids=st.lists(u32, max_size=300).map(lambda x: array.array("I", x)),
    response_token_ids=st.lists(u32, max_size=40).map(lambda x: array.array("I", x)),
    response_logprobs=st.lists(st.floats(width=32), max_size=40).map(lambda x: array.array("f", x)),
    response_mask=st.lists(st.integers(0, 255), max_size=40), trained=st.booleans(),
    reward=st.floats(), return_=st.floats(), advantage=st.floats(),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(steps, texts, texts, st.integers(-(2**63), 2**63 - 1))
def test_transition_rows_compiled_as_the_reference(step: Any, group: str, credit: str, updated: int) -> None:
    assert native.transition_row(step, group, credit, updated) is not None, "the common step was declined"
    assert rowbinary.transition(step, group, credit, updated) == rowbinary.transition_reference(step, group, credit, updated)


class _Str(str):
    pass


odd_values = st.sampled_from([True, 1, -1, 2**32, 2**63, 1.5, "x", _Str("s"), None, b"b",
                              [1, 2], [256], [True], [-1], [1.0], (1,), array.array("I", [1]), array.array("i", [1]),
                              array.array("f", [1.0]), array.array("B", [1]), array.array("d", [1.0]), bytearray(b"\1")])


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(steps, st.data())
def test_transition_rows_hostile_values_declined_or_equal(step: Any, data: st.DataObject) -> None:
    """Another type anywhere (a subclass, a bool for an int, a list for an array, an array of another
    typecode, a value out of range): the same row, or the same error, as the reference."""
    fields = ["rollout_id", "attempt_id", "turn", "task_id", "span_id", "agent_name", "resource_version",
              "prompt_token_ids", "response_token_ids", "response_logprobs", "response_mask", "trained", "reward",
              "return_", "advantage"]
    for _ in range(data.draw(st.integers(1, 2))):
        setattr(step, data.draw(st.sampled_from(fields)), data.draw(odd_values))
    group, credit, updated = data.draw(texts | odd_values), data.draw(texts | odd_values), data.draw(st.integers(-(2**63), 2**63 - 1) | odd_values)
    assert _row(rowbinary.transition, step, group, credit, updated) == _row(rowbinary.transition_reference, step, group, credit, updated)
