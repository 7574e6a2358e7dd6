"""The Trainer API's shell: one clear line for bad input, the LLM resource's URLs, the agent shipped to a
runner process (also one defined in the user's script)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.installs import installed

from foundation.errors import ConfigError
from rolloutbus import GRPO, LLM, LitAgent, Trainer
from rolloutbus.trainer_api.agent import Adapted
from rolloutbus.trainer_api.trainer import row_json


class Echo(LitAgent[dict]):
    def rollout(self, task: dict, resources: Any, rollout: Any) -> float:
        return float(task["x"])


class NoRollout(LitAgent[dict]):
    pass


def test_bad_agents_are_one_line() -> None:
    with pytest.raises(ConfigError, match="does not implement rollout"):
        Trainer().dev(NoRollout(), [{"x": 1}])
    with pytest.raises(ConfigError, match="has no rollout"):
        Trainer().dev(object(), [{"x": 1}])
    with pytest.raises(ConfigError, match="pass an instance of Echo"):
        Trainer().dev(Echo, [{"x": 1}])


def test_bad_rows_and_settings_are_one_line() -> None:
    with pytest.raises(ConfigError, match="dataset row 0 is a str, not a dict"):
        row_json("question?", 0)
    with pytest.raises(ConfigError, match="dataset row 3 cannot be sent as a task"):
        row_json({"x": object()}, 3)
    with pytest.raises(ConfigError, match="agent_match '\\(' is not a valid regular expression"):
        Trainer(adapter={"agent_match": "("})
    with pytest.raises(ConfigError, match="adapter keys \\['agent_mtch'\\] are not known"):
        Trainer(adapter={"agent_mtch": "x"})
    with pytest.raises(ConfigError, match="group_size"):
        GRPO(group_size=1)
    with pytest.raises(ConfigError, match="GRPO\\(task_selection=...\\) must be 'all' or 'pass-rate', got 'hard'"):
        GRPO(task_selection="hard")
    with pytest.raises(ConfigError, match="GRPO\\(selection_k=...\\) must be greater than or equal to 1, got 0"):
        GRPO(task_selection="pass-rate", selection_k=0)
    with pytest.raises(ConfigError, match="GRPO\\(pace=...\\) must be 'generation' or 'trainer', got 'fast'"):
        GRPO(pace="fast")
    with pytest.raises(ConfigError, match="fit needs a train_dataset"):
        Trainer().fit(Echo(), [])


def test_numpy_values_from_pandas_rows_are_plain_json() -> None:
    np = installed("numpy", "pip install -e '.[all,test]'")
    assert row_json({"a": np.int64(3), "b": np.array([1.5, 2.0])}, 0) == '{"a": 3, "b": [1.5, 2.0]}'


def test_llm_urls() -> None:
    assert LLM(endpoint="http://h:1/v1").get_base_url("ro-1", "at-1") == "http://h:1/v1"
    proxied = LLM(endpoint="http://h:2", proxied=True)
    assert proxied.get_base_url("ro-1", "at-1") == "http://h:2/rollout/ro-1/attempt/at-1/v1"
    with pytest.raises(ValueError, match="names the rollout and the attempt"):
        proxied.get_base_url()


def test_fit_resources_point_llms_at_the_proxy() -> None:
    adapted = Adapted(Echo(), {"main_llm": LLM(model="m", sampling_parameters={"temperature": 0.3}), "k": 1}, proxy="http://p:9")
    named = adapted.named_resources({"policy": "rv", "k": 2})
    assert named["main_llm"] == LLM(endpoint="http://p:9", model="m", sampling_parameters={"temperature": 0.3}, proxied=True)
    # under fit, the name the policy server answers to (vLLM's answers 404 to the model's path)
    served = Adapted(Echo(), {"main_llm": LLM(model="/models/smollm2")}, proxy="http://p:9", served="policy")
    assert served.named_resources({})["main_llm"].model == "policy"
    assert Adapted(Echo(), {"main_llm": LLM(model="gpt-4.1-nano")}, served="policy").named_resources({})["main_llm"].model == "gpt-4.1-nano"
    assert named["k"] == 1 and named["policy"] == "rv"
    assert adapted.name == "Echo"


def test_validation_rollouts_call_the_llm_at_val_temperature() -> None:
    llm = LLM(model="m", sampling_parameters={"temperature": 0.7, "max_tokens": 48})
    greedy = Adapted(Echo(), {"main_llm": llm}, proxy="http://p:9", val_temperature=0.0)
    assert greedy.named_resources({}, "test")["main_llm"].sampling_parameters == {"temperature": 0.0, "max_tokens": 48}
    assert greedy.named_resources({}, "val")["main_llm"].sampling_parameters["temperature"] == 0.0
    assert greedy.named_resources({}, "train")["main_llm"].sampling_parameters == {"temperature": 0.7, "max_tokens": 48}
    assert llm.sampling_parameters["temperature"] == 0.7  # the Trainer's resource itself is left as given
    as_given = Adapted(Echo(), {"main_llm": llm}, proxy="http://p:9", val_temperature=None)
    assert as_given.named_resources({}, "test")["main_llm"].sampling_parameters["temperature"] == 0.7
    assert GRPO().val_temperature == 0.0


def test_fit_serves_with_the_engine_given() -> None:
    from rolloutbus.trainer_api.fit import serve_command, serve_start_s

    assert serve_command(8000) == ["serve", "--port", "8000", "--threads", "1", "--max-batch", "32"]
    assert serve_command(8000, Trainer(engine="vllm").engine)[-2:] == ["--engine", "vllm"]
    assert serve_command(8000, "vllm", "/m")[-4:] == ["--engine", "vllm", "--model", "/m"]  # SFT's collection
    assert serve_start_s("vllm") > serve_start_s("torch")
    from rolloutbus.cli import build_parser  # the command is one `rolloutbus serve` takes

    args = build_parser().parse_args(serve_command(8000, "vllm"))
    assert (args.command, args.engine, args.port) == ("serve", "vllm", 8000)
    with pytest.raises(ConfigError, match="engine 'sglang' is not one fit serves with: torch or vllm"):
        Trainer(engine="sglang")
    with pytest.raises(ConfigError, match="engine='vllm' serves a Hugging Face model"):
        Trainer(engine="vllm", initial_resources={"main_llm": LLM(model="tiny")}).fit(Echo(), [{"x": 1}])


SCRIPT = '''
import sys
import rolloutbus as agl
from rolloutbus.trainer_api.agent import Adapted
from rolloutbus.trainer_api.shipped import ship

class Scripted(agl.LitAgent[dict]):
    def __init__(self, k):
        super().__init__()
        self.k = k
    def rollout(self, task, resources, rollout):
        return self.k * task["x"]

if __name__ == "__main__":
    ship(Adapted(Scripted(2.5), {}), __import__("pathlib").Path(sys.argv[1]))
else:
    agl.Trainer().fit(Scripted(1), [{"x": 1}]) if sys.argv[-1] == "unguarded" else None
'''

LOAD = '''
import sys
from producers.runner import load_agent
from producers.transport import set_transport
sys.path.insert(0, sys.argv[2])
from memory import Mem
set_transport(Mem())
agent = load_agent("rolloutbus.trainer_api.shipped:agent")
print(agent.run({"x": 2}).reward)
'''


def test_an_agent_defined_in_the_users_script_reaches_the_runner(tmp_path: Path) -> None:
    script = tmp_path / "my_training.py"
    script.write_text(SCRIPT)
    (tmp_path / "memory.py").write_text("class Mem:\n    def emit(self, *a):\n        return True\n")
    subprocess.run([sys.executable, str(script), str(tmp_path / "agent.pickle")], check=True, cwd=tmp_path, timeout=120)
    env = {**__import__("os").environ, "ROLLOUTBUS_SHIPPED_AGENT": str(tmp_path / "agent.pickle")}
    out = subprocess.run([sys.executable, "-c", LOAD, "x", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "5.0"
    # A script that calls fit outside `if __name__ == "__main__":` is refused in the runner, in one line.
    bad = subprocess.run([sys.executable, "-c", LOAD, "x", str(tmp_path), "unguarded"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and 'put the call under `if __name__ == "__main__":`' in bad.stderr, bad.stderr


def test_fit_says_once_when_the_first_rollouts_cannot_teach() -> None:
    from rolloutbus.trainer_api.fit import first_rollouts_warning as warn

    assert warn("^planner$", 3, 0, None, 0, 4) is None  # not a group's worth yet
    assert warn("^planner$", 4, 0, None, 2, 4) is None  # something trains
    assert warn(None, 40, 0, None, 0, 4) is None  # no agent_match: every call trains
    line = warn("^planner$", 4, 0, None, 0, 4)
    assert line is not None and line.startswith("agent_match '^planner$' selected none of the LLM calls of the first 4 rollouts")
    line = warn(None, 4, 4, "KeyError: 'question'", 0, 4)
    assert line == ("every one of the first 4 rollouts failed, the first with: KeyError: 'question' "
                    "(a dataset row the agent cannot read? the runners' log says more)")


def test_held_out_pairs_the_same_tasks() -> None:
    from rolloutbus.trainer_api.fit import HeldOut

    held = HeldOut(0, 3, [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0])
    d, se = held.difference()
    assert (held.first_mean, held.chosen_mean, d) == (0.25, 0.75, 0.5)
    assert abs(se - (1 / 3) ** 0.5 / 2) < 1e-12  # differences 1, 0, 0, 1: sample sd sqrt(1/3) over sqrt(4)
    assert held.line() == "v0 25.0% -> v3 75.0% on 4 tasks (+50.0 points, paired standard error 28.9)"


def test_algorithms_are_registered_by_name_and_each_says_how_fit_runs_it() -> None:
    from dataclasses import dataclass

    from rolloutbus import APO, SFT, VERL
    from rolloutbus.trainer_api.algorithms import ALGORITHMS

    assert {n: ALGORITHMS.get(n) for n in ALGORITHMS} == {"grpo": GRPO, "sft": SFT, "apo": APO, "verl": VERL}
    assert Trainer(algorithm="sft").algorithm == SFT()
    with pytest.raises(ConfigError, match="algorithm 'ppo' is not one of: grpo, sft, apo, verl"):
        Trainer(algorithm="ppo")
    with pytest.raises(ConfigError, match="algorithm dict is not one fit runs: one of GRPO\\(...\\), SFT\\(...\\), APO"):
        Trainer(algorithm={"lr": 1e-5})  # type: ignore[arg-type]

    calls: list[tuple[Any, ...]] = []

    @ALGORITHMS.register("count-tasks")
    @dataclass
    class CountTasks:
        """counts the tasks it was given (a test's algorithm)"""

        def fit(self, trainer: Trainer, agent: Any, train: list[str], val: list[str], test: list[str]) -> int:
            calls.append((trainer, agent, train, val, test))
            return len(train)

    try:
        trainer, agent = Trainer(algorithm="count-tasks"), Echo()
        # fit hands the algorithm the agent and every dataset as the tasks' JSON; nothing else is started
        assert trainer.fit(agent, [{"x": 1}, {"x": 2}], val_dataset=[{"x": 3}]) == 2
        assert calls == [(trainer, agent, ['{"x": 1}', '{"x": 2}'], ['{"x": 3}'], [])]
        assert "count-tasks" in ALGORITHMS.table() and "counts the tasks it was given" in ALGORITHMS.table()
    finally:
        ALGORITHMS.unregister("count-tasks")


def test_the_feeders_choices_are_declared_once() -> None:
    """GRPO's, the demo's and ``tasks publish``'s task-feeder defaults are FeederSettings'."""
    import argparse

    from producers.settings import FeederSettings
    from producers.tasks_cli import add_arguments as add_tasks
    from rolloutbus.demo import add_arguments as add_demo
    from rolloutbus.demo.driver import DemoConfig

    demo = argparse.ArgumentParser()
    add_demo(demo)
    cfg = DemoConfig.from_args(demo.parse_args([]))
    tasks = argparse.ArgumentParser()
    add_tasks(tasks)
    from foundation.config import CommonSettings

    for name, info in FeederSettings.model_fields.items():
        if name not in CommonSettings.model_fields:  # the feeder's own fields
            assert getattr(GRPO(), name) == getattr(cfg, name) == info.default, name
    assert demo.parse_args(["--selection-k", "3"]).selection_k == 3
    assert tasks.parse_args(["publish", "f.jsonl"]).selection_k is None  # the model's default, or its variable, applies
