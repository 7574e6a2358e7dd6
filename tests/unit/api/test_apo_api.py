"""``APO(...)`` in the Python API: its settings become the ``rolloutbus optimize-prompt`` command fit starts, read
by the command's own parser; the agent's ``prompt_template`` is the version the runner hands it; fit refuses APO
without a prompt template in one line, before starting anything."""

from __future__ import annotations

import argparse
import pickle

import pytest

from foundation.errors import ConfigError
from rolloutbus import APO, LLM, LitAgent, PromptTemplate, Trainer
from schemas import ResourceVersion


class Echo(LitAgent[dict]):
    """Returns what it was given, for the tests to look at."""

    def rollout(self, task, resources, rollout):  # type: ignore[no-untyped-def]
        return resources


def _args(argv: list[str]) -> argparse.Namespace:
    from trainer.apo_cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_apo_becomes_the_optimize_prompt_command() -> None:
    algo = APO(beam_width=3, branch_factor=1, beam_rounds=4, val_batch_size=5, optimizer_temperature=0.5, min_gain=0.05,
               score_timeout_s=60, apo_args=["--dry-run"])
    cmd = algo.command("val.jsonl", "prompt_template", "http://127.0.0.1:9/v1", "policy", "apo-1", "out.json", "mine.json")
    assert cmd[0] == "optimize-prompt"
    a = _args(cmd[1:])
    assert (str(a.val_tasks), a.resource, a.llm_url, a.llm_model, a.llm_temperature) == \
        ("val.jsonl", "prompt_template", "http://127.0.0.1:9/v1", "policy", 0.5)
    assert (a.beam_width, a.branch, a.rounds, a.max_val_tasks, a.min_gain, a.score_timeout) == (3, 1, 4, 5, 0.05, 60.0)
    assert (a.run_id, str(a.out), str(a.candidates), a.dry_run) == ("apo-1", "out.json", "mine.json", True)
    # the optimizer LLM is the served policy unless given; no candidates file, no flag; all validation rows by default
    own = _args(APO(optimizer_url="http://x:1/v1", optimizer_model="big").command("v", "p", "http://s/v1", "policy", "r", "o")[1:])
    assert (own.llm_url, own.llm_model, own.candidates, own.max_val_tasks) == ("http://x:1/v1", "big", None, None)


def test_an_openai_client_as_agent_lightnings_first_argument_is_the_optimizer() -> None:
    from openai import AsyncOpenAI

    algo = APO(AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test"), optimizer_model="gpt-4.1-mini", beam_rounds=1)
    a = _args(algo.command("v", "p", "http://served/v1", "policy", "r", "o")[1:])
    assert (a.llm_url, a.llm_model, a.rounds) == ("http://127.0.0.1:9/v1", "gpt-4.1-mini", 1)
    assert algo.optimizer_key() == "sk-test" and "sk-test" not in algo.command("v", "p", "u", "m", "r", "o")
    assert APO().optimizer_key() is None
    with pytest.raises(ConfigError, match=r"name the model, APO\(client, optimizer_model=...\)"):
        APO(AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k"))
    with pytest.raises(ConfigError, match="first argument is the optimizer LLM's OpenAI or AsyncOpenAI client, not a str"):
        APO("http://127.0.0.1:9/v1")  # type: ignore[arg-type]


def test_bad_apo_settings_are_one_line() -> None:
    for bad in (dict(beam_width=0), dict(branch_factor=0), dict(val_batch_size=0)):
        with pytest.raises(ConfigError, match="at least 1"):
            APO(**bad)  # type: ignore[arg-type]
    for bad in (dict(beam_rounds=-1), dict(gradient_batch_size=-1), dict(min_gain=-0.1)):
        with pytest.raises(ConfigError, match="must not be negative"):
            APO(**bad)  # type: ignore[arg-type]


def test_prompt_template_formats_as_agent_lightnings() -> None:
    p = PromptTemplate(template="Q: {question} ({n})", engine="f-string")
    assert p.format(question="2+2", n=1, extra="ignored") == "Q: 2+2 (1)"
    assert PromptTemplate.from_config(p.config()) == p
    assert PromptTemplate.from_config({"template": "x"}, engine="jinja").engine == "jinja"
    with pytest.raises(NotImplementedError, match="f-string"):
        PromptTemplate(template="{{ q }}", engine="jinja").format(q=1)


def test_the_agent_reads_the_version_the_runner_uses() -> None:
    from rolloutbus.trainer_api.fit_apo import PromptAdapted

    initial = PromptTemplate(template="v0 {question}")
    shipped = pickle.loads(pickle.dumps(PromptAdapted(Echo(), {"prompt_template": initial, "main_llm": LLM(model="tiny")},
                                                      "prompt_template", proxy="http://127.0.0.1:9")))
    # no version on the bus yet: the initial one
    assert shipped.named_resources({})["prompt_template"] == initial
    # the latest version (or a candidate a scoring task carries): its template, the initial engine kept
    rv = ResourceVersion(name="prompt_template", version=1, kind="prompt_template", created_ns=1,
                         config={"template": "v1 {question}", "label": "apo-1-u1"})
    seen = shipped.named_resources({"prompt_template": rv}, mode="test")
    assert seen["prompt_template"] == PromptTemplate(template="v1 {question}", engine="f-string")
    assert seen["main_llm"].proxied and seen["main_llm"].sampling_parameters == {}


def test_fit_refuses_apo_without_a_prompt_template_before_starting_anything(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = [{"question": "2 3 gain"}]
    t = Trainer(algorithm=APO(), initial_resources={"main_llm": LLM(model="tiny")}, out=tmp_path / "out")
    with pytest.raises(ConfigError, match=r"APO optimizes a prompt template: give initial_resources=\{\"prompt_template\""):
        t.fit(Echo(), rows)
    two = {"a": PromptTemplate(template="a"), "b": PromptTemplate(template="b")}
    with pytest.raises(ConfigError, match=r"holds 2 \(a, b\): say which with APO\(resource=...\)"):
        Trainer(algorithm=APO(), initial_resources=two, out=tmp_path / "out").fit(Echo(), rows)
    with pytest.raises(ConfigError, match=r"APO\(resource='c'\) names no PromptTemplate"):
        Trainer(algorithm=APO(resource="c"), initial_resources=two, out=tmp_path / "out").fit(Echo(), rows)
    assert not (tmp_path / "out").exists()


def test_fit_with_apo_on_given_addresses_takes_run_scope_s_checks_before_starting_anything(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    t = Trainer(algorithm=APO(), initial_resources={"prompt_template": PromptTemplate(template="{question}")}, out=tmp_path / "out")
    monkeypatch.setenv("ROLLOUTBUS_CLICKHOUSE_DSN", f"chdb://{tmp_path / 'chdb'}")
    with pytest.raises(ConfigError, match="chdb:// opens the engine in one process"):
        t.fit(Echo(), [{"question": "2 3 gain"}])
    assert not (tmp_path / "out").exists()
