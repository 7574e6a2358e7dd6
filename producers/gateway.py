"""OTLP/HTTP ingest gateway: ``POST /v1/traces`` (protobuf or JSON, gzip) → Avro spans on rb.spans.

Agent Lightning 0.3's LightningStore API, the calls of an attempt (``/v1/agl/...``,
:mod:`producers.agl_store_http`), and Agent Lightning 1.x agents' event URL too: ``POST /api/rollouts/{rollout_id}/attempt/{attempt_id}/events``
with ``{"event_type", "data"}`` becomes one span (:mod:`producers.agl_events`); the reply is the stored
event, as its store answers (422 with the reason for a body that is not an event).

Answers as the OTLP spec asks: 200 with ``partial_success.rejected_spans`` for spans that cannot be
ours, 400 with a reason for undecodable bodies, 413 over the size limit, 503 + ``Retry-After`` when
Kafka is down and the spool is full, 401 without the configured bearer token. ``/healthz`` and
Prometheus ``/metrics`` too. Decoding is opentelemetry-proto's; the mapping is :mod:`producers.mapping`.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import time
import zlib
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtoDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from producers.agl_events import EVENT_PATH, event_to_span
from producers.agl_api_http import AgentLightning1Routes
from producers.agl_store_http import LightningStoreRoutes, Resources
from producers.context import new_span_id
from producers.gateway_auth import CHALLENGE, REFUSED, authorized
from producers.mapping import Attribution, MappingError, otel_to_span
from producers.spool import FRAME_OVERHEAD
from producers.transport import SPAN, SpanTransport
from schemas.codec import encode_raw
from schemas.models import UNNUMBERED
from foundation.errors import EncodeError

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


TOO_DEEP = "body is nested too deeply: JSON arrays and objects may nest a few hundred levels at most"


class BadRequest(ValueError):
    """The body is not an OTLP trace export request."""


class BodyTooLarge(BadRequest):
    """The body, decompressed, is over the gateway's limit."""


class UnsupportedEncoding(BadRequest):
    """A Content-Encoding the gateway does not decode."""


# The gateway decodes Content-Encoding itself (:func:`inflate`): aiohttp's own decoding takes a truncated
# gzip body without a word, and spans cut off with it would be lost with a 200. Serve ``Gateway.app()``
# with these options (``web.run_app(app, **SERVER_OPTIONS)``).
SERVER_OPTIONS: dict[str, Any] = {"auto_decompress": False}
ENCODINGS = ("gzip", "x-gzip", "deflate")


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A body as sent with ``Content-Encoding: encoding`` → its bytes, at most ``limit`` of them.

    Strict: a body that is not that encoding, is cut short or has bytes after its end raises
    :class:`BadRequest`; over ``limit`` :class:`BodyTooLarge`; an encoding other than gzip, deflate or
    identity :class:`UnsupportedEncoding`. Several gzip members are read one after another (RFC 1952)."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ENCODINGS:
        raise UnsupportedEncoding(f"unsupported Content-Encoding {encoding[:40]!r}: use gzip, deflate or none")
    if enc == "deflate":
        wbits = zlib.MAX_WBITS if body[:1] and body[0] & 0x0F == 8 else -zlib.MAX_WBITS  # zlib, or bare deflate as some send
    elif body[:2] != b"\x1f\x8b":
        raise BadRequest(f"Content-Encoding is {enc} but the body is not {enc}")
    else:
        wbits = 16 + zlib.MAX_WBITS
    out = bytearray()
    rest = body
    try:
        while rest:
            d = zlib.decompressobj(wbits)
            out += d.decompress(rest, limit + 1 - len(out))
            if len(out) > limit:
                raise BodyTooLarge(f"decompressed body is over the limit of {limit} bytes")
            if not d.eof:
                raise BadRequest(f"the {enc} body is cut short (its end is missing)")
            rest = d.unused_data
            if rest and enc == "deflate":
                raise BadRequest(f"{len(rest)} bytes after the end of the deflate body")
    except zlib.error as exc:
        raise BadRequest(f"body is not valid {enc}: {exc}") from exc
    return bytes(out)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value (use null or a number)")


def _one_line(exc: BaseException, limit: int = 500) -> str:
    return " ".join(str(exc).split())[:limit]


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
            raise BadRequest(f"JSON is not an OTLP ExportTraceServiceRequest: {_one_line(exc)}") from exc
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
                    yield i, None, f"{s.name}: an attribute value cannot be read ({type(exc).__name__}: {_one_line(exc, 200)})"


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


