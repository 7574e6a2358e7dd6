"""Runs under Agent Lightning 1.x's own interpreter (see al_venv.py, 1.0.2), never under ours.

Its trainer side creates rollouts on the gateway's ``/api`` (``RolloutCreate`` lists, posted by its
``AgentLightningSyncClient`` as its rollout manager posts them: ``N`` rollouts per sample, one GRPO group);
its ``LocalReconciler`` patches each to running and, when the agent is done, to succeeded or failed
(``_patch``, as its ``_spawn_for`` and ``_finish_proc`` do); the agent runs through its
``_run_local_reconciler_worker`` with the environment its ``_spawn_for`` gives one (``AGL_KEY``,
``AGL_EVENT_URL``, the input through ``_build_env_from_map``) except ``AGL_OPENAI_BASE_URL``: its own server
proxies LLM calls under the same host as the events, the bus has ``rolloutbus proxy`` for that, so the URL
is the proxy's route for the rollout (``/rollout/{rollout_id}/attempt/0/v1``). Its reconciler cannot poll
the gateway for queued rollouts (``GET /api/rollouts`` needs a rollout table), so the agents are launched
here, in this process, with the ids the create answered.

The agent is the calc demo's agent: chat completions (httpx, as the 1.x package has no OpenAI client) to
``AGL_OPENAI_BASE_URL``, the calculator on ``calc a+b``, its reward ``1 / (1 + |n - answer|)`` for
``answer n`` posted as a ``reward`` event.

    python al1_e2e_driver.py GATEWAY KEY PROXY N OUT PROBLEM_JSON ...
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
from omegaconf import OmegaConf

from agentlightning.client import AgentLightningAsyncClient, AgentLightningSyncClient
from agentlightning.controller.local_reconciler import LocalReconciler, _build_env_from_map, _run_local_reconciler_worker
from agentlightning.schemas import Model, Rollout, RolloutCreate, RolloutState
from al_calc_agent import play

SEEN: dict[str, dict[str, object]] = {}


class CalcAgent:
    """The calc demo's agent as a 1.x local agent: ``run()`` reads its rollout from the environment."""

    def run(self) -> None:
        task = json.loads(os.environ["AGL_TASK"])
        base, events = os.environ["AGL_OPENAI_BASE_URL"], os.environ["AGL_EVENT_URL"]
        with httpx.Client(timeout=60) as llm:
            def chat(messages: list[dict[str, str]]) -> str:
                resp = llm.post(f"{base}/chat/completions", json={"model": "policy", "messages": messages,
                                                                   "temperature": 1.0, "max_tokens": 16})
                resp.raise_for_status()
                return str(resp.json()["choices"][0]["message"]["content"] or "")

            replies, answer, reward = play(task, chat)
        with AgentLightningSyncClient(key=os.environ["AGL_KEY"], base_url=events, max_retries=3, timeout=20) as agent:
            agent.post_with_retry(events, json={"event_type": "agent_output", "data": {"answer": answer}})
            agent.post_with_retry(events, json={"event_type": "reward", "data": {"value": reward}})
        SEEN[os.environ["AGL_ROLLOUT_ID"]] = {"replies": replies, "reward": reward, "base_url": base}


async def controller_and_agents(base: str, key: str, proxy: str, created: list[Rollout]) -> list[bool]:
    config = OmegaConf.create({"runner_type": "local", "local_runner": {"maximum_size": 1, "poll_interval": 1.0},
                               "agl_server": {"url": base, "key": key}})
    patched = []
    async with AgentLightningAsyncClient(base_url=base, key=key) as api:
        rec = LocalReconciler(api=api, config=config)
        for rollout in created:
            rid = rollout.rollout_id
            patched.append(await rec._patch(rid, RolloutState.RUNNING, last_attempt_id="0"))
            os.environ.update({"AGL_KEY": key, "AGL_ROLLOUT_ID": rid,
                               "AGL_OPENAI_BASE_URL": f"{proxy.removesuffix('/v1')}/rollout/{rid}/attempt/0/v1",
                               "AGL_EVENT_URL": f"{base}/api/rollouts/{rid}/attempt/0/events",
                               **_build_env_from_map(rollout.input, {"AGL_TASK": "input"})})
            code = _run_local_reconciler_worker("__main__:CalcAgent")
            patched.append(await rec._patch(rid, RolloutState.SUCCEEDED if code == 0 else RolloutState.FAILED,
                                            None if code == 0 else f"subprocess exited with code {code}", last_attempt_id="0"))
    return patched


def main(base: str, key: str, proxy: str, n: int, out: str, problems: list[dict[str, object]]) -> None:
    result: dict[str, object] = {}
    with AgentLightningSyncClient(key=key, base_url=base, max_retries=3, timeout=20) as client:
        result["models"] = [Model.model_validate(m).model_dump() for m in client.get("/api/models").json()]
        reqs = [RolloutCreate(input=p, is_train=True, config={"timeout_seconds": 600}) for p in problems for _ in range(n)]
        resp = client.post_with_retry("/api/rollouts", json=[r.model_dump(mode="json", exclude_none=True) for r in reqs])
        created = [Rollout.model_validate(item) for item in resp.json()]
    result["created"] = [[r.rollout_id, r.status.state.value, r.input["data_id"]] for r in created]
    result["patched"] = asyncio.run(controller_and_agents(base, key, proxy, created))
    result["seen"] = SEEN
    json.dump(result, open(out, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], [json.loads(p) for p in sys.argv[6:]])
