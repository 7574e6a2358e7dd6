"""The OTel SDK processor attributes spans to the current rollout and maps them (no broker)."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from producers import emit_state, rollout
from producers.otel import RolloutSpanProcessor
from test_context_emit import Recorder


def test_otel_spans_inside_a_rollout_are_attributed_and_ordered() -> None:
    rec = Recorder()
    provider = TracerProvider()
    proc = RolloutSpanProcessor(transport=rec)  # type: ignore[arg-type]
    provider.add_span_processor(proc)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outside"):
        pass
    with rollout("t", transport=rec, agent_name="planner") as r:  # type: ignore[arg-type]
        emit_state("s")
        with tracer.start_as_current_span("chat", attributes={"gen_ai.request.model": "m", "prompt_token_ids": [1, 2],
                                                              "response_token_ids": [3]}):
            with tracer.start_as_current_span("tool", attributes={"gen_ai.tool.name": "calc"}):
                pass
        emit_state("after")
    spans = sorted(rec.spans(), key=lambda s: s.sequence_id)
    assert [(s.sequence_id, s.kind) for s in spans] == [(1, "state"), (2, "llm"), (3, "tool"), (4, "state")]
    chat, tool = spans[1], spans[2]
    assert chat.rollout_id == r.rollout_id and chat.agent_name == "planner" and chat.llm is not None
    assert chat.llm.prompt_token_ids == [1, 2] and tool.parent_id == chat.span_id
    assert proc.exporter is not None and proc.exporter.unattributed == 1, "the span outside the rollout is not recorded"
