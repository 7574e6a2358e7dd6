"""OTLP/HTTP ingest gateway: ``POST /v1/traces`` (protobuf or JSON, gzip) → Avro spans on rb.spans.

Agent Lightning's own APIs are served beside it (:mod:`producers.ingest.agl`): 0.3's LightningStore API
(``/v1/agl/...``) and 1.x's server API (``/api/...``, its agents' events route included).

Answers as the OTLP spec asks: 200 with ``partial_success.rejected_spans`` for spans that cannot be
ours, 400 with a reason for undecodable bodies, 413 over the size limit, 503 + ``Retry-After`` when
Kafka is down and the spool is full, 401 without the configured bearer token (every route's checks are
:mod:`producers.ingest.front_door`'s). ``/healthz`` and Prometheus ``/metrics`` too. Decoding and
mapping are :mod:`producers.ingest.otlp_decoding`'s. A 200 is answered once the accepted spans are in the local spool
(:meth:`~producers.transport.SpanTransport.spooled`): a SIGKILL of the gateway after it loses none of them.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from foundation.errors import ServiceError
from producers.ingest.agl.v0_3_store_http import LightningStoreRoutes
from producers.ingest.agl.v1_api_http import AgentLightning1Routes
from producers.ingest.auth import authorized
from producers.ingest.feedback_http import FeedbackRoutes
from producers.ingest.front_door import SERVER_OPTIONS, BadRequest, Counts, FrontDoor, guarded
from producers.ingest.otlp_decoding import _OTLP_COMPILED, JSON, PROTOBUF, map_body
from producers.ingest.resources import Resources
from producers.spool import FRAME_OVERHEAD
from producers.transport import SpanTransport

log = logging.getLogger(__name__)
# How long a request waits for its spans to reach the spool before it is answered 503 (retry): the transport's thread
# writes within milliseconds; only a stalled disk or a stopped transport takes longer.
SPOOLED_WAIT_S = 10.0


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
        feedback_transport: SpanTransport | None = None,
    ) -> None:
        """``metrics_token``: the bearer token ``/metrics`` needs (the command passes the gateway's token when it
        listens beyond loopback; on loopback only this machine's processes can reach it). ``feedback_transport``:
        the producer of ``<prefix>feedback``, for the feedback routes (:mod:`producers.ingest.feedback_http`)."""
        self.transport = transport
        if _OTLP_COMPILED is None:
            log.warning("gateway: the compiled OTLP mapping is not installed; spans take the Python path, about ten "
                        "times the CPU per span (make setup builds it with cargo: see native/README.md)")
        self.max_body_bytes = max_body_bytes
        self.metrics_token = metrics_token
        self.registry = CollectorRegistry()
        self.m_requests = Counter("rolloutbus_gateway_requests", "OTLP requests by HTTP status", ["code"], registry=self.registry)
        self.m_spans = Counter("rolloutbus_gateway_spans_accepted", "Spans accepted onto rb.spans", registry=self.registry)
        self.m_rejected = Counter("rolloutbus_gateway_spans_rejected", "Spans rejected (partial success)", registry=self.registry)
        g = Gauge("rolloutbus_gateway_spool_pending", "Records in the spool not yet delivered", registry=self.registry)
        g.set_function(lambda: self.transport.stats()["spool_pending"])
        up = Gauge("rolloutbus_gateway_kafka_up", "1 when the last Kafka contact succeeded", registry=self.registry)
        up.set_function(lambda: 1.0 if self.transport.kafka_up else 0.0)
        counts = Counts(answered=lambda status: self.m_requests.labels(str(status)).inc(), accepted=self.m_spans.inc,
                        rejected=self.m_rejected.inc)
        self.door = FrontDoor(token=token, max_body_bytes=max_body_bytes, retry_after_s=retry_after_s, counts=counts)
        # Agent Lightning's own APIs, one rb.resources reader for both: 0.3's store and 1.x's server (whose
        # agents' events are spans, counted with the OTLP route's).
        resources = resources or dict
        self.agl_store = LightningStoreRoutes(transport, resources, token=token, retry_after_s=retry_after_s,
                                              max_body_bytes=max_body_bytes)
        self.agl1_api = AgentLightning1Routes(transport, resources, token=token, retry_after_s=retry_after_s,
                                              max_body_bytes=max_body_bytes, counts=counts)
        self.feedback = FeedbackRoutes(feedback_transport, self.door) if feedback_transport is not None else None

    def app(self) -> web.Application:
        # The body limit is checked by hand (after gzip too); aiohttp's own limit sits just above it.
        app = web.Application(client_max_size=self.max_body_bytes + 1, middlewares=[self.door.middleware])
        app.router.add_post("/v1/traces", self.traces)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/livez", self.livez)
        app.router.add_get("/metrics", self.metrics)
        self.agl_store.control = self.agl1_api.control  # both APIs' control records: one partition
        self.agl_store.add_to(app)
        self.agl1_api.add_to(app)
        if self.feedback is not None:
            self.feedback.add_to(app)
        return app

    async def _spooled(self) -> bool:
        """Whether what was just accepted is in the spool (a 200 promises it survives a SIGKILL of this process: until
        the transport wrote it, it was only in memory). False: not in SPOOLED_WAIT_S, or the transport stopped."""
        try:
            await asyncio.wait_for(asyncio.wrap_future(self.transport.spooled()), SPOOLED_WAIT_S)
            return True
        except (asyncio.TimeoutError, ServiceError):
            return False

    @guarded()
    async def traces(self, request: web.Request) -> web.Response:
        door = self.door
        if not self.transport.accepting():
            return door.busy()
        try:
            body = await door.body(request)  # Content-Encoding is decoded already (the front door's middleware)
        except BadRequest as exc:
            return door.refuse(exc.status, str(exc))
        ctype = request.headers.get("Content-Type", PROTOBUF).split(";")[0].strip().lower()
        try:
            encoded, errors = map_body(body, ctype)
        except BadRequest as exc:
            return door.refuse(400, str(exc))
        # Kafka down: accept only what the spool can keep (frame overhead included), all or nothing.
        if not self.transport.accepting(sum(len(k) + len(v) + FRAME_OVERHEAD for k, v, _ in encoded)):
            return door.busy()
        accepted = self.transport.emit_encoded_many([(key, value) for key, value, _name in encoded])
        if accepted and not await self._spooled():
            return door.busy("the spans could not be written to the local spool in time; retry")
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


__all__ = ["Gateway", "SERVER_OPTIONS"]
