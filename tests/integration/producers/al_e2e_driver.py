"""Runs under Agent Lightning 0.3.0's own interpreter (see al_venv.py), never under ours.

Its own runner (``LitAgentRunner``, ``OtelTracer``) and store client (``LightningStoreClient``) with the
gateway as the store — the store URL is all it is told. Its client enqueues ``ENQUEUE`` rollouts of the
problems given (``enqueue_many_rollouts``); its runner runs ``ROLLOUTS`` rollouts in all, dequeued from the
gateway (those and the tasks the test published on rb.tasks). The agent is the calc demo's agent written
as an Agent Lightning ``LitAgent``: its LLM is the ``proxy_llm`` resource the store hands it, it calls that
endpoint with the OpenAI client (chat completions), runs the calculator on ``calc a+b`` replies, and
returns ``1 / (1 + |n - answer|)`` for its ``answer n`` (1.0 when right), 0.0 without one.

    python al_e2e_driver.py STORE_URL OUT ROLLOUTS PROBLEM_JSON ...

Writes JSON to OUT: the resources each rollout got, its LLM base URL, replies and reward.
Only the standard library, OpenAI, OpenTelemetry and agentlightning are imported.
"""

from __future__ import annotations

import asyncio
import json
import sys

from openai import OpenAI

from agentlightning.litagent import LitAgent
from agentlightning.runner.agent import LitAgentRunner
from agentlightning.store.client_server import LightningStoreClient
from agentlightning.tracer.otel import OtelTracer
from agentlightning.types import LLM, EnqueueRolloutRequest
from al_calc_agent import play

SEEN: dict[str, dict[str, object]] = {}


class CalcAgent(LitAgent):
    """The calc demo's agent (al_calc_agent.py), its LLM the one in its resources."""

    def rollout(self, task, resources, rollout):  # noqa: ANN001, ANN201
        name, llm = next((n, r) for n, r in resources.items() if isinstance(r, LLM))
        base_url = llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
        client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)

        def chat(messages: list[dict[str, str]]) -> str:
            reply = client.chat.completions.create(model=llm.model, messages=messages, temperature=1.0, max_tokens=16)
            return reply.choices[0].message.content or ""

        replies, _answer, reward = play(task, chat)
        SEEN[rollout.rollout_id] = {"resource": name, "resource_type": llm.resource_type, "model": llm.model,
                                    "base_url": base_url, "resources_id": rollout.resources_id,
                                    "question": task["question"], "replies": replies, "reward": reward}
        return reward


async def main(url: str, out: str, rollouts: int, enqueue: list[dict[str, object]]) -> None:
    store = LightningStoreClient(url)
    enqueued = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=p, mode="train") for p in enqueue]) if enqueue else []
    runner = LitAgentRunner(OtelTracer(), max_rollouts=rollouts, poll_interval=0.5)
    runner.init(CalcAgent())
    runner.init_worker(0, store)
    try:
        await asyncio.wait_for(runner.iter(), 300)
    finally:
        json.dump({"enqueued": [r.rollout_id for r in enqueued], "seen": SEEN}, open(out, "w"))
        runner.teardown()
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), [json.loads(p) for p in sys.argv[4:]]))
