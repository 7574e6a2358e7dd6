"""APO and GRPO on one bus, with the real model, the real broker and the real ClickHouse engine.

The SQL agent's prompt is a ``prompt_template`` resource (version 0: a weak prompt, no worked
examples). GRPO takes a turn first: a training group is run and the trainer publishes policy version 1.
Then ``rolloutbus optimize-prompt`` takes its turn: the incumbent and one hand-written candidate are
scored by the ordinary runners on validation tasks (mode ``test``), the served SmolLM2 critiques the
better one's trajectories (read from ClickHouse) and rewrites it, the rewrite is scored too, the best
is published as prompt version 1, and the next rollout uses it. ClickHouse holds the record of every
candidate and, for every rollout, the prompt version and the weight version it used.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rolloutbus.demo import sql
from schemas import ResourceVersion, Task, encode
from tests.faults.faultkit import store
from tests.integration.streams.helpers import query, start_worker, stop_worker
from tests.integration.trainer.realmodel import REPO, import_smollm2, port, start, stop_all, wait_http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# Version 0: no worked examples, no instruction to write SQL (the schema is still appended).
WEAK = {"template": "Answer the question.", "examples": "[]"}
# Questions the model with the built-in prompt answers right greedily, and without examples does not.
VAL = ["L1-count", "L1-depts", "L2-budget-Sales", "L2-budget-Finance", "L2-deptcity-Boston", "L1-names"]


def _publish(conf: dict[str, Any], topic: str, key: str, value: bytes) -> None:
    from confluent_kafka import Producer

    p = Producer({**conf, "log_level": 0})
    p.produce(topic, value, key.encode())
    assert p.flush(10) == 0


def _wait_for(env: dict[str, str], sql_text: str, want: int, timeout: float, procs: list[subprocess.Popen[bytes]], logs: Path) -> int:
    deadline = time.monotonic() + timeout
    got = 0
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() in (None, 0), f"{p.args} exited: " + "\n".join(f.read_text()[-1500:] for f in logs.glob("*.log"))
        got = int(query(env, {"n": sql_text})["n"][0][0])
        if got >= want:
            return got
        time.sleep(2)
    return got


def test_apo_and_grpo_take_turns_and_every_rollout_records_both_versions(
    kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path
) -> None:
    model_dir = import_smollm2()
    logs = tmp_path / "logs"
    logs.mkdir()
    store_proc, dsn = store(test_env, tmp_path / "store", logs / "store.log")
    env = {**test_env, "PYTHONPATH": str(REPO), "ROLLOUTBUS_CLICKHOUSE_DSN": dsn, "ROLLOUTBUS_TORCH_THREADS": "1",
           "ROLLOUTBUS_AGENT_TEMPERATURE": "0"}
    serve_port, proxy_port = port(), port()
    serve, proxy = f"http://127.0.0.1:{serve_port}/v1", f"http://127.0.0.1:{proxy_port}"
    by_id = {q.qid: q for q in sql.questions()}
    procs: list[subprocess.Popen[bytes]] = []
    worker = None
    try:
        _publish(kafka_conf, topics.resources, "prompt",
                 encode(ResourceVersion(name="prompt", version=0, kind="prompt_template", created_ns=time.time_ns(), config=WEAK)))
        s = start(["serve", "--model", str(model_dir), "--port", str(serve_port), "--max-batch", "16"], env, logs / "serve.log", procs)
        p = start(["proxy", "--upstream", serve, "--port", str(proxy_port)], env, logs / "proxy.log", procs)
        worker = start_worker(env, "--group-size", "4", "--group-min-rollouts", "2", "--group-timeout", "240")
        start(["train", "--model", str(model_dir), "--groups-per-step", "1", "--max-steps", "1", "--train-layers", "1",
               "--max-staleness", "4", "--threads", "1"], env, logs / "train.log", procs)
        start(["run-agent", "rolloutbus.demo.sql_agent:SQLAgent", "--concurrency", "8", "--max-attempts", "1", "--timeout", "600"],
              {**env, "ROLLOUTBUS_LLM_PROXY_URL": proxy}, logs / "runners.log", procs)
        wait_http(f"{serve}/models", s, logs / "serve.log")
        wait_http(f"{proxy}/healthz", p, logs / "proxy.log")

        # GRPO's turn: one group under prompt version 0 → the trainer publishes policy version 1.
        q = by_id["L2-budget-Support"]
        _publish(kafka_conf, topics.tasks, "grpo-0", encode(Task(task_id="grpo-0", input=q.to_json(), mode="train", group_size=4,
                                                                 created_ns=time.time_ns())))
        got = _wait_for(env, "SELECT count() FROM resource_versions FINAL WHERE name = 'policy' AND version >= 1", 1, 420, procs, logs)
        assert got == 1, f"the trainer published no version 1: {(logs / 'train.log').read_text()[-3000:]}"

        # APO's turn: the served model is the optimizer LLM; one hand-written candidate joins the incumbent.
        (tmp_path / "val.jsonl").write_text("".join(json.dumps({"input": by_id[qid].to_json()}) + "\n" for qid in VAL))
        (tmp_path / "mine.json").write_text(json.dumps([sql.prompt_config()]))
        apo = subprocess.run(
            [sys.executable, "-m", "rolloutbus.cli", "optimize-prompt", str(tmp_path / "val.jsonl"), "--candidates", str(tmp_path / "mine.json"),
             "--llm-url", serve, "--beam-width", "1", "--branch", "1", "--rounds", "1", "--run-id", "apo-test",
             "--score-timeout", "300", "--out", str(tmp_path / "summary.json")],
            env=env, capture_output=True, text=True, timeout=600)
        assert apo.returncode == 0, apo.stdout[-3000:] + apo.stderr[-3000:]
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert "published  prompt version 1" in apo.stdout, apo.stdout[-3000:]

        # The runners switch: the next rollout (no override) uses prompt version 1 and policy version 1.
        _publish(kafka_conf, topics.tasks, "after-0", encode(Task(task_id="after-0", input=by_id["L1-count"].to_json(), mode="test",
                                                                  created_ns=time.time_ns())))
        got = _wait_for(env, "SELECT count() FROM rollouts FINAL WHERE task_id = 'after-0' AND finished_ns > 0", 1, 180, procs, logs)
        assert got == 1, (logs / "runners.log").read_text()[-3000:]
    finally:
        stop_all(procs)
        if worker is not None:
            stop_worker(worker)
    rows = query({**env, "ROLLOUTBUS_CLICKHOUSE_DSN": dsn}, {
        "cands": "SELECT candidate_id, source, round, parent_id, template, critique, score, tasks, finished, published_version, note "
                 "FROM prompt_candidates FINAL WHERE run_id = 'apo-test' ORDER BY created_ns, candidate_id",
        "prompt": "SELECT version, kind, config['template'], config['examples'], config['apo.candidate'] FROM resource_versions FINAL "
                  "WHERE name = 'prompt' ORDER BY version",
        "val": "SELECT metadata['apo.candidate'], count(), countIf(mode = 'test'), any(metadata['resource.prompt']) FROM rollouts FINAL "
               "WHERE metadata['apo.run'] = 'apo-test' GROUP BY 1 ORDER BY 1",
        "versions": "SELECT task_id, resource_version, prompt_version, resources['resource.policy'] FROM v_rollout_resources "
                    "WHERE task_id IN ('grpo-0', 'after-0') ORDER BY task_id",
        "groups": "SELECT count() FROM groups FINAL WHERE task_id LIKE 'apo-test%'",
    })
    store_proc.terminate()
    cands = {r[0]: r for r in rows["cands"]}
    inc, mine = cands["apo-test-v0"], cands["apo-test-u1"]
    made = [r for r in rows["cands"] if r[1] == "optimizer"]
    # Every candidate is recorded: the incumbent, yours, and one written by the served model from a critique.
    assert inc[1] == "incumbent" and mine[1] == "user" and len(made) == 1
    child = made[0]
    assert child[2] == 1 and child[3] == "apo-test-u1", "round 1 expanded the better of round 0"
    assert child[5].strip() and child[4].strip(), "the served model wrote a critique and a rewritten prompt"
    # Scored through the runners: six validation rollouts each, in mode test, under the candidate.
    for r in (inc, mine) + ((child,) if not child[10].startswith("rejected") else ()):
        assert r[6] is not None and r[7] == len(VAL) and r[8] == len(VAL), r
    val = {r[0]: r[1:] for r in rows["val"]}
    assert val["apo-test-v0"] == [len(VAL), len(VAL), "0"], "the incumbent's rollouts record its version"
    assert val["apo-test-u1"] == [len(VAL), len(VAL), "apo-test-u1"], "a candidate's rollouts record the candidate"
    assert rows["groups"][0][0] == 0, "validation rollouts never become training groups"
    # The best beats the incumbent and is published as version 1, with its record saying so.
    assert inc[6] < max(r[6] for r in rows["cands"] if r[6] is not None)
    best = max((r for r in rows["cands"] if r[6] is not None), key=lambda r: r[6])
    assert best[9] == 1 and summary["published_candidate"] == best[0]
    prompt = {r[0]: r for r in rows["prompt"]}
    assert prompt[1][1] == "prompt_template" and prompt[1][2] == best[4] and prompt[1][4] == best[0]
    # Both algorithms' versions on every rollout: GRPO's group under prompt 0, the next rollout under prompt 1.
    versions = {r[0]: r[1:] for r in rows["versions"]}
    assert versions["grpo-0"][1] == "0"
    assert versions["after-0"] == [1, "1", "1"], "policy version 1 and prompt version 1"
