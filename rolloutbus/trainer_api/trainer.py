"""``Trainer``: the write-ups' entry point over the project's processes.

``Trainer(n_runners=..., algorithm=GRPO(...), adapter={"agent_match": ..., "llm_call_match": ...},
initial_resources={"main_llm": LLM(...)})``; ``.dev(agent, dev_dataset)`` is the dry run
(:mod:`rolloutbus.trainer_api.dev`), ``.fit(agent, train_dataset, val_dataset)`` the training run
(:mod:`rolloutbus.trainer_api.fit`), which starts the same ``rolloutbus`` commands the demo starts, on the
same local stack. Datasets are lists of dicts (``DataFrame.to_dict("records")``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from foundation.errors import ConfigError
from rolloutbus.trainer_api.agent import Adapted, check_agent
from rolloutbus.trainer_api.algorithms import ALGORITHMS, APO, GRPO, SFT
from rolloutbus.trainer_api.resources import LLM
from rolloutbus.trainer_api.shipped import CHILD_ENV

ADAPTER_KEYS = ("agent_match", "llm_call_match")
ENGINES = ("torch", "vllm")  # fit's policy server: the project's (torch), or vLLM's (``make vllm``)


def row_json(row: Any, index: int) -> str:
    """A dataset row as the task's JSON input; one clear line when it is not a dict JSON can carry."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"dataset row {index} is a {type(row).__name__}, not a dict: give a list of dicts "
                          "(DataFrame.to_dict('records'))")

    def plain(value: Any) -> Any:  # numpy scalars and arrays from pandas
        for attr in ("tolist", "item"):  # an array's tolist, a scalar's (tolist too, on numpy's)
            if hasattr(value, attr):
                return getattr(value, attr)()
        raise TypeError(f"{type(value).__name__} is not JSON")

    try:
        return json.dumps(dict(row), default=plain)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"dataset row {index} cannot be sent as a task (JSON): {exc}") from exc


class Trainer:
    """Runs an agent: ``dev`` once per task against an endpoint, ``fit`` in a training loop."""

    def __init__(self, n_runners: int | None = None, algorithm: GRPO | SFT | APO | str | None = None, adapter: Mapping[str, str] | None = None,
                 initial_resources: Mapping[str, Any] | None = None, *, n_workers: int | None = None,
                 out: str | Path = "rolloutbus-output", keep_store: bool = False, engine: str = "torch",
                 say: Callable[[str], None] | None = None) -> None:
        self.n_runners = n_runners or n_workers or 1
        if engine not in ENGINES:
            raise ConfigError(f"engine {engine!r} is not one fit serves with: {' or '.join(ENGINES)}")
        self.engine = engine  # fit: ``rolloutbus serve --engine``
        if isinstance(algorithm, str):  # a registered name, at its defaults: Trainer(algorithm="grpo")
            algorithm = ALGORITHMS.get(algorithm)()
        if algorithm is not None and not callable(getattr(algorithm, "fit", None)):
            raise ConfigError(f"algorithm {type(algorithm).__name__} is not one fit runs: one of "
                              f"{', '.join(f'{ALGORITHMS.get(n).__name__}(...)' for n in ALGORITHMS)}, or a name of them")
        self.algorithm = algorithm
        unknown = set(adapter or {}) - set(ADAPTER_KEYS)
        if unknown:
            raise ConfigError(f"adapter keys {sorted(unknown)} are not known: use {', '.join(ADAPTER_KEYS)}")
        from streams.transitions import agent_matcher, llm_call_matcher

        self.agent_match = (adapter or {}).get("agent_match")
        self.llm_call_match = (adapter or {}).get("llm_call_match")
        try:
            agent_matcher(self.agent_match)
            llm_call_matcher(self.llm_call_match)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.resources = dict(initial_resources or {})
        self.out = Path(out)
        self.keep_store = keep_store  # fit: leave the local store up afterwards, to query the run
        self.say = say or print

    def _guard(self) -> None:
        if os.environ.get(CHILD_ENV):
            raise ConfigError("Trainer.fit/dev called while a runner loads the agent's script: put the call under "
                              "`if __name__ == \"__main__\":`")

    def dev(self, agent: Any, dev_dataset: Sequence[Any] | None = None, **kwargs: Any) -> list[Any]:
        """The dry run: each task once against the ``main_llm`` endpoint, traced to memory; prints and returns
        per task the steps, the reward and what would become transitions."""
        from rolloutbus.trainer_api.dev import run_dev

        self._guard()
        check_agent(agent)
        rows = list(dev_dataset if dev_dataset is not None else kwargs.get("val_dataset") or [])
        if not rows:
            raise ConfigError("dev needs a dev_dataset: a list of dicts, one per task")
        tasks = [json.loads(row_json(row, i)) for i, row in enumerate(rows)]
        llm = self.resources.get("main_llm")
        if isinstance(llm, LLM) and not llm.endpoint:
            raise ConfigError("dev calls the main_llm's endpoint: LLM(endpoint='http://.../v1', model=...)")
        return run_dev(Adapted(agent, self.resources), tasks, self.agent_match, self.llm_call_match, self.say)

    def fit(self, agent: Any, train_dataset: Sequence[Any], val_dataset: Sequence[Any] | None = None,
            test_dataset: Sequence[Any] | None = None) -> Any:
        """Train: the local stack (or the broker and ClickHouse the settings give, in a namespace of the run's own:
        :mod:`rolloutbus.runs.scope`), the stream worker, the policy server, the proxy, the trainer and
        the runners (``rolloutbus`` commands, logs under ``out/logs``), tasks fed from ``train_dataset``; the
        validation tasks scored for each version, the best kept (``APO(...)``: the prompt optimized instead). ``test_dataset``: answered afterwards by version 0 and the
        version kept, with the paired difference (``result.held_out``). Everything started is stopped on return,
        an error or Ctrl-C."""
        from rolloutbus.localproc import restore_sigterm, stop_on_sigterm
        self._guard()
        check_agent(agent)
        train = [row_json(row, i) for i, row in enumerate(train_dataset)]
        if not train:
            raise ConfigError("fit needs a train_dataset: a list of dicts, one per task")
        val = [row_json(row, i) for i, row in enumerate(val_dataset or [])]
        test = [row_json(row, i) for i, row in enumerate(test_dataset or [])]
        if self.engine == "vllm" and (getattr(self.resources.get("main_llm"), "model", None) or "tiny") == "tiny":
            raise ConfigError("engine='vllm' serves a Hugging Face model: give LLM(model=...) a model directory or a "
                              "packaged model's name, not 'tiny' (the project's own)")
        previous = stop_on_sigterm()  # a SIGTERM to the script stops what fit started, as Ctrl-C does
        try:
            return (self.algorithm or GRPO()).fit(self, agent, train, val, test)  # ALGORITHMS: each says how it runs
        finally:
            restore_sigterm(previous)


__all__ = ["Trainer", "row_json"]