class Gateway:
    """The aiohttp application around one span transport."""

    def __init__(
        self,
        transport: SpanTransport,
        *,
        max_body_bytes: int = 16 << 20,
        token: str | None = None,
        retry_after_s: int = 5,
        resources: Resources | None = None,
        metrics_token: str | None = None,
    ) -> None:
        """``metrics_token``: the bearer token ``/metrics`` needs (the command passes the gateway's token when it
        listens beyond loopback; on loopback only this machine's processes can reach it)."""
        self.transport = transport
        # Agent Lightning's own APIs, one rb.resources reader for both: 0.3's store (producers/agl_store_http.py)
        # and 1.x's server (producers/agl_api_http.py)
        resources = resources or dict
        self.agl_store = LightningStoreRoutes(transport, resources, token=token, retry_after_s=retry_after_s,
                                              max_body_bytes=max_body_bytes)
        self.agl1_api = AgentLightning1Routes(transport, resources, token=token, retry_after_s=retry_after_s,
                                              max_body_bytes=max_body_bytes)
        self.max_body_bytes = max_body_bytes
        if _OTLP_COMPILED is None:
            log.warning("gateway: the compiled OTLP mapping is not installed; spans take the Python path, about ten "
                        "times the CPU per span (make setup builds it with cargo: see native/README.md)")
        self.token = token
        self.metrics_token = metrics_token
        self.retry_after_s = retry_after_s
        self.registry = CollectorRegistry()
        self.m_requests = Counter("rolloutbus_gateway_requests", "OTLP requests by HTTP status", ["code"], registry=self.registry)
        self.m_spans = Counter("rolloutbus_gateway_spans_accepted", "Spans accepted onto rb.spans", registry=self.registry)
        self.m_rejected = Counter("rolloutbus_gateway_spans_rejected", "Spans rejected (partial success)", registry=self.registry)
        g = Gauge("rolloutbus_gateway_spool_pending", "Records in the spool not yet delivered", registry=self.registry)
        g.set_function(lambda: self.transport.stats()["spool_pending"])
        up = Gauge("rolloutbus_gateway_kafka_up", "1 when the last Kafka contact succeeded", registry=self.registry)
        up.set_function(lambda: 1.0 if self.transport.kafka_up else 0.0)

    def app(self) -> web.Application:
        # The body limit is checked by hand (after gzip too); aiohttp's own limit sits just above it.
        app = web.Application(client_max_size=self.max_body_bytes + 1, middlewares=[self._guard])
        app.router.add_post("/v1/traces", self.traces)
        app.router.add_post(EVENT_PATH, self.agl_event)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/livez", self.livez)
        app.router.add_get("/metrics", self.metrics)
        self.agl_store.add_to(app)
        self.agl1_api.add_to(app)  # after the events route: its /api catch-all answers 501 naming the call
        return app

    def _refuse(self, request: web.Request, status: int, reason: str) -> web.Response:
        """An error answer in the route's shape: Agent Lightning's routes answer ``{"detail": ...}``."""
        self.m_requests.labels(str(status)).inc()
        headers = CHALLENGE if status == 401 else None
        if request.path.startswith(("/v1/agl/", "/api/")):
            return web.json_response({"detail": reason}, status=status, headers=headers)
        return web.Response(status=status, text=reason, headers=headers)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """For every route: the body's Content-Encoding decoded (strictly, see :func:`inflate`) before the
        handler reads it; a body nested beyond Python's recursion limit (``/v1/agl`` decodes its own JSON)
        answered 400 with the reason, never 500."""
        try:
            given = request.headers.get("Authorization", "").encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 (aiohttp keeps them as surrogates): no token of ours
            return self._refuse(request, 401, REFUSED)
        encoding = request.headers.get("Content-Encoding", "")
        if encoding.strip().lower() not in ("", "identity") and request.body_exists:
            # Every route that takes a body needs the token: without it, nothing is decompressed for the caller.
            if self.token is not None and not authorized(given, self.token):
                return self._refuse(request, 401, REFUSED)
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return self._refuse(request, 413, f"body is over the limit of {self.max_body_bytes} bytes")
            except RequestPayloadError as exc:
                return self._refuse(request, 400, f"body cannot be read: {_one_line(exc)}")
            try:
                # What request.read() answers from now on: the handlers (and /v1/agl's) read the decoded body.
                request._read_bytes = inflate(raw, encoding, self.max_body_bytes)
            except UnsupportedEncoding as exc:
                return self._refuse(request, 415, str(exc))
            except BodyTooLarge as exc:
                return self._refuse(request, 413, str(exc))
            except BadRequest as exc:
                return self._refuse(request, 400, str(exc))
        try:
            return await handler(request)
        except RecursionError:
            return self._refuse(request, 400, TOO_DEEP)

    def _reply(self, status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
        self.m_requests.labels(str(status)).inc()
        return web.Response(status=status, text=text, headers=headers)

    async def traces(self, request: web.Request) -> web.Response:
        if self.token is not None and not authorized(request.headers.get("Authorization", ""), self.token):
            return self._reply(401, REFUSED, CHALLENGE)
        if not self.transport.accepting():
            return self._reply(503, "Kafka is unreachable and the local spool is full; retry later",
                               {"Retry-After": str(self.retry_after_s)})
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return self._reply(413, f"body of {request.content_length} bytes is over the limit of {self.max_body_bytes}")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._reply(413, f"body is over the limit of {self.max_body_bytes} bytes")
        except RequestPayloadError as exc:
            return self._reply(400, f"body cannot be read: {_one_line(exc)}")
        # Content-Encoding is decoded already (the _guard middleware).
        ctype = request.headers.get("Content-Type", PROTOBUF).split(";")[0].strip().lower()
        try:
            encoded, errors = map_body(body, ctype)
        except BadRequest as exc:
            return self._reply(400, str(exc))
        # Kafka down: accept only what the spool can keep (frame overhead included), all or nothing.
        if not self.transport.accepting(sum(len(k) + len(v) + FRAME_OVERHEAD for k, v, _ in encoded)):
            return self._reply(503, "Kafka is unreachable and the local spool is full; retry later",
                               {"Retry-After": str(self.retry_after_s)})
        accepted = self.transport.emit_encoded_many([(key, value) for key, value, _name in encoded])
        errors.extend(f"{name}: local queue full" for _key, _value, name in encoded[accepted:])
        self.m_spans.inc(accepted)
        if errors:
            self.m_rejected.inc(len(errors))
            log.info("gateway rejected %d spans: %s", len(errors), errors[0])
        resp = ExportTraceServiceResponse()
        if errors:
            resp.partial_success.rejected_spans = len(errors)
            resp.partial_success.error_message = "; ".join(errors[:5])[:2000]
        self.m_requests.labels("200").inc()
        if ctype.startswith(JSON):
            return web.Response(status=200, text=json_format.MessageToJson(resp), content_type=JSON)
        return web.Response(status=200, body=resp.SerializeToString(), content_type=PROTOBUF)

    async def agl_event(self, request: web.Request) -> web.Response:
        """One Agent Lightning 1.x event (its ``AGL_EVENT_URL``) → one span on rb.spans."""
        if self.token is not None and not authorized(request.headers.get("Authorization", ""), self.token):
            return self._reply(401, REFUSED, CHALLENGE)
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return self._reply(413, f"body of {request.content_length} bytes is over the limit of {self.max_body_bytes}")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._reply(413, f"body is over the limit of {self.max_body_bytes} bytes")
        except RequestPayloadError as exc:
            return self._reply(400, f"body cannot be read: {_one_line(exc)}")
        try:
            # NaN and Infinity are not JSON: kept, they would go back in the reply and on the span as text no
            # strict reader takes.
            event = json.loads(body, parse_constant=_not_json)
        except ValueError as exc:
            return self._reply(400, f"body is not JSON: {_one_line(exc)}")
        except RecursionError:
            return self._reply(400, TOO_DEEP)
        rollout_id, attempt_id = request.match_info["rollout_id"], request.match_info["attempt_id"]
        now = time.time_ns()
        try:
            # Unnumbered: the span stage numbers the attempt's events in arrival order (as Agent Lightning's
            # store keeps events in insertion order), whichever replica each came through.
            span = event_to_span(rollout_id, attempt_id, event, sequence_id=UNNUMBERED, span_id=new_span_id(), time_ns=now)
            value = encode_raw(SPAN, span)
        except (MappingError, EncodeError) as exc:
            self.m_rejected.inc()
            return self._reply(422, f"not an Agent Lightning event: {exc}")
        if not self.transport.accepting(len(rollout_id.encode()) + len(value) + FRAME_OVERHEAD):
            return self._reply(503, "Kafka is unreachable and the local spool is full; retry later",
                               {"Retry-After": str(self.retry_after_s)})
        if not self.transport.emit_encoded(rollout_id.encode(), value):
            return self._reply(503, "the local queue is full; retry later", {"Retry-After": str(self.retry_after_s)})
        self.m_spans.inc()
        self.m_requests.labels("200").inc()
        return web.json_response({"event_type": event["event_type"], "rollout_id": rollout_id, "attempt_id": attempt_id,
                                  "timestamp": now / 1e9, "data": event.get("data") or {}})

    async def livez(self, request: web.Request) -> web.Response:
        """Liveness: 200 ``ok`` while the server answers, Kafka or not; nothing else (no token needed, nothing told)."""
        return web.Response(text="ok\n")

    async def healthz(self, request: web.Request) -> web.Response:
        stats = self.transport.stats()
        ok = self.transport.accepting()
        return web.json_response({"status": "ok" if ok else "degraded", **stats}, status=200 if ok else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        if self.metrics_token is not None:
            if not authorized(request.headers.get("Authorization", "").encode("utf-8", "surrogateescape"), self.metrics_token):
                return web.Response(status=401, text="/metrics needs Authorization: Bearer <the gateway token>",
                                    headers={"WWW-Authenticate": "Bearer"})
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def gzip_body(data: bytes) -> bytes:
    return gzip.compress(data)


__all__ = ["Gateway", "decode_request", "request_to_spans", "inflate", "BadRequest", "BodyTooLarge", "SERVER_OPTIONS"]
