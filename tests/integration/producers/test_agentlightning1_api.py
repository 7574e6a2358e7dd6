"""Agent Lightning 1.x's server API on the bus: its trainer's rollout creation (tasks on rb.tasks), its
controller's poll and status patches (the claims) and its agents' events go to the gateway, and the
rollouts finish in ClickHouse with the rewards of their last ``reward`` events, as one GRPO group;
``GET /api/models`` lists the versions on rb.resources.

Its own code drives it, in its own virtualenv (al_venv.py, Agent Lightning 1.0.2): the create body is its
``RolloutCreate`` list as its rollout manager posts it (that class needs numpy and torch, so the payload is
built as its ``_create_rollouts`` builds it), the poll is its ``LocalReconciler``'s query, the patches its
``LocalReconciler._patch`` (its whole loop, unmodified, with real agents and a policy:
test_agentlightning_e2e.py), the events its ``AgentLightningSyncClient`` posting to the ``AGL_EVENT_URL``
its controller hands an agent. Replies are read back with its own pydantic models. The gateway is ``producers.ingest.gateway.Gateway`` with
:class:`producers.ingest.agl.v1_api_http.AgentLightning1Routes` added to its application.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from al_venv import ENV, ALInstallError, ensure_venv_1x
from producers_testkit import REPO, consume_all, free_port, start_gateway
from schemas import codec
from schemas.models import ResourceVersion
from tests.integration.streams.helpers import batches, produce, query, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
TOKEN = "s3cret"

DRIVER = """
import asyncio, json, sys
from omegaconf import OmegaConf
from agentlightning.client import AgentLightningAsyncClient, AgentLightningSyncClient
from agentlightning.controller.local_reconciler import LocalReconciler
from agentlightning.schemas import Model, Rollout, RolloutCreate, RolloutState

base, key, rewards = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {}
with AgentLightningSyncClient(key=key, base_url=base, max_retries=3, timeout=20) as client:
    models = client.get("/api/models")
    out["models"] = [Model.model_validate(m).model_dump() for m in models.json()]

    # Its rollout manager's _create_rollouts: n rollouts of one sample, ids assigned before the post.
    sample = {"question": "2+2?", "answer": "4"}
    reqs = [RolloutCreate(input=sample, is_train=True, config={"timeout_seconds": 600}, metadata={}).model_copy(
        update={"rollout_id": rid}) for rid in rewards]
    resp = client.post_with_retry("/api/rollouts", json=[r.model_dump(mode="json", exclude_none=True) for r in reqs])
    created = [Rollout.model_validate(item) for item in resp.json()]
    out["created"] = [[r.rollout_id, r.status.state.value, r.config.timeout_seconds] for r in created]
    # A validation rollout without an id: the server makes one.
    resp = client.post_with_retry("/api/rollouts", json=[RolloutCreate(input={"question": "3+3?"}, is_train=False)
                                                       .model_dump(mode="json", exclude_none=True)])
    (val,) = [Rollout.model_validate(item) for item in resp.json()]
    out["val"] = val.rollout_id

config = OmegaConf.create({"runner_type": "local", "local_runner": {"maximum_size": 2, "poll_interval": 1.0},
                           "agl_server": {"url": base, "key": key}})
# Its controller's poll (LocalReconciler._reconcile_once): the rollouts the gateway offers and runs.
POLL = [("state_in", RolloutState.QUEUING.value), ("state_in", RolloutState.RUNNING.value), ("limit", 50)]

async def listed(api):
    resp = await api.get("/api/rollouts", params=POLL)
    resp.raise_for_status()
    return {r.rollout_id: r.status.state.value for r in (Rollout.model_validate(item) for item in resp.json())}

