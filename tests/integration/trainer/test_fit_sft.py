"""``Trainer(algorithm=SFT(...)).fit(...)`` end to end on the local stack: the runners collect rollouts on the
model as given, ``rolloutbus train --algorithm sft`` fine-tunes on the ones its filter keeps (the best one per
task here) and publishes versions on rb.resources, as the user sees them in fit's result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600),
              pytest.mark.skipif(bool(os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")), reason="fit runs on the local stack only")]

SCRIPT = '''
import json, sys
import rolloutbus as agl
from rolloutbus.demo.agent import chat
from rolloutbus.demo.calc import problems


class Calc(agl.LitAgent[dict]):
    """One answer from main_llm; rewarded when it starts as the calculator agent's answers do."""

    def rollout(self, task, resources, rollout):
        llm = resources["main_llm"]
        text = chat(llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
                    [{"role": "user", "content": task["question"]}], temperature=1.0)
        return 1.0 if text[:1] in "ac" else 0.0

if __name__ == "__main__":
    rows = [json.loads(p.to_json()) for p in problems(6, seed=1)]
    trainer = agl.Trainer(n_runners=4, algorithm=agl.SFT(samples_per_task=2, collect_minutes=0.4, top_k=1, min_reward=None,
                          epochs=2, batch_size=4), initial_resources={"main_llm": agl.LLM(model="tiny")}, out=sys.argv[1])
    result = trainer.fit(Calc(), rows)
    print("RESULT " + json.dumps({"versions": sorted(result.versions), "rollouts": result.rollouts,
                                  "algorithms": [v["config"].get("algorithm") for _, v in sorted(result.versions.items())]}))
'''


def test_fit_with_sft_collects_then_fine_tunes_and_publishes_versions(tmp_path: Path) -> None:
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"), ROLLOUTBUS_KAFKA_PORT=str(free_port_run((0, 1))),
               PYTHONUNBUFFERED="1", ROLLOUTBUS_STORE_PORT=str(free_port_run()))
    env.pop("ROLLOUTBUS_CLICKHOUSE_DSN", None)
    script = tmp_path / "rft.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(script), str(out)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=540)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted((out / "logs").glob("*.log"))) \
        if (out / "logs").exists() else ""
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{logs}"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["rollouts"] >= 2
    # the base model as version 0, then one version per epoch, each published by the SFT run
    assert result["versions"] == [0, 1, 2], proc.stdout[-3000:]
    assert result["algorithms"][1:] == ["sft", "sft"]
    train_log = (out / "logs" / "train.log").read_text()
    assert "transitions pass the filter" in train_log and "SFT epoch 2" in train_log
    assert "collect    0.4 minutes of rollouts, 2 per task" in proc.stdout
