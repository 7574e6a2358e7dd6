"""The gateway's compiled OTLP mapping (native/, ``rolloutbus_native.otlp_spans``) against the reference
(upb's parse, ``producers.mapping``, ``schemas.codec.encode_raw``): ``map_body`` must give the same
records byte for byte, the same refusals with the same reasons, and the same 400 for a body that is not
a request — on random requests, on hostile bytes, and on the shapes it declines by design. It must also
take the common shapes (else it would be equal by never running)."""

from __future__ import annotations

import struct

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.installs import installed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from producers import mapping
from producers.ingest import otlp_decoding as otlp
from tests.unit.schemas.test_span_avro import hostile

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import bench_paths  # noqa: E402 - the bench's OTLP bodies
import workload  # noqa: E402

native = installed("rolloutbus_native", "make native (needs cargo; make setup builds it)")
COMPILED = otlp._OTLP_COMPILED
PB = "application/x-protobuf"

KEYS = sorted(mapping._PLAIN) + [
    "agentlightning.rollout_id", "agentlightning.attempt_id", "agentlightning.span_sequence_id", "rolloutbus.rollout_id",
    "rolloutbus.attempt_id", "rolloutbus.sequence_id", "agentlightning.reward.0.name", "agentlightning.reward.0.value",
    "agentlightning.reward.1.value", "agentlightning.reward.1.name", "agentlightning.reward.01.value",
    "agentlightning.reward.2.value\n", "agentlightning.reward.x.value", "agentlightning.object.type", "state", "x", "",
]
NAMES = ["state", "tool", "openai.chat.completion", "chat gpt", "text_completion", "langchain.Chain.x", "agentlightning.annotation", ""]
text = st.text(max_size=10) | st.sampled_from(["", "ro-1", "at-1", "\x00\x1f\"\\\u2028é", "[1, 2]", "0.5"])
floats = st.floats() | st.sampled_from([0.0, -0.0, 1e16, 1e15, 1e-5, 1e-4, 0.1, 123456789012345680.0, 5e-324, 1.7976931348623157e308])
scalar = st.one_of(text, st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 2**33), st.booleans(), floats,
                   st.binary(max_size=4), st.none())
common = st.one_of(text, st.integers(-3, 2**33), floats, st.booleans(), st.lists(st.integers(0, 2**32 + 1), max_size=40),
                   st.lists(floats, max_size=20), st.lists(text | st.integers(-(2**63), 2**63 - 1) | st.booleans() | floats | st.none(), max_size=4))
# mostly the values spans carry; also the ones the compiled path leaves to the reference
value = common | common | common | scalar | st.lists(scalar, max_size=12) | \
    st.lists(st.lists(st.integers(0, 3), max_size=2), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2)
attrs = st.lists(st.tuples(st.sampled_from(KEYS) | st.text(max_size=8), value), max_size=10)
res_attrs = st.lists(st.tuples(st.sampled_from(["service.name", "process.pid", "process.command_args", "host.name"]) | st.text(max_size=6),
                               common), max_size=4) | attrs
ids = st.fixed_dictionaries({"agentlightning.rollout_id": st.sampled_from(["ro-1", "", 0, "ro-2"]),
                             "agentlightning.attempt_id": st.sampled_from(["at-1", "", "at-2"]),
                             "agentlightning.span_sequence_id": st.sampled_from([1, 0, -1, "2", 3, True, 2.5, ""])})


def put(kvs: Any, key: str, v: Any) -> None:
    kv = kvs.add()
    kv.key = key
    if v is not None:
        set_value(kv.value, v)
    elif key.startswith("a"):  # a KeyValue whose value is an unset AnyValue, and one without a value at all
        kv.value.SetInParent()


def set_value(av: Any, v: Any) -> None:
    if isinstance(v, bool):
        av.bool_value = v
    elif isinstance(v, int):
        av.int_value = v
    elif isinstance(v, float):
        av.double_value = v
    elif isinstance(v, str):
        av.string_value = v
    elif isinstance(v, bytes):
        av.bytes_value = v
    elif isinstance(v, dict):
        av.kvlist_value.SetInParent()
        for k, x in v.items():
            put(av.kvlist_value.values, k, x)
    else:
        av.array_value.SetInParent()
        for x in v:
            item = av.array_value.values.add()
            if x is not None:
                set_value(item, x)


span_st = st.fixed_dictionaries({
    "name": st.sampled_from(NAMES), "attrs": attrs, "ids": ids | st.just({}), "parent": st.booleans(),
    "status": st.sampled_from([0, 1, 2, 3]), "message": st.sampled_from(["", "boom"]),
    "start": st.integers(0, 2**64 - 1) | st.just(1_700_000_000_000_000_000), "events": st.integers(0, 1),
    "links": st.integers(0, 1) | st.just(0),
})
request_st = st.lists(st.tuples(res_attrs | st.just([]), ids | st.just({}), st.lists(span_st, min_size=1, max_size=4)), min_size=1, max_size=2)


