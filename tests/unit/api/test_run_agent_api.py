"""``rolloutbus run-agent --agent module:name`` runs this API's agents too (a ``rolloutbus.LitAgent`` class or
instance, an ``@agl.rollout`` function): the versions on ``rb.resources`` reach them as ``LLM`` / ``PromptTemplate``
under their names, as Agent Lightning's runners get them from the gateway."""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import rolloutbus as agl
from producers.litagent import AttemptRunner
from producers.runner import load_agent
from schemas.models import ResourceVersion
from tests.unit.producers.test_context_emit import Recorder

SEEN: list[Any] = []


class Reads(agl.LitAgent[dict]):
    def rollout(self, task: dict, resources: Any, rollout: Any) -> float:
        SEEN.append((resources["main_llm"], resources["prompt"], rollout.mode))
        return 1.0


@agl.rollout
def reads(task: dict, llm: agl.LLM, rollout: Any) -> float:
    SEEN.append(llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id))
    return 0.5


def bus() -> dict[str, ResourceVersion]:
    now = time.time_ns()
    return {"policy": ResourceVersion(name="policy", version=3, kind="model", uri="/ckpt/3", created_ns=now,
                                      config={"endpoint": "http://proxy:8080/v1"}),
            "prompt": ResourceVersion(name="prompt", version=1, kind="prompt_template", created_ns=now,
                                      config={"template": "Q: {q}", "engine": "f-string"})}


def test_a_class_an_instance_and_a_function_agent_run_with_the_bus_resources_as_the_api_names_them() -> None:
    module = types.ModuleType("agents_here")
    module.Reads, module.instance, module.reads = Reads, Reads(), reads  # type: ignore[attr-defined]
    sys.modules["agents_here"] = module
    try:
        runners = [load_agent(f"agents_here:{name}") for name in ("Reads", "instance", "reads")]
    finally:
        del sys.modules["agents_here"]
    assert all(isinstance(r, AttemptRunner) for r in runners)
    SEEN.clear()
    results = [r.run({"q": "2+2"}, bus(), task_id="t1", transport=Recorder(), mode="train") for r in runners]
    assert [(r.status, r.reward) for r in results] == [("succeeded", 1.0), ("succeeded", 1.0), ("succeeded", 0.5)]
    llm, prompt, mode = SEEN[0]
    assert llm == agl.LLM(endpoint="http://proxy:8080/v1", model="policy", proxied=True) and mode == "train"
    assert prompt == agl.PromptTemplate("Q: {q}") and SEEN[1][:2] == SEEN[0][:2]
    assert SEEN[2] == f"http://proxy:8080/rollout/{results[2].rollout_id}/attempt/{results[2].attempt_id}/v1"


def test_an_agent_that_takes_the_proxys_attempt_url_says_its_finished_event_cannot_count_its_spans() -> None:
    """The calls through ``get_base_url(rollout_id, attempt_id)`` carry no sequence id of the agent's: their spans come
    from the proxy, numbered by the stream worker, so the FINISHED event says its count is unknown (the worker then
    waits its finish grace for them); an agent that never asked for that URL keeps an exact count."""
    from schemas.models import SPANS_UNKNOWN

    module = types.ModuleType("agents_url")
    module.reads, module.Reads = reads, Reads  # type: ignore[attr-defined]
    sys.modules["agents_url"] = module
    try:
        runners = {"url": load_agent("agents_url:reads"), "no-url": load_agent("agents_url:Reads")}
    finally:
        del sys.modules["agents_url"]
    finished = {}
    for name, runner in runners.items():
        rec = Recorder()
        runner.run({"q": "2+2"}, bus(), task_id="t1", transport=rec, mode="train")
        (event,) = [r for _k, n, r in rec.records if n == "rolloutbus.RolloutEvent" and r.event == "FINISHED"]
        finished[name] = event.metadata.get(SPANS_UNKNOWN)
    assert finished == {"url": "1", "no-url": None}


def test_a_model_version_without_an_endpoint_stays_the_record() -> None:
    from rolloutbus.trainer_api.resources import from_version

    rv = ResourceVersion(name="policy", version=1, kind="model", uri="/ckpt/1", created_ns=1)
    assert from_version(rv) is None
    assert from_version(rv.model_copy(update={"config": {"endpoint": "http://x/v1", "resource_type": "llm",
                                                          "sampling_parameters": '{"temperature": 0.2}'}})) == \
        agl.LLM(endpoint="http://x/v1", model="policy", sampling_parameters={"temperature": 0.2}, proxied=False)


def test_the_trained_model_is_main_llm_and_its_old_key_answers_with_a_warning_once(caplog: Any) -> None:
    """One agent class: the model being trained (``policy`` on rb.resources) is ``resources["main_llm"]``; the key the
    agent library's class read it by, ``policy``, answers the same object for one release and says so once."""
    import logging

    from rolloutbus.trainer_api.agent import _Named

    got: list[Any] = []

    class Old(agl.LitAgent[dict]):
        def rollout(self, task: dict, resources: Any, rollout: Any) -> float:
            got.append((resources["main_llm"], resources["policy"], resources.get("policy"), sorted(resources)))
            return 1.0

    _Named.warned.clear()
    with caplog.at_level(logging.WARNING, logger="rolloutbus.trainer_api.agent"):
        for _ in range(2):
            assert Old().run({"q": 1}, bus(), task_id="t", transport=Recorder()).status == "succeeded"
    main, old, old_get, keys = got[0]
    assert main is old is old_get and isinstance(main, agl.LLM) and keys == ["main_llm", "policy", "prompt"]
    said = [r.getMessage() for r in caplog.records if "old name" in r.getMessage()]
    assert said == ["resources['policy'] is resources['main_llm'] under its old name; the old name goes in the next release"]
