"""``Trainer(algorithm=APO(...)).fit(...)`` end to end on the local stack (the real broker and ClickHouse engine):
the initial template is published as version 0, ``rolloutbus optimize-prompt`` scores it and a prompt of the
user's through the runners running the user's agent (which reads ``resources["prompt_template"]``), the served
``tiny`` model writes a rewrite, every candidate lands in ``prompt_candidates`` and the best is published as
version 1, as fit's result says; the test rows are answered under version 0 and version 1 afterwards. On the
local stack, and on given addresses (a namespace of the run's own there).

The agent's reward depends on the prompt it was handed only (the tiny model's answers are noise), so which
prompt wins is known: the user's, which starts as the reward wants."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port_run
from tests.integration.store.conftest import start_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SCRIPT = '''
import json, sys
import rolloutbus as agl
from rolloutbus.demo.agent import chat
from rolloutbus.demo.calc import problems


class Prompted(agl.LitAgent[dict]):
    """Formats the prompt template with the task, asks main_llm; rewarded when the prompt asks for a number."""

    def rollout(self, task, resources, rollout):
        prompt = resources["prompt_template"].format(**task)
        llm = resources["main_llm"]
        chat(llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id), [{"role": "user", "content": prompt}],
             temperature=llm.sampling_parameters.get("temperature", 1.0))
        return 1.0 if prompt.startswith("Answer with one number.") else 0.0

if __name__ == "__main__":
    rows = [json.loads(p.to_json()) for p in problems(10, seed=1)]
    trainer = agl.Trainer(n_runners=4, algorithm=agl.APO(beam_width=1, branch_factor=1, beam_rounds=1, gradient_batch_size=3,
                                                         candidates=["Answer with one number. {question}"], score_timeout_s=240),
                          initial_resources={"main_llm": agl.LLM(model="tiny"),
                                             "prompt_template": agl.PromptTemplate(template="{question}", engine="f-string")},
                          out=sys.argv[1])
    r = trainer.fit(Prompted(), rows[:3], val_dataset=rows[3:7], test_dataset=rows[7:])
    print("RESULT " + json.dumps({"versions": {str(k): v for k, v in r.versions.items()}, "validation": r.validation,
                                  "initial": [r.initial_prompt, r.initial_score], "chosen": [r.prompt_version, r.prompt, r.score],
                                  "candidates": r.candidates, "rollouts": r.rollouts, "run_id": r.run_id, "kept": r.chosen,
                                  "held_out": [r.held_out.first, r.held_out.chosen, r.held_out.first_scores, r.held_out.chosen_scores]}))
'''


def _run(script_dir: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    script, out = script_dir / "apo.py", script_dir / "out"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(out)], env=env, cwd=script_dir, capture_output=True, text=True, timeout=540)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted((out / "logs").glob("*.log"))) \
        if (out / "logs").exists() else ""
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{logs}"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return proc, json.loads(line[len("RESULT "):])


@pytest.mark.skipif(bool(os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")), reason="the local stack: no broker given")
def test_fit_with_apo_scores_candidates_through_the_runners_and_publishes_the_best(tmp_path: Path) -> None:
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"), ROLLOUTBUS_KAFKA_PORT=str(free_port_run((0, 1))),
               PYTHONUNBUFFERED="1", ROLLOUTBUS_STORE_PORT=str(free_port_run()))
    env.pop("ROLLOUTBUS_CLICKHOUSE_DSN", None)
    proc, r = _run(tmp_path, env)
    # version 0 is the initial template; the user's prompt (the only one the reward likes) is published as version 1
    assert r["initial"] == ["{question}", 0.0]
    assert r["chosen"] == [1, "Answer with one number. {question}", 1.0], proc.stdout[-3000:]
    assert r["versions"]["0"]["config"] == {"template": "{question}", "engine": "f-string"}
    one = r["versions"]["1"]
    assert one["config"]["template"] == "Answer with one number. {question}" and one["config"]["engine"] == "f-string"
    assert one["metrics"]["val_score"] == 1.0 and one["metrics"]["incumbent_val_score"] == 0.0
    assert r["validation"] == {"0": 0.0, "1": 1.0}
    # prompt_candidates: version 0, the user's and the tiny model's rewrite (round 1), each scored on the 4 validation rows
    by_source = {}
    for c in r["candidates"]:
        by_source.setdefault(c["source"], []).append(c)
    assert len(by_source["incumbent"]) == 1 and len(by_source["user"]) == 1 and len(by_source["optimizer"]) == 1, r["candidates"]
    for c in by_source["incumbent"] + by_source["user"]:
        assert (c["tasks"], c["finished"]) == (4, 4), c
    assert by_source["optimizer"][0]["round"] == 1 and by_source["optimizer"][0]["parent_id"] == by_source["user"][0]["candidate_id"]
    assert any(c["published_version"] == 1 and c["source"] == "user" for c in r["candidates"])
    # the first critiques read the training rows' trajectories under version 0; then 4 per scored candidate
    assert r["rollouts"] == 3 + sum(c["tasks"] for c in r["candidates"]) + 2 * 3 and r["rollouts"] >= 3 + 2 * 4 + 2 * 3
    # held-out: the 3 test rows under version 0 and under the version kept, paired
    assert r["kept"] == 1 and r["held_out"] == [0, 1, [0.0] * 3, [1.0] * 3], proc.stdout[-3000:]
    assert "held-out   v0 0.0% -> v1 100.0% on 3 tasks (+100.0 points" in proc.stdout
    assert "gradient   3 training rows once each under version 0" in proc.stdout
    assert "published  prompt_template version 1" in proc.stdout


def test_fit_with_apo_on_given_addresses_runs_in_its_own_topics_and_database(tmp_path: Path, kafka_bootstrap: str) -> None:
    """A broker and a ClickHouse store fit did not start: nothing is reset there, the prompt's versions are on the
    run's own topics and its candidates in the run's own database."""
    from confluent_kafka.admin import AdminClient

    from foundation.clickhouse import connect

    prefix, database = f"apo{uuid.uuid4().hex[:6]}.", f"apo_{uuid.uuid4().hex[:6]}"
    store = start_store(tmp_path / "store")
    try:
        env = dict(os.environ, ROLLOUTBUS_KAFKA_BOOTSTRAP=kafka_bootstrap, ROLLOUTBUS_TOPIC_PREFIX=prefix,
                   ROLLOUTBUS_CLICKHOUSE_DSN=store.url, ROLLOUTBUS_CLICKHOUSE_DATABASE=database,
                   ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"), PYTHONUNBUFFERED="1")
        proc, r = _run(tmp_path, env)
        head = proc.stdout.splitlines()[:3]
        assert head[0] == f"kafka      {kafka_bootstrap} (ROLLOUTBUS_KAFKA_BOOTSTRAP): nothing started or deleted there", head
        run = re.match(r"run        (\w+): ", head[2])
        assert run, head
        assert r["chosen"] == [1, "Answer with one number. {question}", 1.0] and r["held_out"][1] == 1, proc.stdout[-3000:]
        own = connect(store.url, database=f"{database}_fit_{run.group(1)}", create_database=False)
        try:
            cands = own.query(f"SELECT count(), countIf(published_version = 1) FROM prompt_candidates FINAL "
                              f"WHERE run_id = '{r['run_id']}'").result_rows[0]
            versions = own.query("SELECT max(version) FROM resource_versions FINAL WHERE name = 'prompt_template'").result_rows[0][0]
        finally:
            own.close()
        assert tuple(cands) == (3, 1) and versions == 1, (cands, versions)
        assert f"{prefix}fit-{run.group(1)}.resources" in set(AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics)
    finally:
        store.proc.terminate()
        store.proc.wait(30)
