"""Runs under Agent Lightning 0.3.0's own interpreter (see al_venv.py), never under ours.

An agent traced by Agent Lightning's ``OtelTracer``: LLM calls with token ids (spans as its instrumented
OpenAI client writes them), ``emit_message`` / ``emit_object`` / ``emit_exception`` / ``emit_reward``,
an LLM-as-judge inside a reward operation, a duplicate export of one call. Its own
``LightningStoreOTLPExporter`` sends every span to ``endpoint`` (our gateway), the ids on the Resource.
Then its own adapter, ``TracerTraceToTriplet`` with its defaults, turns the same spans into triplets,
written as JSON to ``out``:  python al_driver.py ENDPOINT ROLLOUT_ID ATTEMPT_ID OUT [FINAL_REWARD]
(the value of the last ``emit_reward``, 1.0 by default).

Only the standard library and agentlightning are imported.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agentlightning.adapter.triplet import TracerTraceToTriplet
from agentlightning.emitter import emit_exception, emit_message, emit_object, emit_reward
from agentlightning.emitter.annotation import operation
from agentlightning.emitter.reward import find_final_reward
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.tracer.otel import OtelTracer


class GatewayStore(InMemoryLightningStore):
    """A store whose OTLP endpoint is our gateway: what a LightningStore with ``otlp_traces`` says."""

    def __init__(self, endpoint: str) -> None:
        super().__init__()
        self._endpoint = endpoint

    @property
    def capabilities(self):  # type: ignore[override]
        caps = dict(super().capabilities)
        caps["otlp_traces"] = True
        return caps  # type: ignore[return-value]

    def otlp_traces_endpoint(self) -> str:
        return self._endpoint


def llm_call(tracer, n: int, prompt: list[int], response: list[int], response_id: str) -> None:  # noqa: ANN001
    attrs = {"gen_ai.system": "openai", "gen_ai.request.model": "tiny", "gen_ai.response.model": "tiny",
             "gen_ai.response.id": response_id, "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": f"q{n}",
             "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": f"a{n}",
             "prompt_token_ids": prompt, "response_token_ids": response}
    with tracer.start_as_current_span("openai.chat.completion", attributes=attrs):
        pass


async def main(endpoint: str, rollout_id: str, attempt_id: str, out: str, final: str = "1.0") -> None:
    tracer = OtelTracer()
    tracer.init_worker(0, GatewayStore(endpoint))
    async with tracer.trace_context("agent", rollout_id=rollout_id, attempt_id=attempt_id) as otel:
        with otel.start_as_current_span("agent.run", attributes={"agent.name": "solver"}):
            emit_message("planning")
            llm_call(otel, 1, [1, 2, 3], [10, 11], "chatcmpl-1")
            emit_object({"plan": ["search", "answer"]})
            llm_call(otel, 2, [1, 2, 3, 10, 11, 4], [12], "chatcmpl-2")
            llm_call(otel, 2, [1, 2, 3, 10, 11, 4], [12], "chatcmpl-2")  # the same call exported twice
            try:
                raise ValueError("tool broke")
            except ValueError as exc:
                emit_exception(exc)
            emit_reward(0.25)  # an intermediate reward
            llm_call(otel, 3, [5, 6], [13, 14, 15], "chatcmpl-3")
            with operation(name="agentlightning.reward"):
                llm_call(otel, 9, [99], [98], "chatcmpl-judge")  # an LLM judge: not a policy step
            emit_reward({"task": float(final), "format": 0.5}, primary_key="task")
    spans = tracer.get_last_trace()
    triplets = TracerTraceToTriplet().adapt(spans)
    json.dump({
        "spans": len(spans),
        "final_reward": find_final_reward(spans),
        "triplets": [{"prompt": t.prompt["token_ids"], "response": t.response["token_ids"], "reward": t.reward,
                      "response_id": t.metadata.get("response_id")} for t in triplets],
    }, open(out, "w"))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