# Spans as agents send them: ids on the span, the keys the compiled path reads with the types they carry,
# other keys with the common types, no key twice.
ID_KEYS = ("agentlightning.rollout_id", "agentlightning.attempt_id", "agentlightning.span_sequence_id")
token_ids = st.lists(st.integers(0, 2**32 - 1), max_size=40)
TYPED = {"prompt_token_ids": token_ids, "response_token_ids": token_ids, "gen_ai.prompt.token_ids": token_ids,
         "response_logprobs": st.lists(floats, max_size=20), "gen_ai.response.model": text, "gen_ai.request.model": text,
         "gen_ai.response.id": text, "gen_ai.response.finish_reasons": st.lists(text, max_size=2) | text,
         "rolloutbus.resource_version": st.integers(-5, 2**40), "gen_ai.tool.name": text, "tool.name": text,
         "gen_ai.tool.call.arguments": common, "tool.result": common, "gen_ai.agent.name": text, "agent.name": text,
         "agentlightning.reward.0.value": floats | st.integers(-5, 5), "agentlightning.reward.0.name": text,
         "agentlightning.reward.1.value": floats | st.integers(-5, 5), "agentlightning.reward.12.name": text}
typed_attr = st.one_of(*(st.tuples(st.just(k), v) for k, v in TYPED.items())) | \
    st.tuples(st.text(max_size=8).filter(lambda k: k not in ID_KEYS and k not in mapping._PLAIN and not k.startswith("agentlightning.")), common)
good_ids = st.fixed_dictionaries({"agentlightning.rollout_id": st.sampled_from(["ro-1", "ro-2"]),
                                  "agentlightning.attempt_id": st.sampled_from(["at-1", "at-2"]),
                                  "agentlightning.span_sequence_id": st.integers(0, 40)})
common_span_st = st.fixed_dictionaries({
    "name": st.sampled_from(NAMES), "attrs": st.lists(typed_attr, max_size=10, unique_by=lambda kv: kv[0]),
    "ids": good_ids, "parent": st.booleans(), "status": st.sampled_from([0, 1, 2]), "message": st.sampled_from(["", "boom"]),
    "start": st.integers(0, 2**63 - 6), "events": st.just(0), "links": st.just(0),
})
common_request_st = st.lists(st.tuples(st.lists(st.tuples(st.text(max_size=6), common), max_size=3, unique_by=lambda kv: kv[0]), st.just({}),
                                       st.lists(common_span_st, min_size=1, max_size=6)), min_size=1, max_size=2)


def build(resources: list) -> bytes:
    req = ExportTraceServiceRequest()
    for res_attrs, res_ids, spans in resources:
        rs = req.resource_spans.add()
        for k, v in [*res_ids.items(), *res_attrs]:
            put(rs.resource.attributes, k, v)
        ss = rs.scope_spans.add()
        ss.scope.name = "test"
        for i, sp in enumerate(spans):
            s = ss.spans.add()
            s.name, s.trace_id, s.span_id = sp["name"], bytes([i]) * 16, bytes([i + 1]) * 8
            if sp["parent"]:
                s.parent_span_id = b"\x07" * 8
            s.start_time_unix_nano, s.end_time_unix_nano = sp["start"], min(sp["start"] + 5, 2**64 - 1)
            for k, v in [*sp["ids"].items(), *sp["attrs"]]:
                put(s.attributes, k, v)
            s.status.code, s.status.message = sp["status"], sp["message"]
            if sp["events"]:
                e = s.events.add()
                e.name, e.time_unix_nano = "exception", 5
            if sp["links"]:
                s.links.add().trace_id = b"\x01" * 16
    return req.SerializeToString()


def outcome(body: bytes, compiled: Any, ctype: str = PB) -> tuple[str, Any]:
    try:
        return "ok", otlp.map_body(body, ctype, compiled=compiled)
    except otlp.BadRequest as exc:
        return "400", str(exc)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request_st)
def test_random_requests_map_as_the_reference_maps_them(resources: list) -> None:
    body = build(resources)
    assert outcome(body, COMPILED) == outcome(body, None)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(common_request_st)
def test_random_common_spans_map_as_the_reference_maps_them(resources: list) -> None:
    body = build(resources)
    assert outcome(body, COMPILED) == outcome(body, None)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request_st | common_request_st, st.data())
def test_hostile_bytes_are_refused_or_mapped_as_the_reference_does(resources: list, data: st.DataObject) -> None:
    body = hostile(build(resources), data)
    assert outcome(body, COMPILED) == outcome(body, None)


def bench_bodies(llm_fraction: float) -> list[bytes]:
    bodies, _ = bench_paths.otlp_bodies(workload.generate(workload.WorkloadSpec(rollouts=40, llm_fraction=llm_fraction)))
    return bodies


