"""The mapping's fast paths against the mapping as it was (``mapping_reference``), on random and hostile spans."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from producers import mapping
from producers.ingest.otlp_decoding import request_to_spans
from schemas.models import UNNUMBERED
from tests.unit.producers import mapping_reference as ref

KEYS = sorted(mapping._PLAIN) + [
    "agentlightning.rollout_id", "agentlightning.attempt_id", "agentlightning.span_sequence_id", "rolloutbus.rollout_id",
    "rolloutbus.attempt_id", "rolloutbus.sequence_id", "agentlightning.reward.0.name", "agentlightning.reward.0.value",
    "agentlightning.reward.1.value", "agentlightning.object.type", "agentlightning.operation.name", "state", "x", "",
]
NAMES = ["state", "tool", "openai.chat.completion", "chat gpt", "text_completion", "langchain.Chain.x", "agentlightning.annotation", ""]
scalar = st.one_of(st.text(max_size=12), st.sampled_from(["", "1", "0", "agent", "reward", "-3", "[1, 2]", '{"a": 1}',
                                                           '{"type": "reward", "value": 0.5}']),
                   st.integers(-3, 2**33), st.booleans(), st.floats(), st.none())
value = scalar | st.lists(scalar, max_size=3) | st.tuples(st.integers(0, 5), st.integers(0, 5))
attrs = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), value, max_size=8)
ids = st.fixed_dictionaries({"agentlightning.rollout_id": st.sampled_from(["ro-1", "", 0, "ro-2"]),
                             "agentlightning.attempt_id": st.sampled_from(["at-1", "", "at-2"]),
                             "agentlightning.span_sequence_id": st.sampled_from([1, 0, -1, "2", 3, True, 2.5, ""])})
events = st.lists(st.tuples(st.sampled_from(["exception", "log", ""]), st.integers(0, 10**18), attrs), max_size=2)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def outcome(fn: Any, **kw: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(**kw)
    except Exception as exc:  # noqa: BLE001 - the same error, type and text, is part of the contract
        return type(exc).__name__, str(exc)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(attrs, ids | st.just({}), st.sampled_from(NAMES), events, attrs | st.none(), st.booleans(),
       st.sampled_from([0, 1, 2, "STATUS_CODE_ERROR", "ok", None]), st.integers(0, 2**63) | st.booleans())
def test_otel_to_span_as_before(a: dict, idd: dict, name: str, evs: list, resource: Any, attributed: bool,
                                status: Any, start: Any) -> None:
    att = mapping.Attribution(rollout_id="ro-x", attempt_id="at-x", sequence_id=UNNUMBERED, agent_name="ag",
                              resource={"r": "1"}) if attributed else None
    ratt = ref.Attribution(rollout_id="ro-x", attempt_id="at-x", sequence_id=UNNUMBERED, agent_name="ag",
                           resource={"r": "1"}) if attributed else None
    kw = dict(name=name, span_id="s", trace_id="t", parent_id=None, start_ns=start, end_ns=5, status_code=status,
              status_message=None, attributes={**a, **idd}, events=evs, resource=resource)
    got, want = outcome(mapping.otel_to_span, **kw, attribution=att), outcome(ref.otel_to_span, **kw, attribution=ratt)
    assert got[0] == want[0] and same(got[1], want[1])
    src = resource if resource else (att.resource if att else {})
    strs = {k: mapping.attr_str(v) for k, v in src.items()}
    got = outcome(mapping.otel_to_span, **kw, attribution=att, resource_strs=strs)
    assert got[0] == want[0] and same(got[1], want[1])


def _set(av: AnyValue, v: Any) -> None:
    if isinstance(v, bool):
        av.bool_value = v
    elif isinstance(v, int):
        av.int_value = v
    elif isinstance(v, float):
        av.double_value = v
    elif isinstance(v, str):
        av.string_value = v
    elif isinstance(v, list):
        av.array_value.SetInParent()
        for x in v:
            _set(av.array_value.values.add(), x)


otlp_scalar = st.one_of(st.text(max_size=10), st.integers(-(2**63), 2**63 - 1), st.booleans(), st.floats(), st.sampled_from(["", "1"]))
# Long lists too: token ids and logprobs (read by the gateway without a call per item), also mixed ones.
long_lists = (st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 200_000), min_size=9, max_size=40)
              | st.lists(st.floats(), min_size=9, max_size=40)
              | st.lists(st.integers(0, 9) | st.floats() | st.text(max_size=2) | st.booleans(), min_size=9, max_size=20))
otlp_attrs = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6),
                             otlp_scalar | st.lists(otlp_scalar, max_size=3) | long_lists, max_size=7)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(otlp_attrs, st.lists(st.tuples(st.sampled_from(NAMES), otlp_attrs, events), max_size=4)), max_size=3))
def test_request_to_spans_as_before(resources: list) -> None:
    req = ExportTraceServiceRequest()
    for res, spans in resources:
        rs = req.resource_spans.add()
        for k, v in res.items():
            kv = rs.resource.attributes.add()
            kv.key = k
            _set(kv.value, v)
        ss = rs.scope_spans.add()
        for i, (name, a, evs) in enumerate(spans):
            s = ss.spans.add()
            s.name, s.span_id, s.trace_id = name, bytes([i + 1] * 8), bytes([7] * 16)
            s.start_time_unix_nano, s.end_time_unix_nano = 10 + i, 20 + i
            for k, v in {**a, "agentlightning.rollout_id": "ro-1", "agentlightning.attempt_id": "at-1"}.items():
                kv = s.attributes.add()
                kv.key = k
                _set(kv.value, v)
            for en, et, _ in evs:
                e = s.events.add()
                e.name, e.time_unix_nano = en, et
    got = request_to_spans(req)
    assert same(got, reference_request_to_spans(req))


def reference_request_to_spans(req: ExportTraceServiceRequest) -> tuple[list, list]:
    """The gateway's loop as it was, over the reference mapping."""
    from producers.ingest.front_door import one_line as _one_line
    from producers.ingest.otlp_decoding import _attrs

    spans: list = []
    errors: list = []
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                attrs = _attrs(s.attributes)
                att = ref.Attribution(resource={k: str(v) for k, v in resource.items()}, sequence_id=UNNUMBERED)
                try:
                    spans.append(ref.otel_to_span(
                        name=s.name, span_id=s.span_id.hex(), trace_id=s.trace_id.hex(),
                        parent_id=s.parent_span_id.hex() or None, start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano, status_code=s.status.code, status_message=s.status.message or None,
                        attributes=attrs, events=[(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events],
                        resource=resource, attribution=att))
                except ref.MappingError as exc:
                    errors.append(f"{s.name}: {exc}")
                except (ArithmeticError, ValueError, TypeError, RecursionError) as exc:
                    errors.append(f"{s.name}: an attribute value cannot be read ({type(exc).__name__}: {_one_line(exc, 200)})")
    return spans, errors
