"""Runs under Agent Lightning 0.3.0's own interpreter (see al_venv.py), never under ours.

Its own store client (``LightningStoreClient``) and its own runner (``LitAgentRunner``, ``OtelTracer``)
pointed at our gateway — the store URL is the only thing changed: the client enqueues one rollout per
REWARD given (``enqueue_rollout``, then ``enqueue_many_rollouts``), the runner dequeues them and ``EXTRA``
more (tasks the test published on rb.tasks), fetches the latest resources, traces the agent (its spans go
to the store's OTLP endpoint), turns the float the agent returns into a reward span (``/spans/next`` +
``/spans``) and ends each attempt (``update_attempt``). Then the client reads every rollout back
(``get_rollout_by_id`` until it ended, ``query_rollouts``, ``query_attempts``, ``get_latest_attempt``,
``query_spans``, ``wait_for_rollouts``): the gateway answers them from ClickHouse. Last it publishes an LLM
(``add_resources``, then ``update_resources``) and reads the latest set back.

    python al_store_driver.py STORE_URL OUT EXTRA REWARD ...

Writes JSON to OUT: what was enqueued, what the agent saw and returned, what the reads answered.
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
from agentlightning.types import LLM, EnqueueRolloutRequest

SEEN: dict[str, dict[str, object]] = {}
TURNS: dict[str, int] = {}


class Agent(LitAgent):
    """Two LLM calls with token ids (spans as an instrumented OpenAI client writes them); returns the reward:
    the task's ``reward``, or the next of its ``rewards`` (a group: one per rollout, in the order they run)."""

    def rollout(self, task, resources, rollout):  # noqa: ANN001, ANN201
        policy = resources["policy"]
        if "reward" in task:
            reward = float(task["reward"])
        else:
            n = TURNS[task["id"]] = TURNS.get(task["id"], -1) + 1
            reward = float(task["rewards"][n])
        SEEN[rollout.rollout_id] = {"resource_type": policy.resource_type, "model": policy.model, "reward": reward,
                                    "attempt": rollout.attempt.sequence_id,
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
        return reward


async def reads(store: LightningStoreClient, rollout_id: str, timeout: float = 120.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        rollout = await store.get_rollout_by_id(rollout_id)
        if rollout is not None and rollout.status in ("succeeded", "failed") or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    latest = await store.get_latest_attempt(rollout_id)
    attempts = await store.query_attempts(rollout_id)
    spans = await store.query_spans(rollout_id)
    return {"status": rollout.status if rollout else None, "mode": rollout.mode if rollout else None,
            "attempt_status": rollout.attempt.status if rollout and hasattr(rollout, "attempt") else None,
            "latest": [latest.sequence_id, latest.status, latest.worker_id] if latest else None,
            "attempts": [a.attempt_id for a in attempts], "attempts_total": attempts.total,
            "spans": sorted(s.name for s in spans)}


async def main(url: str, out: str, extra: int, rewards: list[float]) -> None:
    store = LightningStoreClient(url)
    enqueued = [await store.enqueue_rollout(input={"reward": rewards[0]}, mode="train")]
    enqueued += await store.enqueue_many_rollouts([EnqueueRolloutRequest(input={"reward": r}) for r in rewards[1:]])
    runner = LitAgentRunner(OtelTracer(), max_rollouts=len(rewards) + extra, poll_interval=0.5)
    runner.init(Agent())
    runner.init_worker(0, store)
    await asyncio.wait_for(runner.iter(), 180)
    latest = await store.get_latest_resources()
    result = {"enqueued": [r.model_dump(mode="json") for r in enqueued], "seen": SEEN,
              "resources_id": latest.resources_id if latest else None, "reads": {}}
    for rid in SEEN:
        result["reads"][rid] = await reads(store, rid)
    page = await store.query_rollouts(rollout_id_in=list(SEEN), status_in=["succeeded"], sort_by="rollout_id")
    result["query_rollouts"] = {"ids": [r.rollout_id for r in page], "total": page.total}
    waited = await store.wait_for_rollouts(rollout_ids=[*SEEN, "ro-unknown"], timeout=0.1)
    result["waited"] = [(r.rollout_id, r.status) for r in waited]
    judge = LLM(endpoint="http://judge:8000/v1", model="judge")
    added = await store.add_resources({"judge": judge})
    updated = await store.update_resources(added.resources_id, {"judge": judge})
    result["added"] = [added.resources_id, added.version, added.resources["judge"].model_dump(mode="json")]
    result["updated"] = [updated.resources_id, updated.version, updated.resources["judge"].model_dump(mode="json")]
    latest = await store.get_latest_resources()
    result["latest_after"] = latest.resources_id if latest else None
    json.dump(result, open(out, "w"))
    runner.teardown()
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), [float(r) for r in sys.argv[4:]]))
