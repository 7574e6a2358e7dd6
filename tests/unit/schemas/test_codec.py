"""The Avro contract: round trips, wire formats, evolution and the errors bad bytes give."""

from __future__ import annotations

from typing import Any

import io
import json
import math
import struct

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import DecodeError, ValidationError
from schemas import (
    DeadLetter,
    GroupBatch,
    LLMCall,
    ResourceVersion,
    Reward,
    RolloutEvent,
    RolloutEventType,
    Span,
    SpanEvent,
    Task,
    ToolCall,
    TrainStep,
    Transition,
    decode,
    decode_confluent,
    decode_raw,
    encode,
    encode_confluent,
    schema_set,
)
from schemas.codec import SCHEMA_DIR, crc64_avro, fingerprint

SPAN = Span(
    span_id="00f067aa0ba902b7",
    trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
    parent_id=None,
    rollout_id="ro-1",
    attempt_id="at-1",
    sequence_id=3,
    name="chat",
    kind="llm",
    start_time_ns=1_700_000_000_000_000_000,
    end_time_ns=1_700_000_000_500_000_000,
    status_code="OK",
    attributes={"gen_ai.system": "vllm", "n": "3"},
    events=[SpanEvent(name="first_token", time_ns=1_700_000_000_100_000_000, attributes={"a": "b"})],
    resource={"service.name": "calc-agent"},
    llm=LLMCall(
        model="tiny",
        prompt_token_ids=[1, 2, 3, 4_000_000_000],
        response_token_ids=[5, 6],
        response_logprobs=[-0.5, -1.25],
        response_mask=[1, 1],
        resource_version=7,
    ),
    reward=Reward(value=0.5, primary="accuracy", dimensions={"accuracy": 0.5, "format": 1.0}),
    tool=ToolCall(name="calculator", arguments='{"expr": "1+1"}', result="2", ok=True),
    agent_name="solver",
)

TRANSITION = Transition(
    rollout_id="ro-1", attempt_id="at-1", task_id="t-1", span_id="00f067aa0ba902b7", turn=0,
    agent_name="solver", resource_version=2, prompt_token_ids=[1, 2], response_token_ids=[3],
    response_logprobs=[-0.25], response_mask=[1], reward=0.0, return_=1.0, advantage=0.7071,
)

EXAMPLES = [
    SPAN,
    Span(span_id="a", trace_id="b", rollout_id="r", attempt_id="a", sequence_id=0, name="n", start_time_ns=0, end_time_ns=0),
    RolloutEvent(rollout_id="r", attempt_id="a", event=RolloutEventType.FINISHED, time_ns=5, task_id="t",
                 status="succeeded", final_reward=1.0, span_count=4, resource_version=3),
    Task(task_id="t-1", input=json.dumps({"question": "2+2"}), group_size=4, metadata={"split": "train"}),
    TRANSITION,
    GroupBatch(group_id="t-1@2", task_id="t-1", resource_version=2, created_ns=9, group_size=2,
               rollout_ids=["ro-1", "ro-2"], rewards=[1.0, 0.0], advantages=[0.7071, -0.7071], transitions=[TRANSITION]),
    ResourceVersion(name="policy", version=3, uri="file:///ckpt/3", base_model="tiny", step=12, created_ns=1,
                    metrics={"loss": 0.25}, config={"endpoint": "http://127.0.0.1:8000/v1"}),
    TrainStep(run_id="run", step=1, time_ns=1, resource_version=2, group_ids=["g"], metrics={"loss": 0.1}),
    DeadLetter(source_topic="rb.spans", partition=1, offset=9, key=b"k", value=b"\x00\x01", reason="decode.truncated",
               detail="ends early", stage="streams", time_ns=1),
]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: type(r).__name__)
def test_every_schema_round_trips(record: object) -> None:
    data = encode(record)  # type: ignore[arg-type]
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == schema_set().fingerprints[record.schema_name]  # type: ignore[attr-defined]
    assert decode(data) == record


def test_crc64_avro_matches_the_spec_vector() -> None:
    # The Avro specification's fingerprint of the schema "null".
    assert crc64_avro(b'"null"') == 0x63DD24E7CC258F8A


def test_fingerprint_is_that_of_the_parsing_canonical_form() -> None:
    schema = json.loads((SCHEMA_DIR / "task.avsc").read_text())
    assert schema_set().fingerprints["rolloutbus.Task"] == fingerprint(schema)
    # whitespace and docs do not change it
    schema["doc"] = "something else"
    assert fingerprint(schema) == schema_set().fingerprints["rolloutbus.Task"]


def test_token_ids_are_packed_uint32_on_the_wire() -> None:
    _, raw = decode_raw(encode(SPAN))
    assert raw["llm"]["prompt_token_ids"] == struct.pack("<4I", 1, 2, 3, 4_000_000_000)
    assert raw["llm"]["response_logprobs"] == struct.pack("<2f", -0.5, -1.25)


