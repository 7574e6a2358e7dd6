"""Agent Lightning 0.3's own runner against the gateway as its LightningStore (``/v1/agl``): the store URL
is the only change. Its runner fetches resources from rb.resources, its tracer's spans and the reward
span it makes of the agent's returned float land on rb.spans, its ``update_attempt`` ends the attempt,
and the two rollouts form a GRPO group whose rewards are those floats.

The rollouts are handed to its runner as its store's dequeue would (and their STARTED events produced
as ours would be): the queue calls are not on the bus yet and answer 501, which this test checks too.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from al_venv import ENV, ALInstallError, ensure_venv
from producers_testkit import consume_all, start_gateway
from schemas import codec
from schemas.models import ResourceVersion, RolloutEvent
from tests.integration.streams.helpers import batches, produce, query, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
DRIVER = Path(__file__).resolve().parent / "al_store_driver.py"
PROXY = "http://proxy.example:8788/v1"


@pytest.fixture(scope="module")
def al_python() -> Path:
    try:
        return ensure_venv()
    except ALInstallError as exc:
        pytest.fail(f"Agent Lightning is needed for this test and could not be installed: {exc}")


@pytest.fixture
def store_url(test_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    # Its LightningStoreClient sends no token: this gateway has none (see README).
    base, proc = start_gateway(test_env, tmp_path / "gw")
    yield base
    proc.terminate()
    proc.wait(30)


def test_agent_lightning_runner_with_the_gateway_as_its_store(
    al_python: Path, store_url: str, kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path
) -> None:
    agl = f"{store_url}/v1/agl"
    policy = ResourceVersion(name="policy", version=1, kind="model", uri="/ckpt/1", base_model="tiny", created_ns=time.time_ns(),
                             config={"endpoint": PROXY})
    produce(kafka_conf, topics.resources, [("policy", codec.encode(policy))])
    assert requests.get(f"{agl}/health", timeout=5).json() == {"status": "ok"}
    deadline = time.monotonic() + 30
    while (resp := requests.get(f"{agl}/resources/latest", timeout=5)).status_code == 503:  # rb.resources being read
        assert time.monotonic() < deadline, resp.text
        time.sleep(0.5)
    assert resp.status_code == 200 and resp.json()["resources_id"] == "policy=1"

    # What the queue would do at dequeue: the attempts STARTED for one task.
    rollouts = [("ro-agl-s1", "at-s1", 1.0), ("ro-agl-s2", "at-s2", 0.0)]
    produce(kafka_conf, topics.spans, [(r, codec.encode(RolloutEvent(rollout_id=r, attempt_id=a, event="STARTED",
                                                                      time_ns=time.time_ns(), task_id="agl-store-task",
                                                                      resource_version=1)))
                                       for r, a, _ in rollouts])

    out = tmp_path / "al.json"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}, **ENV}
    run = subprocess.run([str(al_python), str(DRIVER), store_url, str(out), *(f"{r}:{a}:{w}" for r, a, w in rollouts)],
                         env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and out.exists(), run.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["resources_id"] == "policy=1"
    for r, a, _ in rollouts:  # its ProxyLLM routes each attempt to the proxy's per-rollout URL
        assert got["seen"][r] == {"resource_type": "proxy_llm", "model": "tiny",
                                  "base_url": f"http://proxy.example:8788/rollout/{r}/attempt/{a}/v1"}

    # On rb.spans: per rollout 2 LLM spans (OTLP), the reward span (/spans) and FINISHED (update_attempt).
    records = consume_all(kafka_conf, topics.spans, expect=2 + 2 * 4, timeout=30)
    finished = [rec for _k, name, rec, _p in records if name.endswith("RolloutEvent") and rec["event"] == "FINISHED"]
    assert sorted((f["rollout_id"], f["status"], f["final_reward"], f["span_count"]) for f in finished) == [
        ("ro-agl-s1", "succeeded", None, 0), ("ro-agl-s2", "succeeded", None, 0)]
    spans = [rec for _k, name, rec, _p in records if name.endswith("Span")]
    assert sorted(s["kind"] for s in spans) == ["llm"] * 4 + ["reward"] * 2
    assert {s["sequence_id"] for s in spans} == {0}, "numbered by the span stage, not by a gateway"

    # The calls that are not on the bus say so, naming the call.
    resp = requests.post(f"{agl}/queues/rollouts/dequeue", json={"limit": 1}, timeout=5)
    assert resp.status_code == 501 and "POST /v1/agl/queues/rollouts/dequeue" in resp.json()["detail"]

    proc = start_worker(test_env, "--group-size", "2", "--finish-grace", "3")
    got_batches = batches(kafka_conf, topics.batches, 1, proc, timeout=60)
    rc, log = stop_worker(proc)
    assert rc == 0 and len(got_batches) == 1, log[-3000:]
    batch = got_batches[0]
    assert batch.group_id == "agl-store-task@1" and batch.complete
    assert dict(zip(batch.rollout_ids, batch.rewards)) == {"ro-agl-s1": 1.0, "ro-agl-s2": 0.0}, "the floats its agent returned"
    assert dict(zip(batch.rollout_ids, batch.advantages)) == pytest.approx({"ro-agl-s1": 1.0, "ro-agl-s2": -1.0}, abs=1e-5)
    assert len(batch.transitions) == 4

    rows = query(test_env, {
        "ro": "SELECT rollout_id, status, task_id, final_reward, spans_seen, missing_sequence_ids FROM rollouts FINAL ORDER BY rollout_id",
        "seq": "SELECT rollout_id, groupArray(sequence_id) FROM (SELECT rollout_id, sequence_id FROM spans FINAL "
               "ORDER BY rollout_id, kafka_offset) GROUP BY rollout_id ORDER BY rollout_id",
    })
    assert rows["ro"] == [["ro-agl-s1", "succeeded", "agl-store-task", 1.0, 3, []],
                          ["ro-agl-s2", "succeeded", "agl-store-task", 0.0, 3, []]]
    assert rows["seq"] == [["ro-agl-s1", [1, 2, 3]], ["ro-agl-s2", [1, 2, 3]]]
