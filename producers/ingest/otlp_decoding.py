"""OTLP/HTTP trace export bodies → our Avro spans: decoding (protobuf or JSON) and the mapping of each span.

Decoding is opentelemetry-proto's; each span is mapped by :func:`producers.mapping.otel_to_span` (the same
mapping the agent-side span processor uses). A protobuf body goes through the compiled mapping
(``native/``) when it is installed, with this module's Python path as its reference (:func:`map_body`).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtoDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from foundation.errors import EncodeError
from producers.ingest.errors import TOO_DEEP, BadRequest, one_line
from producers.mapping import Attribution, MappingError, otel_to_span
from producers.transport import SPAN
from schemas.codec import encode_raw
from schemas.models import UNNUMBERED

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


def any_value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _hex_ids_to_base64(obj: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping expects base64 for bytes."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id") and isinstance(v, str):
                try:
                    out[k] = base64.b64encode(bytes.fromhex(v)).decode()
                except ValueError:
                    raise BadRequest(f"{k} {v!r} is not hex") from None
            else:
                out[k] = _hex_ids_to_base64(v)
        return out
    if isinstance(obj, list):
        return [_hex_ids_to_base64(x) for x in obj]
    return obj


def decode_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """Bytes → ExportTraceServiceRequest. Raises BadRequest with the reason."""
    req = ExportTraceServiceRequest()
    if content_type.startswith(JSON):
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise BadRequest(f"body is not JSON: {exc}") from exc
        except RecursionError:
            raise BadRequest(TOO_DEEP) from None
        try:
            json_format.ParseDict(_hex_ids_to_base64(data), req, ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError) as exc:
            raise BadRequest(f"JSON is not an OTLP ExportTraceServiceRequest: {one_line(exc)}") from exc
        except RecursionError:  # ids are rewritten and messages parsed recursively
            raise BadRequest(TOO_DEEP) from None
        return req
    if content_type and not content_type.startswith(PROTOBUF):
        raise BadRequest(f"unsupported Content-Type {content_type!r}: use {PROTOBUF} or {JSON}")
    try:
        req.ParseFromString(body)
    except (ProtoDecodeError, RuntimeWarning) as exc:
        raise BadRequest(f"body is not an OTLP protobuf ExportTraceServiceRequest: {exc}") from exc
    return req


def _map_spans(req: ExportTraceServiceRequest, only: set[int] | None = None) -> Any:
    """(index, Avro span dict or None, reason or None) of every span of the request (of those at the
    indices in ``only``), in request order: the reference mapping of an OTLP span.

    A span without a sequence id goes on unnumbered (0): the span stage numbers it in the order the
    attempt's spans arrive on their partition, which stays right with any number of gateway replicas
    (a counter here would give two replicas' spans of one attempt the same ids)."""
    import re

    from producers.mapping import attr_str

    # A serialized ArrayValue whose every item is an AnyValue holding int_value (tag 0x18, a varint),
    # or double_value (tag 0x21, 8 bytes), and nothing else.
    all_ints = re.compile(rb"(?:\x0a[\x02-\x0b]\x18[\x80-\xff]{0,9}[\x00-\x7f])*", re.S)
    all_doubles = re.compile(rb"(?:\x0a\x09\x21.{8})*", re.S)

    def value_of(v: AnyValue) -> Any:
        """any_value, with a list of ints (token ids) read without a recursive call per item."""
        which = v.WhichOneof("value")
        if which == "string_value":
            return v.string_value
        if which == "array_value":
            items = v.array_value.values
            # upb writes each item's one field only, so "every item's field is 3 (int_value)" is a
            # pattern over the serialized array (C speed) instead of a WhichOneof per item.
            if len(items) > 8:
                raw = v.array_value.SerializeToString()
                if all_ints.fullmatch(raw):
                    return [x.int_value for x in items]
                if all_doubles.fullmatch(raw):
                    return [x.double_value for x in items]
        return any_value(v)

    i = -1
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        # Once per resource, not per span: otel_to_span only reads these.
        att = Attribution(resource={k: str(v) for k, v in resource.items()}, sequence_id=UNNUMBERED)
        resource_strs = {k: attr_str(v) for k, v in resource.items()}
        for ss in rs.scope_spans:
            for s in ss.spans:
                i += 1
                if only is not None and i not in only:
                    continue
                attrs = {}
                for kv in s.attributes:
                    attrs[kv.key] = value_of(kv.value)
                try:
                    yield i, otel_to_span(
                        name=s.name,
                        span_id=s.span_id.hex(),
                        trace_id=s.trace_id.hex(),
                        parent_id=s.parent_span_id.hex() or None,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        status_code=s.status.code,
                        status_message=s.status.message or None,
                        attributes=attrs,
                        events=[(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events] if s.events else (),
                        resource=resource,
                        attribution=att,
                        resource_strs=resource_strs,
                    ), None
                except MappingError as exc:
                    yield i, None, f"{s.name}: {exc}"
                except (ArithmeticError, ValueError, TypeError, RecursionError) as exc:
                    # An attribute value the mapping could not take (a token id of 1e999, JSON nested too
                    # deeply in a string): that span is refused and counted, the others go on.
                    yield i, None, f"{s.name}: an attribute value cannot be read ({type(exc).__name__}: {one_line(exc, 200)})"


def request_to_spans(req: ExportTraceServiceRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """Map every span of the request; returns (Avro span dicts, reasons of the rejected ones)."""
    spans: list[dict[str, Any]] = []
    errors: list[str] = []
    for _i, span, error in _map_spans(req):
        if span is not None:
            spans.append(span)
        else:
            errors.append(error)
    return spans, errors


def _encoded(span: dict[str, Any], errors: list[str]) -> tuple[bytes, bytes, str] | None:
    try:
        return span["rollout_id"].encode(), encode_raw(SPAN, span), span["name"]
    except EncodeError as exc:
        errors.append(f"{span['name']}: {exc}")
        return None


def _compiled_otlp() -> Any | None:
    """``rolloutbus_native.otlp_spans`` (native/) when it is installed and built for this ``span.avsc``."""
    from schemas.span_avro import write_span_compiled

    if write_span_compiled is None:  # not installed, or built for another Span schema
        return None
    import rolloutbus_native

    return getattr(rolloutbus_native, "otlp_spans", None)


_OTLP_COMPILED = _compiled_otlp()


def map_body(body: bytes, content_type: str, compiled: Any = _OTLP_COMPILED) -> tuple[list[tuple[bytes, bytes, str]], list[str]]:
    """An export request's body → its spans as (Kafka key, Span record, span name), and the reasons of
    the spans refused. Raises :class:`BadRequest` for a body that is not a request.

    A protobuf body goes through the compiled mapping (native/) when installed: the common spans are
    mapped there in one pass over the bytes; a span it declines (or, when it declines the body, every
    span) is mapped by :func:`_map_spans` from upb's parse, the reference. Order is the request's."""
    mapped = compiled(body) if compiled is not None and (not content_type or content_type.startswith(PROTOBUF)) else None
    errors: list[str] = []
    if mapped is not None:
        missing = {i for i, m in enumerate(mapped) if m is None}
        if not missing:
            return mapped, errors
        fill = {i: (span, error) for i, span, error in _map_spans(decode_request(body, content_type), missing)}
        if fill.keys() == missing:
            out, unwritable = [], []  # the reference's order: the spans it could not map, then those it could not write
            for i, m in enumerate(mapped):
                if m is None:
                    span, error = fill[i]
                    if span is None:
                        errors.append(error)
                        continue
                    m = _encoded(span, unwritable)
                if m is not None:
                    out.append(m)
            return out, errors + unwritable
        errors = []  # the two parses disagree on the spans (never seen): the reference maps them all
    spans, errors = request_to_spans(decode_request(body, content_type))
    return [e for e in (_encoded(s, errors) for s in spans) if e is not None], errors


__all__ = ["decode_request", "request_to_spans", "map_body", "any_value", "BadRequest", "PROTOBUF", "JSON"]