async def controller_and_agents():
    async with AgentLightningAsyncClient(base_url=base, key=key) as api:
        rec = LocalReconciler(api=api, config=config)
        for _ in range(120):  # the gateway reads its rollouts back from rb.tasks
            out["queued"] = await listed(api)
            if len(out["queued"]) == 3:
                break
            await asyncio.sleep(0.5)
        patched = []
        for rid, reward in rewards.items():
            patched.append(await rec._patch(rid, RolloutState.RUNNING, last_attempt_id="0"))  # its _spawn_for
            out.setdefault("running", []).append((await listed(api)).get(rid))
            # The agent: its events to the AGL_EVENT_URL the controller hands it (attempt "0").
            event_url = f"/api/rollouts/{rid}/attempt/0/events"
            with AgentLightningSyncClient(key=key, base_url=base, max_retries=1, timeout=20) as agent:
                agent.post_with_retry(event_url, json={"event_type": "model_request", "data": {
                    "model": "policy", "model_version": 1, "request": {"model": "policy"},
                    "response": {"id": f"chatcmpl-{rid}", "model": "policy", "prompt_token_ids": [11, 12, 13],
                                 "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [21, 22],
                                              "message": {"role": "assistant", "content": "4"}}]}}})
                agent.post_with_retry(event_url, json={"event_type": "reward", "data": {"value": 0.5}})
                agent.post_with_retry(event_url, json={"event_type": "reward", "data": {"value": reward}})
            patched.append(await rec._patch(rid, RolloutState.SUCCEEDED, last_attempt_id="0"))  # its _finish_proc, exit 0
        patched.append(await rec._patch(out["val"], RolloutState.FAILED, "local subprocess spawn failed: no agent"))
        out["left"] = await listed(api)
        return patched

out["patched"] = asyncio.run(controller_and_agents())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def al1_python() -> Path:
    try:
        return ensure_venv_1x()
    except ALInstallError as exc:
        pytest.fail(f"Agent Lightning 1.x is needed for this test and could not be installed: {exc}")


