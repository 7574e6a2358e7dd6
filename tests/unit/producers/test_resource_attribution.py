"""Rollout ids on the OTel Resource (where Agent Lightning's OTLP exporter puts them) attribute spans,
through the mapping, the gateway's request decoding (protobuf, JSON) and the in-process exporter."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from google.protobuf import json_format

from producers.ingest.otlp_decoding import decode_request, request_to_spans
from producers.mapping import MappingError, otel_to_span, span_ids
from producers.otel import RolloutSpanExporter, readable_to_avro
from test_context_emit import Recorder

RES = {"service.name": "agl", "agentlightning.rollout_id": "ro-res", "agentlightning.attempt_id": "at-res",
       "agentlightning.span_sequence_id": "5"}


def _map(attrs: dict[str, Any], resource: dict[str, Any] | None) -> dict[str, Any]:
    return otel_to_span(name="s", span_id="00" * 8, trace_id="11" * 16, parent_id=None, start_ns=1, end_ns=2,
                        attributes=attrs, resource=resource)


def test_ids_on_the_resource_attribute_the_span() -> None:
    s = _map({"x": 1}, RES)
    assert (s["rollout_id"], s["attempt_id"], s["sequence_id"]) == ("ro-res", "at-res", 5)
    assert s["resource"]["service.name"] == "agl"


def test_the_span_s_own_ids_win_over_the_resource() -> None:
    s = _map({"agentlightning.rollout_id": "ro-span", "agentlightning.attempt_id": "at-span",
              "agentlightning.span_sequence_id": 9}, RES)
    assert (s["rollout_id"], s["attempt_id"], s["sequence_id"]) == ("ro-span", "at-span", 9)
    assert span_ids({"agentlightning.span_sequence_id": 2}, RES) == ("ro-res", "at-res", 2)


def test_no_ids_anywhere_is_refused_with_a_reason() -> None:
    with pytest.raises(MappingError, match="resource"):
        _map({"x": 1}, {"service.name": "x"})


def _sdk_request(resource: dict[str, Any], spans: list[tuple[str, dict[str, Any]]]) -> Any:
    """Real SDK spans encoded the way the stock OTLP exporter encodes them."""
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("t")
    for name, attrs in spans:
        with tracer.start_as_current_span(name, attributes=attrs):
            pass
    return encode_spans(mem.get_finished_spans())


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_gateway_reads_ids_from_the_resource(encoding: str) -> None:
    res = {k: v for k, v in RES.items() if k != "agentlightning.span_sequence_id"}
    req = _sdk_request(res, [("openai.chat.completion", {"gen_ai.request.model": "m", "prompt_token_ids": [1],
                                                         "response_token_ids": [2]}),
                             ("tool", {"gen_ai.tool.name": "calc"}),
                             ("mine", {"agentlightning.span_sequence_id": 7})])
    if encoding == "protobuf":
        body, ctype = req.SerializeToString(), "application/x-protobuf"
    else:
        # OTLP/JSON writes ids as hex; protobuf's JSON mapping writes base64.
        d = json_format.MessageToDict(req)
        for rs in d["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for k in ("traceId", "spanId", "parentSpanId"):
                        if k in sp:
                            sp[k] = __import__("base64").b64decode(sp[k]).hex()
        body, ctype = json.dumps(d).encode(), "application/json"
    spans, errors = request_to_spans(decode_request(body, ctype))
    assert errors == []
    # spans without a sequence id go on unnumbered (0): the span stage numbers them
    assert [(s["rollout_id"], s["attempt_id"], s["sequence_id"], s["kind"]) for s in spans] == [
        ("ro-res", "at-res", 0, "llm"), ("ro-res", "at-res", 0, "tool"), ("ro-res", "at-res", 7, "span")]


def test_gateway_resource_sequence_id_is_used() -> None:
    spans, errors = request_to_spans(_sdk_request(RES, [("a", {})]))
    assert errors == [] and spans[0]["sequence_id"] == 5


def test_in_process_exporter_reads_the_resource() -> None:
    rec = Recorder()
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(RES))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    with provider.get_tracer("t").start_as_current_span("x"):
        pass
    [span] = mem.get_finished_spans()
    assert readable_to_avro(span)["rollout_id"] == "ro-res"
    exp = RolloutSpanExporter(rec)  # type: ignore[arg-type]
    exp.export([span])
    assert [s.rollout_id for s in rec.spans()] == ["ro-res"] and exp.unattributed == 0
