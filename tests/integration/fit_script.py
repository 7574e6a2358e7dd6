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
    trainer = agl.Trainer(n_runners=2, algorithm=ALGORITHM, initial_resources={"main_llm": agl.LLM(model="tiny")},
                          out=sys.argv[1])
    result = trainer.fit(Calc(), rows, test_dataset=rows[:TEST_ROWS] or None)
    print("RESULT " + json.dumps({"versions": sorted(result.versions), "run": result.run, "database": result.database,
                                  "held_out": len(result.held_out.first_scores) if result.held_out else 0}))
'''


# minutes: a cap for a loaded machine (CI under xdist once took over 4 to reach the first step); MAX_STEPS ends it first.
GRPO = "agl.GRPO(group_size=2, groups_per_step=1, max_steps=MAX_STEPS, minutes=6, skip_zero_variance=False)"

# The write-ups' verl configuration (their SQL agent's keys and shape), sized for the tiny model and one step.
VERL = """agl.VERL({
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
        "data": {"train_batch_size": 1, "max_prompt_length": 4096, "max_response_length": 2048},
        "actor_rollout_ref": {
            "rollout": {"tensor_model_parallel_size": 1, "n": 2, "log_prob_micro_batch_size_per_gpu": 4,
                        "multi_turn": {"format": "hermes"}, "name": "vllm", "gpu_memory_utilization": 0.6},
            "actor": {"ppo_mini_batch_size": 1, "ppo_micro_batch_size_per_gpu": 4, "optim": {"lr": 1e-4},
                      "use_kl_loss": False, "kl_loss_coef": 0.0, "entropy_coeff": 0, "clip_ratio_low": 0.2,
                      "clip_ratio_high": 0.3, "fsdp_config": {"param_offload": True, "optimizer_offload": True}},
            "ref": {"log_prob_micro_batch_size_per_gpu": 8, "fsdp_config": {"param_offload": True}},
            "model": {"path": "tiny", "use_remove_padding": True, "enable_gradient_checkpointing": True},
        },
        "trainer": {"n_gpus_per_node": 1, "val_before_train": True, "critic_warmup": 0, "logger": ["console"],
                    "project_name": "AgentLightning", "experiment_name": "calc", "nnodes": 1, "save_freq": 64,
                    "test_freq": 0, "total_training_steps": MAX_STEPS},
    }, minutes=4, skip_zero_variance=False)"""


# The same agent as Agent Lightning's function agents are written: ``@agl.rollout`` over (task, llm, rollout).
FUNCTION_AGENT = '''
@agl.rollout
def calc(task, llm, rollout):
    text = chat(llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
                [{"role": "user", "content": task["question"]}], temperature=1.0)
    return float(len(text) % 2)
'''


def fit_script(max_steps: int, test_rows: int = 0, algorithm: str = GRPO, function_agent: bool = False) -> str:
    """The script's text: ``max_steps`` optimiser steps, the first ``test_rows`` rows as ``test_dataset``, ``algorithm``
    (:data:`GRPO`, or :data:`VERL`: the write-ups' verl configuration through ``agl.VERL``); ``function_agent``: the
    agent a decorated function (:data:`FUNCTION_AGENT`), sent to the runners from the script's ``__main__``."""
    text = (TEMPLATE.replace("ALGORITHM", algorithm).replace("MAX_STEPS", str(max_steps))
            .replace("TEST_ROWS", str(test_rows)))
    if function_agent:
        text = text.replace("\nif __name__", FUNCTION_AGENT + "\nif __name__").replace("trainer.fit(Calc(),", "trainer.fit(calc,")
    return text
