"""Agent Lightning 1.x agents switch by their event URL: its own ``AgentLightningSyncClient`` posts
events to ``AGL_EVENT_URL`` = the gateway's ``/api/rollouts/{rollout_id}/attempt/{attempt_id}/events``;
they land on rb.spans as our spans and the LLM call becomes a step in ClickHouse.

Agent Lightning 1.0.2 runs in its own virtualenv (al_venv.py, Python >= 3.12); a failed install fails
the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from al_venv import ALInstallError, ensure_venv_1x
from producers_testkit import consume_all
from schemas import codec
from schemas.codec import unpack_floats, unpack_tokens
from schemas.models import RolloutEvent
from test_gateway_otlp import gateway  # noqa: F401 - the fixture
from tests.integration.streams.helpers import batches, produce, query, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# A 1.x agent's reporting, with its own client class, as its controller sets it up (AGL_EVENT_URL, AGL_KEY).
DRIVER = """
import json, os
from agentlightning.client import AgentLightningSyncClient

url, key = os.environ["AGL_EVENT_URL"], os.environ["AGL_KEY"]
base, path = url.split("/api/", 1)
out = []
with AgentLightningSyncClient(key=key, base_url=base, max_retries=1, timeout=20) as client:
    # What its gateway records for an LLM call (vLLM's token ids in the OpenAI response).
    model_request = {"model": "policy", "model_version": 4, "latency_ms": 12.5, "http_status": 200, "status": "ok",
        "request": {"model": "policy", "messages": [{"role": "user", "content": "2+2?"}]},
        "response": {"id": "chatcmpl-agl1", "model": "policy", "prompt_token_ids": [11, 12, 13],
                     "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [21, 22],
                                  "message": {"role": "assistant", "content": "4"},
                                  "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]}}]}}
    for event in ({"event_type": "model_request", "data": model_request},
                  {"event_type": "agent_output", "data": {"answer": "4"}},
                  {"event_type": "reward", "data": {"value": 1.0, "reason": "exact_match"}}):
        out.append(client.post_with_retry("/api/" + path, json=event).json())
    bad = client.post("/api/" + path, json={"event_type": "reward", "data": {"value": "high"}})
    anonymous = AgentLightningSyncClient(base_url=base).post("/api/" + path, json={"event_type": "reward", "data": {"value": 1}})
print(json.dumps({"stored": out, "bad": [bad.status_code, bad.text], "anonymous": anonymous.status_code}))
"""


@pytest.fixture(scope="module")
def al1_python() -> Path:
    try:
        return ensure_venv_1x()
    except ALInstallError as exc:
        pytest.fail(f"Agent Lightning 1.x is needed for this test and could not be installed: {exc}")


def test_agent_lightning_1x_client_posts_events_to_the_gateway(
    al1_python: Path, gateway: Any, kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str]  # noqa: F811
) -> None:
    base, _ = gateway
    rollout_id, attempt_id = "ro-agl1", "at-agl1"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
           "AGL_EVENT_URL": f"{base}/api/rollouts/{rollout_id}/attempt/{attempt_id}/events", "AGL_KEY": "s3cret"}
    run = subprocess.run([str(al1_python), "-c", DRIVER], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    # Its client reads back what its store answers: the event, with ids and a timestamp.
    assert [e["event_type"] for e in got["stored"]] == ["model_request", "agent_output", "reward"]
    assert all(e["rollout_id"] == rollout_id and e["attempt_id"] == attempt_id and e["timestamp"] > 0 for e in got["stored"])
    assert got["bad"][0] == 422 and "data.value must be a finite number" in got["bad"][1]
    assert got["anonymous"] == 401

    records = consume_all(kafka_conf, topics.spans, expect=3, timeout=30)
    spans = [r for _k, _n, r, _p in records]
    assert {k for k, *_ in records} == {rollout_id.encode()} and len(spans) == 3, "the rejected events are not on the topic"
    llm, output, reward = spans  # in the order they were posted (one partition)
    assert [s["sequence_id"] for s in spans] == [0, 0, 0], "unnumbered: the span stage numbers them in arrival order"
    assert llm["kind"] == "llm" and llm["attempt_id"] == attempt_id
    assert unpack_tokens(llm["llm"]["prompt_token_ids"]) == [11, 12, 13]
    assert unpack_tokens(llm["llm"]["response_token_ids"]) == [21, 22]
    assert unpack_floats(llm["llm"]["response_logprobs"]) == [-0.5, -0.25]
    assert (llm["llm"]["model"], llm["llm"]["resource_version"], llm["llm"]["request_id"]) == ("policy", 4, "chatcmpl-agl1")
    assert output["kind"] == "object" and json.loads(output["attributes"]["agentlightning.object.json"]) == {"answer": "4"}
    assert reward["kind"] == "reward" and reward["reward"]["value"] == 1.0
    assert reward["attributes"]["agentlightning.reward.reason"] == "exact_match"

    # Its events query knows the rollouts created through its API; this one (our runner's) is spans only, as its
    # server answers a rollout it does not have.
    resp = requests.get(f"{base}/api/rollouts/{rollout_id}/events", headers={"Authorization": "Bearer s3cret"}, timeout=5)
    assert resp.status_code == 404 and resp.json()["detail"] == f"Rollout not found: {rollout_id}"

    # The attempt ends (our runner's FINISHED) and the stream worker makes the call a step.
    finished = RolloutEvent(rollout_id=rollout_id, attempt_id=attempt_id, event="FINISHED", time_ns=time.time_ns(),
                            task_id="agl1-task", status="succeeded", final_reward=1.0, span_count=3)
    produce(kafka_conf, topics.spans, [(rollout_id, codec.encode(finished))])
    proc = start_worker(test_env, "--group-size", "1")
    out = batches(kafka_conf, topics.batches, 1, proc)
    rc, log = stop_worker(proc)
    assert rc == 0 and len(out) == 1, log[-3000:]
    got_rows = query(test_env, {
        "tr": f"SELECT prompt_token_ids, response_token_ids, return_ FROM transitions FINAL WHERE rollout_id = '{rollout_id}' ORDER BY turn",
        "seq": f"SELECT sequence_id, attributes['agentlightning.event_type'] FROM spans FINAL WHERE rollout_id = '{rollout_id}' ORDER BY kafka_offset",
    })
    assert [r[:2] for r in got_rows["tr"]] == [[[11, 12, 13], [21, 22]]]
    assert got_rows["seq"] == [[1, "model_request"], [2, "agent_output"], [3, "reward"]], "numbered in arrival order"
