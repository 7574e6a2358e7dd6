"""Every agent framework the write-ups name, captured for real: LangGraph, the OpenAI Agents SDK, AutoGen
(agentchat) and CrewAI, from their PyPI packages (in a virtualenv of their own: ``frameworks_venv.py``), each
running two agents (or graph nodes) in one rollout, their LLM calls through ``rolloutbus proxy`` to
``rolloutbus serve``, traced by OpenInference's instrumentation for that framework into the gateway.

For each, what a user sees: the framework's own spans (agents, chains, LLM calls) stored under the rollout;
one step per LLM call in ``transitions``, named after the agent that made it and carrying the proxy's token
ids; ``--agent-match`` training one agent's calls and storing the other's untrained; the reward on the rollout.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import frameworks_venv
from schemas.codec import unpack_tokens
from producers_testkit import consume_all
from test_gateway_otlp import gateway  # noqa: F401 - the fixture
from test_openai_instrumentation import served  # noqa: F401 - the fixture
from tests.integration.streams.helpers import batches, query, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
AGENTS = Path(__file__).resolve().parent / "framework_agents"
# framework → (its agent, the venv it runs in: a key of frameworks_venv.PINS)
FRAMEWORKS = {"langgraph": ("langgraph_agent.py", "frameworks"), "openai-agents": ("openai_agents_agent.py", "frameworks"),
              "autogen": ("autogen_agent.py", "frameworks"), "crewai": ("crewai_agent.py", "crewai")}


def run_framework_agent(python: Path, script: str, gateway_url: str, proxy: str, env: dict[str, str]) -> list[dict[str, Any]]:
    run = subprocess.run([str(python), str(AGENTS / script), gateway_url, proxy],
                         env={**env, **frameworks_venv.ENV, "PYTHONPATH": f"{frameworks_venv.REPO}:{AGENTS}"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    calls: list[dict[str, Any]] = json.loads(run.stdout.strip().splitlines()[-1])["calls"]
    return calls


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_framework_agents_are_captured_and_one_agent_is_trained(
    framework: str, served: str, gateway: Any, kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str],  # noqa: F811
) -> None:
    base, _ = gateway
    script, venv = FRAMEWORKS[framework]
    calls = run_framework_agent(frameworks_venv.ensure_venv(venv), script, base, served, test_env)
    assert {c["agent"] for c in calls} == {"writer", "critic"}, calls
    rollout_id = f"ro-{framework}"

    records = consume_all(kafka_conf, topics.spans, expect=4, timeout=30)
    spans = [r for _k, name, r, _p in records if name.endswith("Span")]
    traced = [s for s in spans if s["resource"].get("service.name") == f"{framework}-agent"]
    proxied = [s for s in spans if s["resource"].get("service.name") == "rolloutbus-proxy"]
    assert traced, f"no span of {framework}'s instrumentation reached rb.spans: {[s['name'] for s in spans]}"
    assert all(s["rollout_id"] == rollout_id for s in spans)
    for name in ("writer", "critic"):  # the graph's nodes, the agents' own spans: named by the framework
        assert any(s["name"].split(".")[0] == name for s in traced), [s["name"] for s in traced]
    assert {s["agent_name"] for s in proxied} == {"writer", "critic"}
    assert all(unpack_tokens(s["llm"]["response_token_ids"]) for s in proxied)

    proc = start_worker(test_env, "--group-size", "1", "--agent-match", "^writer$")
    got = batches(kafka_conf, topics.batches, 1, proc)
    rc, log = stop_worker(proc)
    assert rc == 0 and len(got) == 1, log[-3000:]
    trained_in_batch = [t for g in got for t in g.transitions]

    rows = query(test_env, {
        "tr": ("SELECT agent_name, length(prompt_token_ids), length(response_token_ids), trained FROM transitions FINAL "
               f"WHERE rollout_id = '{rollout_id}' ORDER BY turn"),
        "spans": f"SELECT count() FROM spans FINAL WHERE rollout_id = '{rollout_id}' AND resource['service.name'] = '{framework}-agent'",
        "ro": f"SELECT status, final_reward FROM rollouts FINAL WHERE rollout_id = '{rollout_id}'",
    })
    tr = rows["tr"]
    assert len(tr) == len(proxied), "one step per LLM call, not one per view of it"
    assert {r[0] for r in tr} == {"writer", "critic"}
    assert all(r[1] > 0 and r[2] > 0 for r in tr), "every step carries the proxy's token ids"
    assert all(r[3] == (r[0] == "writer") for r in tr), "agent_match trains the writer's calls only"
    assert len(trained_in_batch) == sum(1 for r in tr if r[0] == "writer"), "only trained steps reach the trainer"
    assert rows["spans"][0][0] == len(traced), "the framework's own spans are stored with the rollout"
    assert rows["ro"] == [["succeeded", 1.0]], "the reward reaches the rollout"