@pytest.mark.parametrize("llm_fraction", [0.25, 14 / 16])
def test_the_common_shapes_are_compiled_and_equal(llm_fraction: float) -> None:
    """The bench's workload (messages, LLM calls with 1,000 token ids and logprobs, tools, rewards) and
    ids on the resource (Agent Lightning's exporter): every span compiled, every record the reference's."""
    bodies = bench_bodies(llm_fraction)
    req = ExportTraceServiceRequest()
    req.ParseFromString(bodies[0])
    rs = req.resource_spans[0]
    moved = ExportTraceServiceRequest()
    mrs = moved.resource_spans.add()
    first = rs.scope_spans[0].spans[0]
    for kv in first.attributes:
        if kv.key in ("agentlightning.rollout_id", "agentlightning.attempt_id"):
            mrs.resource.attributes.add().CopyFrom(kv)
    mss = mrs.scope_spans.add()
    for s in rs.scope_spans[0].spans[:16]:  # one rollout's spans
        c = mss.spans.add()
        c.CopyFrom(s)
        del c.attributes[:]
        c.attributes.extend(kv for kv in s.attributes if kv.key not in ("agentlightning.rollout_id", "agentlightning.attempt_id"))
    for body in [*bodies, moved.SerializeToString()]:
        mapped = COMPILED(body)
        assert mapped and all(m is not None for m in mapped)
        assert otlp.map_body(body, PB, compiled=COMPILED) == otlp.map_body(body, PB, compiled=None)
    kinds = {mapping_kind(v) for _k, v, _n in COMPILED(bodies[0])}
    assert {"llm", "tool", "reward", "span"} <= kinds


def mapping_kind(value: bytes) -> str:
    from schemas import codec

    return codec.decode_raw(value)[1]["kind"]


@pytest.mark.parametrize("why, change", [
    ("events", lambda s: setattr(s.events.add(), "name", "exception")),
    ("a reward the AgentOps way", lambda s: put(s.attributes, "agentops.task.output", '{"type": "reward", "value": 1}')),
    ("an explicit kind", lambda s: put(s.attributes, "rolloutbus.kind", "message")),
    ("a token id out of range", lambda s: put(s.attributes, "prompt_token_ids", [1, 2**32])),
    ("a sequence id as text", lambda s: put(s.attributes, "rolloutbus.sequence_id", "3")),
    ("a nested list", lambda s: put(s.attributes, "x", [[1]])),
])
def test_declined_spans_are_the_references(why: str, change: Any) -> None:
    """A span the compiled path declines is mapped (or refused) by the reference, in its place."""
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i in range(3):
        s = ss.spans.add()
        s.name, s.span_id, s.trace_id = f"s{i}", bytes([i + 1]) * 8, b"\x01" * 16
        for k, v in (("rolloutbus.rollout_id", "ro"), ("rolloutbus.attempt_id", "at"), ("rolloutbus.sequence_id", i + 1)):
            put(s.attributes, k, v)
    change(ss.spans[1])
    body = req.SerializeToString()
    mapped = COMPILED(body)
    assert mapped is not None and mapped[1] is None and mapped[0] is not None and mapped[2] is not None, why
    got = otlp.map_body(body, PB, compiled=COMPILED)
    assert got == otlp.map_body(body, PB, compiled=None)
    assert [n for _k, _v, n in got[0]][0] == "s0" and [n for _k, _v, n in got[0]][-1] == "s2"


def test_a_malformed_body_is_upbs_400() -> None:
    body = bench_bodies(0.25)[0]
    for bad in (body[:-3], body + b"\xff", b"\x0a\x05abc"):
        assert COMPILED(bad) is None
        status, reason = outcome(bad, COMPILED)
        assert status == "400" and reason.startswith("body is not an OTLP protobuf ExportTraceServiceRequest")


def test_json_bodies_take_the_reference() -> None:
    body = b'{"resourceSpans": []}'
    assert otlp.map_body(body, "application/json", compiled=COMPILED) == ([], [])


def _ld(field: int, data: bytes) -> bytes:
    """A length-delimited protobuf field, written by hand (protobuf's own writer would merge a repeated oneof)."""
    n, size = bytearray(), len(data)
    while True:
        n.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            break
    return bytes([field << 3 | 2]) + bytes(n) + data


@pytest.mark.parametrize("item, why", [
    (b"\x18\x05", "an int alone: compiled"),
    (b"\x21" + struct.pack("<d", 0.5), "a double alone (not a token id: declined)"),
    (b"\x18\x05\x18\x06", "two ints in one AnyValue: upb keeps the last, the compiled path declines"),
    (b"\x18\x05\x38\x01", "an int and an unknown field"),
    (b"\x18\x85", "an int cut short"),
])
def test_token_id_items_are_read_as_upb_reads_them(item: bytes, why: str) -> None:
    """Token ids are read item by item on a short path (an AnyValue holding one int); every other item
    shape gives the reference's answer."""
    kv = _ld(1, b"prompt_token_ids") + _ld(2, _ld(5, _ld(1, b"\x18\x07") + _ld(1, item)))
    ids = b"".join(_ld(9, _ld(1, k) + _ld(2, _ld(1, v))) for k, v in ((b"rolloutbus.rollout_id", b"ro"), (b"rolloutbus.attempt_id", b"at")))
    span = _ld(1, b"\x01" * 16) + _ld(2, b"\x02" * 8) + _ld(5, b"chat") + ids + _ld(9, kv)
    body = _ld(1, _ld(2, _ld(2, span)))
    assert outcome(body, COMPILED) == outcome(body, None), why
