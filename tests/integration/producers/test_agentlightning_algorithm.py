"""An Agent Lightning algorithm end to end against the gateway: 0.3.0's own ``Baseline`` with its own ``Trainer``,
the store URL the only change (al_algorithm_driver.py, in its virtualenv). It enqueues a task of this project's
(sums) per sample, its runner runs them, it sees each rollout end (``get_rollout_by_id``: the control records, at
once) and reads its attempts and spans; the stream worker stores them in ClickHouse with the agent's rewards."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from al_venv import ENV, ALInstallError, ensure_venv
from producers_testkit import clickhouse_server_env, start_gateway
from schemas import codec
from schemas.models import ResourceVersion
from tests.integration.streams.helpers import produce, query, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
DRIVER = Path(__file__).resolve().parent / "al_algorithm_driver.py"
TOKEN = "s3cret-algo"


@pytest.fixture
def env(test_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    yield from clickhouse_server_env(test_env, tmp_path)


def test_agent_lightning_baseline_algorithm_runs_with_the_gateway_as_its_store(env: dict[str, str], kafka_conf: dict[str, Any],
                                                                              topics: Any, tmp_path: Path) -> None:
    try:
        python = ensure_venv()
    except ALInstallError as exc:
        pytest.fail(f"Agent Lightning is needed for this test and could not be installed: {exc}")
    policy = ResourceVersion(name="policy", version=1, kind="model", uri="/ckpt/1", base_model="tiny", created_ns=time.time_ns(),
                             config={"endpoint": "http://proxy.example:8788/v1"})
    produce(kafka_conf, topics.resources, [("policy", codec.encode(policy))])
    base, gw = start_gateway(env, tmp_path / "gw", token=TOKEN)
    worker = start_worker(env, "--group-size", "1", "--finish-grace", "2")
    try:
        out = tmp_path / "algo.json"
        al_env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}, **ENV}
        run = subprocess.run([str(python), str(DRIVER), base.replace("http://", f"http://agl:{TOKEN}@"), str(out)],
                             env=al_env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and out.exists(), (run.stdout + run.stderr)[-6000:]
        lines = json.loads(out.read_text())["lines"]
        print("ALGORITHM LOG\n" + "\n".join(lines))
        enqueued = [ln for ln in lines if ln.startswith("Enqueued rollout")]
        assert [("train mode" in ln, "val mode" in ln) for ln in enqueued] == [(True, False)] * 2 + [(False, True)] * 2, lines
        assert sum("Finished with status succeeded" in ln for ln in lines) == 4 and "Finished 4 rollouts." in lines, lines
        # It read each one's attempt (ended) and spans (the reward span its runner made) once it saw it end.
        assert sum(" Status: succeeded." in ln for ln in lines) == 4, lines
        assert sum("agentlightning.reward.0.value" in ln for ln in lines) == 4, lines
        time.sleep(6)  # the worker's finish grace and a sink flush
    finally:
        rc, log = stop_worker(worker)
        gw.terminate()
        gw.wait(30)
    rows = query(env, {"ro": "SELECT mode, status, final_reward FROM rollouts FINAL ORDER BY mode, final_reward"})["ro"]
    assert rc == 0, log[-2000:]
    assert rows == [["train", "succeeded", 0.0], ["train", "succeeded", 1.0], ["val", "succeeded", 0.0],
                    ["val", "succeeded", 1.0]], "the agent's rewards: right sums 1.0, the slipped ones 0.0"