@pytest.fixture
def gateway_url(test_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    base, proc = start_gateway({**test_env, "ROLLOUTBUS_GATEWAY_MAX_BODY_BYTES": "200000"}, tmp_path / "gw", token=TOKEN)
    yield base
    proc.terminate()
    proc.wait(30)


def models(base: str, want_version: int) -> list[dict[str, Any]]:
    """``GET /api/models`` until it lists ``want_version`` first (503 while rb.resources is read)."""
    deadline = time.monotonic() + 30
    while True:
        resp = requests.get(f"{base}/api/models", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        if resp.status_code == 200 and resp.json() and resp.json()[0]["version"] == want_version:
            return resp.json()
        assert resp.status_code in (200, 503) and time.monotonic() < deadline, (resp.status_code, resp.text)
        time.sleep(0.3)


def policy(version: int) -> ResourceVersion:
    return ResourceVersion(name="policy", version=version, kind="model", uri=f"/ckpt/{version}", base_model="tiny",
                           created_ns=time.time_ns(), config={"endpoint": "http://proxy:8788", "model": "policy"})


def test_agent_lightning_1x_rollouts_created_patched_and_finished_on_the_bus(
    al1_python: Path, gateway_url: str, kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str]
) -> None:
    base = gateway_url
    produce(kafka_conf, topics.resources, [("policy", codec.encode(policy(1)))])
    assert models(base, 1) == [{"model": "policy", "endpoint": "http://proxy:8788", "version": 1}]

    rewards = {"ro-api-1": 1.0, "ro-api-2": 0.0}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}, **ENV}
    run = subprocess.run([str(al1_python), "-c", DRIVER, base, TOKEN, json.dumps(rewards)], env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["models"] == [{"model": "policy", "endpoint": "http://proxy:8788", "version": 1}], "its Model shape"
    assert got["created"] == [["ro-api-1", "queuing", 600], ["ro-api-2", "queuing", 600]], "its Rollout, queuing"
    assert len(got["val"]) == 32, "an id the server made (uuid4 hex, as its server does)"
    assert got["queued"] == {"ro-api-1": "queuing", "ro-api-2": "queuing", got["val"]: "queuing"}, "its controller's queue"
    assert got["patched"] == [True] * 5, "every patch its controller sent was answered 2xx"
    assert got["running"] == ["running", "running"] and got["left"] == {}, "a patch to running claims it; ended ones leave"

    # On rb.spans: a STARTED per claim (attempt "0"), the events as spans, a FINISHED per terminal patch.
    records = consume_all(kafka_conf, topics.spans, expect=3 + 2 * 3 + 3, timeout=30)
    events = [(rec["rollout_id"], rec["attempt_id"], rec["event"]) for _k, name, rec, _p in records
              if name.endswith("RolloutEvent")]
    assert sorted(events) == sorted([(r, "0", e) for r in rewards for e in ("STARTED", "FINISHED")] +
                                    [(got["val"], "0", "STARTED"), (got["val"], "0", "FINISHED")])
    started = {rec["rollout_id"]: rec for _k, name, rec, _p in records if name.endswith("RolloutEvent") and rec["event"] == "STARTED"}
    assert started["ro-api-1"]["task_id"] == started["ro-api-2"]["task_id"], "one sample, one task"
    assert started["ro-api-1"]["resource_version"] == 1 and started[got["val"]]["mode"] == "val"

    # Its store's reads answer at once (the control records): the rollout ended, its events, its terminal log.
    auth = {"Authorization": f"Bearer {TOKEN}"}
    resp = requests.get(f"{base}/api/rollouts/ro-api-1", headers=auth, timeout=5)
    assert resp.status_code == 200 and resp.json()["rollout"]["status"]["state"] == "succeeded", resp.text
    assert resp.json()["rollout"]["input"] == {"question": "2+2?", "answer": "4"}
    resp = requests.get(f"{base}/api/rollouts/ro-api-1/events", params={"format": "triplet"}, headers=auth, timeout=5)
    assert resp.status_code == 200 and [e["event_type"] for e in resp.json()] == ["model_request", "reward", "reward"]
    assert resp.json()[0]["data"]["prompt_token_ids"] == [11, 12, 13] and resp.json()[2]["data"] == {"value": 1.0}
    terminal = requests.get(f"{base}/api/rollouts/terminal", headers=auth, timeout=5).json()
    assert {it["rollout_id"] for it in terminal["items"]} == {*rewards, got["val"]}
    resp = requests.post(f"{base}/api/models", json=[{"model": "m", "endpoint": "http://x/v1"}], headers=auth, timeout=5)
    assert resp.status_code == 201 and resp.json() == [{"model": "m", "endpoint": "http://x/v1", "version": 0}]
    # Calls it has not: 501 naming the call; bad bodies are one-line 400s, never 500.
    resp = requests.post(f"{base}/api/anything/else", headers=auth, timeout=5)
    assert resp.status_code == 501 and "POST /api/anything/else" in resp.json()["detail"]
    for body in (b"{not json", b"[" * 100_000 + b"]" * 100_000, b"[" * 70 + b"]" * 70):
        for method, path in (("POST", "/api/rollouts"), ("PATCH", "/api/rollouts/ro-x")):
            resp = requests.request(method, f"{base}{path}", data=body, headers={**auth, "Content-Type": "application/json"},
                                    timeout=5)
            assert resp.status_code == 400 and "\n" not in resp.json()["detail"], (method, body[:20], resp.text[:300])
    resp = requests.post(f"{base}/api/rollouts", json=[{"is_train": True}], headers=auth, timeout=5)
    assert resp.status_code == 422 and "item 0 has no input" in resp.json()["detail"]
    assert requests.post(f"{base}/api/rollouts", json=[{"input": 1}], timeout=5).status_code == 401
    assert requests.patch(f"{base}/api/rollouts/ro-api-1", json={"status": {"state": "failed"}}, timeout=5).status_code == 401
    assert requests.get(f"{base}/api/models", timeout=5).status_code == 401

    # The stream worker finishes them: rewards are the last reward events, the two train rollouts one group.
    proc = start_worker(test_env, "--group-size", "2", "--finish-grace", "3")
    got_batches = batches(kafka_conf, topics.batches, 1, proc, timeout=90)
    time.sleep(8)  # the validation rollout's finish grace (3 s) and a sink flush: one process owns the embedded store
    rc, log = stop_worker(proc)
    rows = query(test_env, {"ro": "SELECT rollout_id, attempt_id, status, mode, resource_version, final_reward, error "
                                  "FROM rollouts FINAL ORDER BY mode, rollout_id"})["ro"]
    assert rc == 0 and len(got_batches) == 1, log[-3000:]
    batch = got_batches[0]
    assert batch.group_id == f"{started['ro-api-1']['task_id']}@1" and batch.complete
    assert dict(zip(batch.rollout_ids, batch.rewards)) == rewards, "the last reward event of each"
    assert rows == [["ro-api-1", "0", "succeeded", "train", 1, 1.0, None], ["ro-api-2", "0", "succeeded", "train", 1, 0.0, None],
                    [got["val"], "0", "failed", "val", 1, None, "local subprocess spawn failed: no agent"]]

    # A version published on rb.resources is listed, latest first.
    produce(kafka_conf, topics.resources, [("policy", codec.encode(policy(2)))])
    assert models(base, 2) == [{"model": "policy", "endpoint": "http://proxy:8788", "version": 2}]