def test_confluent_wire_format_round_trip() -> None:
    data = encode_confluent(SPAN, 42)
    assert data[:5] == b"\x00\x00\x00\x00\x2a"
    assert decode_confluent(data, {42: "rolloutbus.Span"}.__getitem__) == SPAN
    with pytest.raises(DecodeError, match="unknown schema id 41"):
        decode_confluent(b"\x00\x00\x00\x00\x29" + data[5:], {42: "rolloutbus.Span"}.__getitem__)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "too short"),
        (b"\xc3\x01\x00", "too short"),
        (b"hello world, not avro", "bad marker"),
        (b"\xc3\x01" + b"\xff" * 8 + b"\x02", "unknown schema fingerprint"),
        (encode(SPAN)[:40], "truncated"),
        (encode(SPAN) + b"\x00\x00", "trailing bytes"),
        (b"\x00\x00\x00\x00\x01abcdefgh", "Confluent wire format"),
    ],
)
def test_bad_bytes_give_the_decode_error(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode(data)


def test_wrong_type_under_a_known_fingerprint_is_a_decode_error() -> None:
    # A Task body behind the Span fingerprint: it must not come out as a Span.
    body = encode(EXAMPLES[3])[10:]
    with pytest.raises(DecodeError):
        decode(b"\xc3\x01" + schema_set().fingerprints["rolloutbus.Span"] + body)


def test_expect_rejects_another_record_type() -> None:
    with pytest.raises(DecodeError, match="expected rolloutbus.Task"):
        decode(encode(SPAN), expect="rolloutbus.Task")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.__setattr__("sequence_id", -1), "sequence_id"),
        (lambda s: s.__setattr__("reward", Reward.model_construct(value=math.nan, primary="r", dimensions={})), "finite"),
        (lambda s: s.__setattr__("attributes", {str(i): "x" for i in range(5000)}), "attributes"),
    ],
)
def test_impossible_values_are_a_validation_error(mutate: object, message: str) -> None:
    span = SPAN.model_copy(deep=True)
    mutate(span)  # type: ignore[operator]
    with pytest.raises(ValidationError, match=message):
        decode(encode(span))


def test_logprobs_above_zero_are_rejected() -> None:
    bad = SPAN.model_copy(deep=True)
    bad.llm = LLMCall.model_construct(**{**SPAN.llm.model_dump(), "response_logprobs": [0.5, -1.0]})  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="log-probabilities"):
        decode(encode(bad))


# ------------------------------------------------------------------ evolution


def _v1_schema() -> dict:
    return json.loads((SCHEMA_DIR / "history" / "span.v1.avsc").read_text())


def test_new_reader_reads_old_data() -> None:
    """Data from a producer on span v1 (no agent_name) decodes with the current reader."""
    v1 = _v1_schema()
    record = encode(SPAN)
    _, current = decode_raw(record)
    current.pop("agent_name")
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(v1), current)
    old_bytes = b"\xc3\x01" + fingerprint(v1) + buf.getvalue()
    decoded = decode(old_bytes)
    assert isinstance(decoded, Span)
    assert decoded.agent_name is None
    assert decoded.model_copy(update={"agent_name": "solver"}) == SPAN


def test_old_reader_reads_new_data() -> None:
    """A consumer still on span v1 reads what the current producers write (the added field is skipped)."""
    v1 = fastavro.parse_schema(_v1_schema())
    data = encode(SPAN)
    current = schema_set().parsed["rolloutbus.Span"]
    out = fastavro.schemaless_reader(io.BytesIO(data[10:]), current, v1)
    assert "agent_name" not in out
    assert out["span_id"] == SPAN.span_id and out["sequence_id"] == SPAN.sequence_id


# ------------------------------------------------------------------ property-based

_text = st.text(max_size=20)
_ids = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=50)


@settings(max_examples=150, deadline=None)
@given(
    seq=st.integers(min_value=0, max_value=2**62),
    name=_text,
    attrs=st.dictionaries(_text, _text, max_size=5),
    prompt=_ids,
    response=_ids,
    reward=st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
)
def test_span_round_trip_property(seq: int, name: str, attrs: dict, prompt: list, response: list, reward: float | None) -> None:
    span = Span(
        span_id="s", trace_id="t", rollout_id="r", attempt_id="a", sequence_id=seq, name=name, kind="llm",
        start_time_ns=0, end_time_ns=1, attributes=attrs,
        llm=LLMCall(prompt_token_ids=prompt, response_token_ids=response,
                    response_logprobs=[-1.0] * len(response)),
        reward=None if reward is None else Reward(value=reward),
    )
    assert decode(encode(span)) == span


def _a_record_or_a_reason(data: bytes) -> Any:
    """Bad bytes either decode to a well-formed record of the schema (its re-encoding reads back equal) or raise one of
    the project's errors with a reason the dead letter can carry; anything else escapes and fails the test."""
    try:
        got = decode(data)
    except (DecodeError, ValidationError) as exc:
        assert str(exc).strip(), "a refusal names its reason"
        return None
    assert decode(encode(got)) == got, "what decoded is a well-formed record"
    return got


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_a_library_error(data: bytes) -> None:
    got = _a_record_or_a_reason(data)
    if not data.startswith(b"\xc3\x01"):  # without the single-object marker nothing is a record
        assert got is None


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=10, max_value=400), st.integers(min_value=0, max_value=255), st.data())
def test_corrupted_records_never_escape_as_a_library_error(cut: int, byte: int, data: st.DataObject) -> None:
    whole = encode(data.draw(st.sampled_from(EXAMPLES)))
    raw = bytearray(whole)
    pos = data.draw(st.integers(min_value=10, max_value=len(raw) - 1))
    raw[pos] = byte
    _a_record_or_a_reason(bytes(raw))
    _a_record_or_a_reason(bytes(raw[:cut]))
    if cut < len(whole):  # a record cut short is refused, never read as a shorter one
        assert _a_record_or_a_reason(whole[:cut]) is None
