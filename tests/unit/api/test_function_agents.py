"""Agent Lightning's function agents: ``@agl.rollout`` / ``@agl.llm_rollout`` / ``@agl.prompt_rollout`` over
``(task, llm[, rollout])`` or ``(task, prompt_template[, rollout])``, sync or async, run by ``Trainer.dev`` as any
LitAgent; still callable as the function; sent to fit's runners by module and name; a wrong signature is refused."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

import rolloutbus as agl
from tests.unit.api.fake_openai import fake_openai


@agl.rollout
def answers(task: dict[str, Any], llm: agl.LLM, rollout: agl.Rollout) -> float:
    from openai import OpenAI

    reply = OpenAI(base_url=llm.endpoint, api_key="x").chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["q"]}])
    agl.emit_reward(0.25)  # an intermediate reward, recorded as the agent's span
    return 1.0 if reply.choices[0].message.content == task["a"] and rollout.mode == "train" else 0.0


@agl.prompt_rollout
async def fills(task: dict[str, Any], prompt_template: agl.PromptTemplate) -> float:
    await asyncio.sleep(0)
    return float(prompt_template.format(**task) == "add 2 and 3")


def test_a_function_agent_gets_the_first_llm_and_its_rollout_in_a_dry_run() -> None:
    assert isinstance(answers, agl.LitAgent) and answers.name == "answers" and answers.__doc__ is None
    with fake_openai(lambda messages: "4" if messages[-1]["content"] == "2+2" else "?") as (url, seen):
        trainer = agl.Trainer(say=lambda _: None, initial_resources={"main_llm": agl.LLM(endpoint=url, model="m")})
        results = trainer.dev(answers, dev_dataset=[{"q": "2+2", "a": "4"}, {"q": "2+3", "a": "5"}])
    assert [r.reward for r in results] == [1.0, 0.0] and len(seen) == 2
    assert [s.kind for s in results[0].steps] == ["llm", "reward"]


def test_an_async_prompt_agent_gets_the_prompt_template() -> None:
    trainer = agl.Trainer(say=lambda _: None, initial_resources={"tmpl": agl.PromptTemplate("add {a} and {b}", engine="f-string")})
    results = trainer.dev(fills, dev_dataset=[{"a": 2, "b": 3}, {"a": 1, "b": 1}])
    assert [(r.status, r.reward) for r in results] == [("succeeded", 1.0), ("succeeded", 0.0)]


def test_the_decorated_object_is_still_the_function_and_travels_by_name() -> None:
    assert asyncio.run(fills({"a": 2, "b": 3}, agl.PromptTemplate("add {a} and {b}", engine="f-string"))) == 1.0
    assert pickle.loads(pickle.dumps(answers)) is answers

    def local(task: Any, llm: Any) -> float:
        return 0.0

    with pytest.raises(pickle.PicklingError, match="not at a module's top level"):
        pickle.dumps(agl.rollout(local))


def test_a_missing_resource_or_a_wrong_signature_is_one_line() -> None:
    with pytest.raises(ValueError, match="no LLM resource among the rollout's resources \\(tmpl\\)"):
        answers.rollout({"q": ""}, {"tmpl": agl.PromptTemplate("x", engine="f-string")}, None)
    with pytest.raises(NotImplementedError, match="expected \\(task, llm\\[, rollout\\]\\) or \\(task, prompt_template"):
        agl.rollout(lambda task, model: 0.0)
    with pytest.raises(ValueError, match="a rollout function takes \\(task, llm\\[, rollout\\]\\)"):
        agl.llm_rollout(lambda question, llm: 0.0)
    assert agl.llm_rollout(strip_proxy=False)(answers.__wrapped__).name == "answers"
