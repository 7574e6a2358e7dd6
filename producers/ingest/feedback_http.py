"""The gateway's feedback routes: late rewards over HTTP → Feedback records on ``<prefix>feedback``.

* ``POST /v1/feedback`` — JSON ``{"rollout_id": ..., "value": ..., "feedback_id"?: ..., "time_ns"?: ...,
  "metadata"?: {...}}``, or a list of them; 202 with the feedback ids;
* ``POST /v1/feedback/traces`` — an OTLP/HTTP export (protobuf or JSON): each span with the attributes
  ``rolloutbus.feedback.rollout_id`` and ``rolloutbus.feedback.value`` (``rolloutbus.feedback.id``
  optional, else the span id) is one Feedback; the spans themselves are not stored. Point a second OTLP
  exporter at this path for the spans that carry feedback. Answers as ``/v1/traces`` does (200, partial
  success for spans that carry no feedback).

Every check before the route's own work (token, body limit, encoding, 503 + Retry-After) is the
:class:`~producers.ingest.front_door.FrontDoor`'s. Decoding is pure (:func:`feedback_from_json`,
:func:`feedback_from_otlp`).
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

from producers.emit import FEEDBACK_ID, FEEDBACK_ROLLOUT_ID, FEEDBACK_VALUE, feedback_record
from producers.ingest.front_door import BadRequest, FrontDoor, guarded, not_a_json_constant, parse_json
from producers.ingest.otlp_decoding import JSON, PROTOBUF, any_value, decode_request
from producers.transport import SpanTransport
from schemas.codec import encode_raw

MAX_ITEMS = 10_000


def feedback_from_json(data: Any, now_ns: int | None = None) -> list[dict[str, Any]]:
    """A JSON body (one object or a list) → Feedback dicts; :class:`BadRequest` naming what is wrong."""
    items = data if isinstance(data, list) else [data]
    if not items or len(items) > MAX_ITEMS:
        raise BadRequest(f"send 1 to {MAX_ITEMS} feedback objects, got {len(items)}")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"feedback #{i} is not an object")
        extra = set(item) - {"rollout_id", "value", "feedback_id", "time_ns", "metadata"}
        if extra:
            raise BadRequest(f"feedback #{i}: unknown fields {sorted(extra)}")
        value, meta = item.get("value"), item.get("metadata") or {}
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRequest(f"feedback #{i}: value must be a number, got {value!r}"[:300])
        if not isinstance(meta, dict) or not isinstance(item.get("time_ns", 0), int):
            raise BadRequest(f"feedback #{i}: metadata must be an object and time_ns an integer")
        try:
            out.append(feedback_record(str(item.get("rollout_id") or ""), value, feedback_id=item.get("feedback_id") or None,
                                       time_ns=item.get("time_ns") or now_ns, source="http", metadata=meta))
        except ValueError as exc:
            raise BadRequest(f"feedback #{i}: {exc}") from exc
    return out


def feedback_from_otlp(req: ExportTraceServiceRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """The spans of an export that carry feedback → Feedback dicts, and why the others were refused."""
    out: list[dict[str, Any]] = []
    errors: list[str] = []
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                attrs = {kv.key: any_value(kv.value) for kv in span.attributes}
                rid, value = attrs.get(FEEDBACK_ROLLOUT_ID), attrs.get(FEEDBACK_VALUE)
                if rid is None or value is None:
                    errors.append(f"{span.name}: no {FEEDBACK_ROLLOUT_ID} and {FEEDBACK_VALUE}")
                    continue
                try:
                    fid = attrs.get(FEEDBACK_ID) or span.span_id.hex() or None
                    meta = {k: v for k, v in attrs.items() if not k.startswith("rolloutbus.feedback.")}
                    out.append(feedback_record(str(rid), float(value), feedback_id=str(fid) if fid else None,
                                               time_ns=span.end_time_unix_nano or span.start_time_unix_nano or None,
                                               source="otlp", metadata=meta))
                except (TypeError, ValueError) as exc:
                    errors.append(f"{span.name}: {exc}")
    return out, errors


def _encoded(records: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    return [(r["rollout_id"].encode(), encode_raw("rolloutbus.Feedback", r)) for r in records]


class FeedbackRoutes:
    """The two routes on one feedback transport, behind the gateway's front door."""

    def __init__(self, transport: SpanTransport, door: FrontDoor) -> None:
        self.transport = transport
        self.door = door

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/feedback", self.json)
        app.router.add_post("/v1/feedback/traces", self.traces)

    @guarded()
    async def json(self, request: web.Request) -> web.Response:
        door = self.door
        try:
            records = feedback_from_json(parse_json(await door.body(request), parse_constant=not_a_json_constant), time.time_ns())
        except BadRequest as exc:
            return door.refuse(exc.status, str(exc))
        if (busy := door.deliver(self.transport, _encoded(records))) is not None:
            return busy
        door.counts.answered(202)
        return web.json_response({"feedback_ids": [r["feedback_id"] for r in records]}, status=202)

    @guarded()
    async def traces(self, request: web.Request) -> web.Response:
        door = self.door
        ctype = request.headers.get("Content-Type", PROTOBUF).split(";")[0].strip().lower()
        try:
            records, errors = feedback_from_otlp(decode_request(await door.body(request), ctype))
        except BadRequest as exc:
            return door.refuse(exc.status, str(exc))
        if records and (busy := door.deliver(self.transport, _encoded(records))) is not None:
            return busy
        resp = ExportTraceServiceResponse()
        if errors:
            resp.partial_success.rejected_spans = len(errors)
            resp.partial_success.error_message = "; ".join(errors[:5])[:2000]
        door.counts.answered(200)
        if ctype.startswith(JSON):
            return web.Response(status=200, text=json_format.MessageToJson(resp), content_type=JSON)
        return web.Response(status=200, body=resp.SerializeToString(), content_type=PROTOBUF)


__all__ = ["FeedbackRoutes", "feedback_from_json", "feedback_from_otlp"]
