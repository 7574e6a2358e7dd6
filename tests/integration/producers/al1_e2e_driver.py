"""Runs under Agent Lightning 1.x's own interpreter (see al_venv.py, 1.0.2), never under ours.

Its trainer side creates rollouts on the gateway's ``/api`` (``RolloutCreate`` lists, posted by its
``AgentLightningSyncClient`` as its rollout manager posts them: ``N`` rollouts per sample, one GRPO group,
each naming its agent class in ``config.local``); its ``LocalReconciler`` runs unmodified, given the gateway
as its server (``agl_server.url`` and ``key``, nothing else): it polls the gateway's queue, spawns a worker
subprocess per rollout with the environment its ``_spawn_for`` builds (``AGL_KEY``, ``AGL_EVENT_URL``,
``AGL_OPENAI_BASE_URL`` — its server's LLM route, which the gateway forwards to ``rolloutbus proxy`` — and
the input through ``env_map``), and patches each rollout to running and, when the agent is done, to
succeeded or failed. The driver only watches: an httpx response hook on its client records every call
and its status, and the loop is stopped once every rollout was patched to an end.

The agent is the calc demo's agent: chat completions (httpx, as the 1.x package has no OpenAI client) to
``AGL_OPENAI_BASE_URL`` with its key, as its server asks; the calculator on ``calc a+b``, its reward
``1 / (1 + |n - answer|)`` for ``answer n`` posted as a ``reward`` event. What it saw goes to a file (it runs
in a subprocess of the reconciler).

    python al1_e2e_driver.py GATEWAY KEY N OUT PROBLEM_JSON ...
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
AGENT_CLASS = "al1_e2e_driver:CalcAgent"
POLL_S = 1.0
TIMEOUT_S = 300.0


class CalcAgent:
    """The calc demo's agent as a 1.x local agent: ``run()`` reads its rollout from the environment."""

    def run(self) -> None:
        from agentlightning.client import AgentLightningSyncClient
        from al_calc_agent import play

        task = json.loads(os.environ["AGL_TASK"])
        base, events, key = os.environ["AGL_OPENAI_BASE_URL"], os.environ["AGL_EVENT_URL"], os.environ["AGL_KEY"]
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}"}) as llm:
            def chat(messages: list[dict[str, str]]) -> str:
                resp = llm.post(f"{base}/chat/completions", json={"model": "policy", "messages": messages,
                                                                   "temperature": 1.0, "max_tokens": 16})
                resp.raise_for_status()
                return str(resp.json()["choices"][0]["message"]["content"] or "")

            replies, answer, reward = play(task, chat)
        with AgentLightningSyncClient(key=key, base_url=events, max_retries=3, timeout=20) as agent:
            agent.post_with_retry(events, json={"event_type": "agent_output", "data": {"answer": answer}})
            agent.post_with_retry(events, json={"event_type": "reward", "data": {"value": reward}})
        rollout_id = events.split("/api/rollouts/", 1)[1].split("/", 1)[0]
        seen = {"replies": replies, "reward": reward, "base_url": base, "event_url": events}
        Path(os.environ["AL1_SEEN_DIR"], f"{rollout_id}.json").write_text(json.dumps(seen))


async def run_controller(base: str, key: str, rollout_ids: set[str], workers: int) -> list[list[Any]]:
    """Its ``LocalReconciler`` against the gateway until every rollout was patched to an end; → its calls."""
    from agentlightning.client import AgentLightningAsyncClient
    from agentlightning.controller.local_reconciler import LocalReconciler
    from omegaconf import OmegaConf

    calls: list[list[Any]] = []
    ended: set[str] = set()

    async def record(response: httpx.Response) -> None:
        req = response.request
        state = json.loads(req.content)["status"].get("state") if req.method == "PATCH" and req.content else None
        calls.append([req.method, req.url.path, response.status_code, state])
        if state in ("succeeded", "failed") and response.status_code < 300:
            ended.add(req.url.path.rsplit("/", 1)[1])

    config = OmegaConf.create({"runner_type": "local", "local_runner": {"maximum_size": workers, "poll_interval": POLL_S},
                               "agl_server": {"url": base, "key": key}})
    async with AgentLightningAsyncClient(base_url=base, key=key, event_hooks={"response": [record]}) as api:
        reconciler = LocalReconciler(api=api, config=config)
        loop = asyncio.create_task(reconciler.run())
        deadline = time.monotonic() + TIMEOUT_S
        while not rollout_ids <= ended and time.monotonic() < deadline and not loop.done():
            await asyncio.sleep(0.5)
        reconciler.stop()
        await loop
    return calls


def main(base: str, key: str, n: int, out: str, problems: list[dict[str, object]]) -> None:
    from agentlightning.client import AgentLightningSyncClient
    from agentlightning.schemas import Model, Rollout, RolloutCreate

    seen_dir = Path(out).with_suffix(".seen")
    seen_dir.mkdir(exist_ok=True)
    # The environment its worker subprocesses inherit: where the agent class is imported from, where it writes.
    os.environ.update({"AL1_SEEN_DIR": str(seen_dir), "PYTHONPATH": str(HERE)})
    result: dict[str, object] = {}
    with AgentLightningSyncClient(key=key, base_url=base, max_retries=3, timeout=20) as client:
        result["models"] = [Model.model_validate(m).model_dump() for m in client.get("/api/models").json()]
        config = {"timeout_seconds": 300, "local": {"agent_class": AGENT_CLASS, "env_map": {"AGL_TASK": "input"}}}
        reqs = [RolloutCreate(input=p, is_train=True, config=config) for p in problems for _ in range(n)]
        resp = client.post_with_retry("/api/rollouts", json=[r.model_dump(mode="json", exclude_none=True) for r in reqs])
        created = [Rollout.model_validate(item) for item in resp.json()]
    result["created"] = [[r.rollout_id, r.status.state.value, r.input["data_id"]] for r in created]
    # Its controller runs the round at once (a pool as large as the batch), as its trainer's batches run: the
    # groups end together, so the trainer's step on the first one does not meet rollouts of this round.
    result["calls"] = asyncio.run(run_controller(base, key, {r.rollout_id for r in created}, workers=len(created)))
    result["seen"] = {p.stem: json.loads(p.read_text()) for p in seen_dir.glob("*.json")}
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], [json.loads(p) for p in sys.argv[5:]])
