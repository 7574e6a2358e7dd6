"""OpenTelemetry SDK integration: spans from OTel-instrumented code become our Avro spans on rb.spans.

* :class:`RolloutSpanProcessor` — add it to a ``TracerProvider``. When a span starts inside a rollout
  it stamps the rollout id, attempt id and next sequence id on it (Agent Lightning's attribute names),
  so attribution survives any later batching; when it ends it is mapped and handed to the transport.
* :class:`RolloutSpanExporter` — a ``SpanExporter`` for a ``BatchSpanProcessor``/``SimpleSpanProcessor``;
  spans must carry the attribution attributes (stamped by the processor or by the agent itself), on the
  span or on the provider's Resource (where Agent Lightning's exporter puts them); the span's own win.

Exporting never raises into the application: failures are logged and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from producers.context import current_rollout
from producers.mapping import MappingError, otel_to_span, span_ids
from producers.transport import SPAN, SpanTransport, get_transport

log = logging.getLogger(__name__)


def _hex(n: int, width: int) -> str:
    return f"{n:0{width}x}"


def readable_to_avro(span: ReadableSpan) -> dict[str, Any]:
    """An SDK span → our Avro Span dict (raises MappingError)."""
    sc = span.get_span_context()
    parent = span.parent
    return otel_to_span(
        name=span.name,
        span_id=_hex(sc.span_id, 16),
        trace_id=_hex(sc.trace_id, 32),
        parent_id=_hex(parent.span_id, 16) if parent is not None else None,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or span.start_time or 0,
        status_code=span.status.status_code.name,
        status_message=span.status.description,
        attributes=dict(span.attributes or {}),
        events=[(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events],
        resource=dict(span.resource.attributes) if span.resource is not None else {},
    )


class RolloutSpanExporter(SpanExporter):
    """Map finished OTel spans and hand them to the span transport (non-blocking)."""

    def __init__(self, transport: SpanTransport | None = None) -> None:
        self._transport = transport
        self.unattributed = 0
        self.rejected = 0

    @property
    def transport(self) -> SpanTransport:
        return self._transport or get_transport()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            for span in spans:
                self._export_one(span)
        except Exception:  # noqa: BLE001 - never raise into the application
            log.exception("rolloutbus OTel export failed")
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _export_one(self, span: ReadableSpan) -> None:
        try:
            record = readable_to_avro(span)
        except MappingError as exc:
            rollout_id, _attempt, _seq = span_ids(span.attributes or {}, span.resource.attributes if span.resource else None)
            if rollout_id is not None:
                self.rejected += 1
                log.warning("rolloutbus: OTel span %r not recorded: %s", span.name, exc)
            else:
                # Spans of code that runs outside any rollout are not ours to record.
                self.unattributed += 1
            return
        self.transport.emit(record["rollout_id"], SPAN, record)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.transport.flush(timeout_millis / 1000) == 0


class RolloutSpanProcessor(SpanProcessor):
    """Attribute spans to the current rollout at start; export them at end."""

    def __init__(self, transport: SpanTransport | None = None, export: bool = True) -> None:
        self.exporter = RolloutSpanExporter(transport) if export else None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        ctx = current_rollout()
        if ctx is None:
            return
        attrs = span.attributes or {}
        if span.resource is not None and span_ids({}, span.resource.attributes)[0] is not None:
            # The provider's Resource names the rollout (Agent Lightning's exporter does that): it decides.
            return
        if "agentlightning.rollout_id" not in attrs:
            span.set_attribute("agentlightning.rollout_id", ctx.rollout_id)
            span.set_attribute("agentlightning.attempt_id", ctx.attempt_id)
        if "agentlightning.span_sequence_id" not in attrs:
            span.set_attribute("agentlightning.span_sequence_id", ctx.next_sequence_id())
        if ctx.agent_name and "rolloutbus.agent_name" not in attrs:
            span.set_attribute("rolloutbus.agent_name", ctx.agent_name)
        if ctx.resource_version is not None:
            span.set_attribute("rolloutbus.resource_version", ctx.resource_version)

    def on_end(self, span: ReadableSpan) -> None:
        if self.exporter is not None:
            self.exporter.export([span])

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis) if self.exporter else True


def instrument(provider: TracerProvider | None = None, transport: SpanTransport | None = None,
               capture: Sequence[str] = ()) -> RolloutSpanProcessor:
    """Add a :class:`RolloutSpanProcessor` to ``provider`` (default: the global one, created if needed); ``capture``
    names agent frameworks to instrument on it (:data:`producers.capture.CAPTURES`: ``langchain``, ``openai-agents``,
    ``autogen``, ``crewai``)."""
    from opentelemetry import trace

    if provider is None:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            provider = current
        else:
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
    processor = RolloutSpanProcessor(transport)
    provider.add_span_processor(processor)
    if capture:
        from producers.capture import capture as instrument_frameworks

        instrument_frameworks(*capture, provider=provider)
    return processor


__all__ = ["RolloutSpanProcessor", "RolloutSpanExporter", "instrument", "readable_to_avro"]
