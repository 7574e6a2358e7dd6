"""A user's script that trains with ``Trainer.fit`` on the tiny model (the tests that run fit as a user would,
in a process of its own): one answer from ``main_llm`` per task, rewarded by its length's parity (the tiny
model's answers vary: groups teach). It prints ``RESULT {json}``: the versions, the held-out count, the run and
its database."""

from __future__ import annotations

TEMPLATE = '''
import json, sys
import rolloutbus as agl
from rolloutbus.demo.agent import chat
from rolloutbus.demo.calc import problems


class Calc(agl.LitAgent[dict]):
    def rollout(self, task, resources, rollout):
        llm = resources["main_llm"]
        text = chat(llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
                    [{"role": "user", "content": task["question"]}], temperature=1.0)
        return float(len(text) % 2)

if __name__ == "__main__":
    rows = [json.loads(p.to_json()) for p in problems(6, seed=1)]
    trainer = agl.Trainer(n_runners=2, algorithm=agl.GRPO(group_size=2, groups_per_step=1, max_steps=MAX_STEPS, minutes=4,
                          skip_zero_variance=False), initial_resources={"main_llm": agl.LLM(model="tiny")}, out=sys.argv[1])
    result = trainer.fit(Calc(), rows, test_dataset=rows[:TEST_ROWS] or None)
    print("RESULT " + json.dumps({"versions": sorted(result.versions), "run": result.run, "database": result.database,
                                  "held_out": len(result.held_out.first_scores) if result.held_out else 0}))
'''


def fit_script(max_steps: int, test_rows: int = 0) -> str:
    """The script's text: ``max_steps`` optimiser steps, the first ``test_rows`` rows as ``test_dataset``."""
    return TEMPLATE.replace("MAX_STEPS", str(max_steps)).replace("TEST_ROWS", str(test_rows))
