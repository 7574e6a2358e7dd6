"""Agent Lightning 0.3's own client and runner against the gateway as its LightningStore (``/v1/agl``): the
store URL is the only change, ``http://agl:<token>@gateway:port`` for a gateway with a token (its aiohttp
client and its OTLP exporter send the URL's userinfo as HTTP Basic). Its client enqueues rollouts (task records on rb.tasks), its runner dequeues
them and a group task published on rb.tasks, fetches resources from rb.resources; its tracer's spans and
the reward span it makes of the agent's returned float land on rb.spans, its ``update_attempt`` ends each
attempt; the stream worker stores them, the group task's two rollouts form a GRPO group whose rewards are
those floats, and its client reads every rollout back, ended with its reward, from ClickHouse through the
gateway, waits for them (``wait_for_rollouts``), and publishes resources (``add_resources``,
``update_resources``) that the gateway then answers as the latest.
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
from producers_testkit import clickhouse_server_env, consume_all, start_gateway
from schemas import codec
from schemas.models import ResourceVersion, Task
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
def env(test_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """One ClickHouse store for the stream worker (writes) and the gateway (reads, read-only)."""
    yield from clickhouse_server_env(test_env, tmp_path)


TOKEN = "s3cret-agl"


@pytest.fixture
def store_url(env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """The one URL its client is given: the gateway's, with the token as the password of its userinfo."""
    base, proc = start_gateway(env, tmp_path / "gw", token=TOKEN)
    yield base.replace("http://", f"http://agl:{TOKEN}@")
    proc.terminate()
    proc.wait(30)


