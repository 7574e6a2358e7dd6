"""Runs under Agent Lightning 0.3.0's own interpreter (see al_venv.py), never under ours.

Its own runner (``LitAgentRunner``, ``OtelTracer``) and its own store client (``LightningStoreClient``)
pointed at our gateway — the store URL is the only thing changed — run one attempt per rollout given:
the runner fetches the latest resources, traces the agent (its spans go to the store's OTLP endpoint),
turns the float the agent returns into a reward span (``/spans/next`` + ``/spans``) and ends the attempt
(``update_attempt``). The rollouts are built here as its store's dequeue would hand them out (the queue
is not on the bus yet).

    python al_store_driver.py STORE_URL OUT ROLLOUT_ID:ATTEMPT_ID:REWARD ...

Writes JSON to OUT: the resources the agent saw.
Only the standard library, OpenTelemetry and agentlightning are imported.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from opentelemetry import trace

from agentlightning.litagent import LitAgent
from agentlightning.runner.agent import LitAgentRunner
from agentlightning.store.client_server import LightningStoreClient
from agentlightning.tracer.otel import OtelTracer
from agentlightning.types import Attempt, AttemptedRollout

SEEN: dict[str, object] = {}


class Agent(LitAgent):
    """Two LLM calls with token ids (spans as an instrumented OpenAI client writes them); returns the reward."""

    def rollout(self, task, resources, rollout):  # noqa: ANN001, ANN201
        policy = resources["policy"]
        SEEN[rollout.rollout_id] = {"resource_type": policy.resource_type, "model": policy.model,
                                    "base_url": policy.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)}
        tracer = trace.get_tracer("agent")
        prompt = [1, 2, 3]
        for turn in range(2):
            response = [10 + turn, 20 + turn]
            with tracer.start_as_current_span("openai.chat.completion", attributes={
                    "gen_ai.request.model": policy.model, "gen_ai.response.id": f"{rollout.rollout_id}-c{turn}",
                    "prompt_token_ids": prompt, "response_token_ids": response}):
                pass
            prompt = prompt + response + [4]
        return float(task["reward"])


async def main(url: str, out: str, specs: list[str]) -> None:
    store = LightningStoreClient(url)
    runner = LitAgentRunner(OtelTracer())
    runner.init(Agent())
    runner.init_worker(0, store)
    for spec in specs:
        rollout_id, attempt_id, reward = spec.split(":")
        now = time.time()
        attempted = AttemptedRollout(
            rollout_id=rollout_id, input={"reward": float(reward)}, start_time=now, mode="train", status="preparing",
            attempt=Attempt(rollout_id=rollout_id, attempt_id=attempt_id, sequence_id=1, start_time=now, status="preparing"))
        await runner._step_impl(attempted, raise_on_exception=True)
    latest = await store.get_latest_resources()
    json.dump({"seen": SEEN, "resources_id": latest.resources_id if latest else None}, open(out, "w"))
    runner.teardown()
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