def test_agent_lightning_client_and_runner_with_the_gateway_as_its_store(
    al_python: Path, store_url: str, kafka_conf: dict[str, Any], topics: Any, env: dict[str, str], tmp_path: Path
) -> None:
    agl = f"{store_url}/v1/agl"
    policy = ResourceVersion(name="policy", version=1, kind="model", uri="/ckpt/1", base_model="tiny", created_ns=time.time_ns(),
                             config={"endpoint": PROXY})
    produce(kafka_conf, topics.resources, [("policy", codec.encode(policy))])
    assert requests.get(f"{agl}/health", timeout=5).json() == {"status": "ok"}
    bare = agl.replace(f"agl:{TOKEN}@", "")
    assert requests.get(f"{bare}/resources/latest", timeout=5).status_code == 401, "the token is needed"
    deadline = time.monotonic() + 30
    # rb.resources being read (503); null while its follower, ready after a first empty poll, has not fetched yet
    while (resp := requests.get(f"{agl}/resources/latest", timeout=5)).status_code == 503 or resp.json() is None:
        assert time.monotonic() < deadline, resp.text
        time.sleep(0.5)
    assert resp.status_code == 200 and resp.json()["resources_id"] == "policy=1"

    # A train task of two rollouts (one GRPO group) published as `rolloutbus tasks publish` does; the agent
    # returns 1.0 for the first of them it runs, 0.0 for the second.
    group = Task(task_id="agl-store-task", input=json.dumps({"id": "g", "rewards": [1.0, 0.0]}), group_size=2,
                 created_ns=time.time_ns())
    produce(kafka_conf, topics.tasks, [(group.task_id, codec.encode(group))])
    worker = start_worker(env, "--group-size", "2", "--finish-grace", "3")

    out = tmp_path / "al.json"
    al_env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}, **ENV}
    run = subprocess.run([str(al_python), str(DRIVER), store_url, str(out), "2", "0.5", "0.25"],
                         env=al_env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0 and out.exists(), run.stderr[-4000:]
    got = json.loads(out.read_text())
    enqueued = {r["rollout_id"]: r for r in got["enqueued"]}
    assert [(r["status"], r["input"], r["resources_id"]) for r in got["enqueued"]] == [
        ("queuing", {"reward": 0.5}, "policy=1"), ("queuing", {"reward": 0.25}, "policy=1")]
    assert got["resources_id"] == "policy=1"
    seen = got["seen"]
    assert len(seen) == 4 and set(enqueued) < set(seen), "its runner dequeued the two it enqueued and the group's two"
    grouped = sorted(set(seen) - set(enqueued))
    assert sorted(seen[r]["reward"] for r in grouped) == [0.0, 1.0]
    for r, s in seen.items():  # its ProxyLLM routes each attempt to the proxy's per-rollout URL
        assert s["resource_type"] == "proxy_llm" and s["model"] == "tiny" and s["attempt"] == 1
        assert s["base_url"].startswith(f"http://proxy.example:8788/rollout/{r}/attempt/at-")

    # On rb.spans: per rollout STARTED (dequeue), 2 LLM spans (OTLP), the reward span (/spans), FINISHED (update_attempt).
    records = consume_all(kafka_conf, topics.spans, expect=4 * 5, timeout=30)
    events = sorted((rec["event"], rec["rollout_id"]) for _k, name, rec, _p in records if name.endswith("RolloutEvent"))
    assert events == sorted([("STARTED", r) for r in seen] + [("FINISHED", r) for r in seen])
    spans = [rec for _k, name, rec, _p in records if name.endswith("Span")]
    assert sorted(s["kind"] for s in spans) == ["llm"] * 8 + ["reward"] * 4
    assert {s["sequence_id"] for s in spans} == {0}, "numbered by the span stage, not by a gateway"

    # Its client read each rollout back from ClickHouse through the gateway: ended, with its attempt and spans.
    for r in seen:
        read = got["reads"][r]
        assert read["status"] == "succeeded" and read["attempt_status"] == "succeeded", (r, read)
        assert read["latest"][:2] == [1, "succeeded"] and read["attempts_total"] == 1
        assert len(read["spans"]) == 3 and read["spans"].count("openai.chat.completion") == 2
    assert got["query_rollouts"] == {"ids": sorted(seen), "total": 4}

    got_batches = batches(kafka_conf, topics.batches, 1, worker, timeout=60)
    rc, log = stop_worker(worker)
    assert rc == 0 and len(got_batches) >= 1, log[-3000:]
    [batch] = [b for b in got_batches if b.group_id == "agl-store-task@1"]
    assert batch.complete
    assert dict(zip(batch.rollout_ids, batch.rewards)) == {r: seen[r]["reward"] for r in grouped}, "the floats its agent returned"
    assert sorted(batch.advantages) == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert len(batch.transitions) == 4

    rows = query(env, {
        "ro": "SELECT rollout_id, status, task_id, final_reward, spans_seen, missing_sequence_ids FROM rollouts FINAL ORDER BY rollout_id",
    })
    want = [[r, "succeeded", "agl-store-task" if r in grouped else r, seen[r]["reward"], 3, []] for r in sorted(seen)]
    assert rows["ro"] == want, "each rollout finished with its reward in ClickHouse (an enqueued one is its own task)"

    # It waited for them: all four finished (an unknown id is left out, as its store leaves it).
    assert sorted(got["waited"]) == sorted([r, "succeeded"] for r in seen)
    # Its add_resources / update_resources published versions on rb.resources, answered as the newest set.
    assert got["added"][:2] == ["judge=1,policy=1", 1] and got["updated"][:2] == ["judge=2,policy=1", 2]
    assert got["added"][2] == got["updated"][2] == {"resource_type": "llm", "endpoint": "http://judge:8000/v1",
                                                    "model": "judge", "api_key": None, "sampling_parameters": {}}
    assert got["latest_after"] == "judge=2,policy=1"
    judged = [rec for _k, name, rec, _p in consume_all(kafka_conf, topics.resources, expect=3, timeout=30)
              if rec["name"] == "judge"]
    assert [(r["version"], r["kind"], r["config"]["endpoint"]) for r in judged] == [
        (1, "model", "http://judge:8000/v1"), (2, "model", "http://judge:8000/v1")]

    # query_resources: the sets it served or named, in that order; an older one still answers by its id. A call with
    # no meaning on the bus says so, naming the call.
    listed = requests.get(f"{agl}/resources", timeout=5).json()
    assert [u["resources_id"] for u in listed["items"]] == ["policy=1", "judge=1,policy=1", "judge=2,policy=1"]
    assert requests.get(f"{agl}/resources/judge=1,policy=1", timeout=5).json()["resources_id"] == "judge=1,policy=1"
    resp = requests.get(f"{agl}/queues/rollouts/peek", timeout=5)
    assert resp.status_code == 501 and "GET /v1/agl/queues/rollouts/peek" in resp.json()["detail"]
