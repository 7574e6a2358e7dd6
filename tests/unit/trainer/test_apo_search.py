"""APO's pure core: the search on fake scoring and a fake optimizer, reading rewrites, the scores."""

from __future__ import annotations

import json
import math

import pytest

from producers.runner import OVERRIDE_PREFIX, task_resources, use_resource
from rolloutbus.demo import sql
from foundation.errors import ConfigError, ValidationError
from schemas import ResourceVersion
from trainer.apo import Candidate, Trajectory, beam_search, critique_messages, paired_difference, parse_rewrite, rank, rewrite_messages, winner
from trainer.apo_cli import parse_prompts


def _cand(cid: str, source: str = "optimizer", rewards: list[float] | None = None, **kw: object) -> Candidate:
    c = Candidate(id=cid, config={"template": f"prompt {cid}"}, source=source, **kw)  # type: ignore[arg-type]
    if rewards is not None:
        c.tasks = len(rewards)
        c.rewards = dict(enumerate(rewards))
    return c


# ------------------------------------------------------------------------------------------ scores


def test_score_counts_unfinished_tasks_as_zero_and_gives_its_standard_error() -> None:
    c = _cand("a")
    c.tasks, c.rewards = 4, {0: 1.0, 2: 1.0}  # tasks 1 and 3 never finished
    assert c.score == 0.5
    assert c.score_se == pytest.approx((1 / 3) ** 0.5 / 2)  # sample sd 0.577 over sqrt(4)
    assert _cand("b").score is None  # never scored
    rejected = _cand("r", rewards=[1.0, 1.0], note="rejected: the rewrite was empty")
    assert rejected.score is None


def test_paired_difference_is_over_the_same_tasks() -> None:
    mean, se = paired_difference([0, 0, 1, 1], [1, 0, 1, 1])
    assert mean == 0.25 and se == pytest.approx(0.25)
    assert paired_difference([1], [0])[0] == -1 and math.isnan(paired_difference([1], [0])[1])
    with pytest.raises(ValueError):
        paired_difference([], [])


# ------------------------------------------------------------------------------------------ the search


def test_beam_search_expands_the_best_keeps_the_beam_and_publishes_only_a_better_one() -> None:
    truth = {"inc": 0.25, "u1": 0.5, "r1-a": 0.75, "r1-b": 0.0, "r2-a": 0.5, "r2-b": 1.0}
    expanded: list[list[str]] = []
    recorded: list[str] = []

    def score(cands: list[Candidate]) -> None:
        for c in cands:
            c.tasks = 4
            hits = round(truth[c.id] * 4)
            c.rewards = {i: 1.0 if i < hits else 0.0 for i in range(4)}

    def expand(beam: list[Candidate], r: int) -> list[Candidate]:
        expanded.append([c.id for c in beam])
        kids = [_cand(f"r{r}-a", parent_id=beam[0].id, round=r, critique="too vague"),
                _cand(f"r{r}-b", parent_id=beam[0].id, round=r)]
        if r == 2:
            kids.append(_cand("r2-empty", round=r, note="rejected: the rewrite was empty"))
        return kids

    inc = _cand("inc", source="incumbent")
    pool = beam_search(inc, [_cand("u1", source="user")], rounds=2, beam_width=1, expand=expand, score=score,
                       record=lambda cs: recorded.extend(c.id for c in cs))
    assert expanded == [["u1"], ["r1-a"]], "each round expands the beam's best so far"
    assert [c.id for c in pool] == ["inc", "u1", "r1-a", "r1-b", "r2-a", "r2-b", "r2-empty"]
    assert recorded == [c.id for c in pool], "every candidate is recorded, the rejected one too"
    assert next(c for c in pool if c.id == "r2-empty").tasks == 0, "a rejected rewrite is not scored"
    assert winner(inc, pool).id == "r2-b"


def test_no_winner_when_nothing_beats_the_incumbent_and_ties_go_to_the_incumbent() -> None:
    inc = _cand("inc", source="incumbent", rewards=[1, 0])
    same = _cand("same", rewards=[0, 1])
    worse = _cand("worse", rewards=[0, 0])
    assert rank([same, worse, inc])[0] is inc
    assert winner(inc, [inc, same, worse]) is None
    better = _cand("better", rewards=[1, 1])
    assert winner(inc, [inc, better]) is better
    assert winner(inc, [inc, better], min_gain=0.5) is None, "a gain of exactly the margin is not enough"


def test_dry_run_is_rounds_zero_and_never_calls_the_optimizer() -> None:
    def expand(beam: list[Candidate], r: int) -> list[Candidate]:
        raise AssertionError("a dry run asks no LLM")

    def score(cands: list[Candidate]) -> None:
        for c in cands:
            c.tasks, c.rewards = 2, {0: 1.0, 1: 1.0 if c.source == "user" else 0.0}

    pool = beam_search(_cand("inc", source="incumbent"), [_cand("u1", source="user")], rounds=0, beam_width=2,
                       expand=expand, score=score, record=lambda cs: None)
    assert [c.score for c in pool] == [0.5, 1.0]


# ------------------------------------------------------------------------------------------ the LLM's side


def test_meta_prompts_show_the_prompt_the_trajectories_and_the_placeholders_to_keep() -> None:
    fail = Trajectory("How many employees are there?", ("Assistant: SELECT COUNT(*) FROM staff",
                                                        "Tool sqlite(SELECT COUNT(*) FROM staff) -> error: no such table: staff"), 0.0)
    msgs = critique_messages("Write SQL for:\n{schema}", [fail], [])
    text = msgs[-1]["content"]
    assert "Write SQL for:\n{schema}" in text and "no such table: staff" in text and "Reward: 0" in text
    assert "did well" not in text
    rewrite = rewrite_messages("Write SQL for:\n{schema}", "It should name the tables.")[-1]["content"]
    assert "Keep {schema} exactly as written" in rewrite and "It should name the tables." in rewrite
    assert "Keep" not in rewrite_messages("No placeholders here.", "x")[-1]["content"]


@pytest.mark.parametrize(("reply", "template", "note"), [
    ("Here is the improved prompt:\n```\nUse only the tables in {schema}.\n```", "Use only the tables in {schema}.", ""),
    ("New prompt: \"Answer with SQL for {schema}\"", "Answer with SQL for {schema}", ""),
    ("Write one SQLite query.", "Write one SQLite query.", "lost {schema}"),
    ("   ", "", "rejected: the rewrite was empty"),
    ("Old {schema}", "Old {schema}", "rejected: the rewrite is the parent unchanged"),
])
def test_parse_rewrite(reply: str, template: str, note: str) -> None:
    assert parse_rewrite(reply, "Old {schema}") == (template, note)


def test_parse_rewrite_rejects_a_runaway_reply() -> None:
    text, note = parse_rewrite("x" * 5000, "Old")
    assert note.startswith("rejected") and len(text) == 4000


# ------------------------------------------------------------------------------------------ the user's files


def test_parse_prompts_json_text_and_errors() -> None:
    assert parse_prompts('["A {schema}", {"template": "B", "examples": [["q", "SELECT 1"]]}]', "f") == [
        {"template": "A {schema}"}, {"template": "B", "examples": '[["q", "SELECT 1"]]'}]
    assert parse_prompts("First prompt\n---\nSecond prompt\n", "f") == [{"template": "First prompt"}, {"template": "Second prompt"}]
    for bad, says in [("", "no prompt"), ("[1]", "must be a string"), ('[{"examples": "[]"}]', "no template"), ("[oops", "not valid JSON")]:
        with pytest.raises(ConfigError, match=says):
            parse_prompts(bad, "f")


# ------------------------------------------------------------------------------------------ the runner's side


def _rv(name: str, version: int, **config: str) -> ResourceVersion:
    return ResourceVersion(name=name, version=version, kind="prompt_template", created_ns=1, config=config)


def test_a_task_brings_its_own_resource_and_each_rollout_records_what_it_used() -> None:
    current = {"policy": _rv("policy", 3), "prompt": _rv("prompt", 1, template="published")}
    meta = {"question": "q", **use_resource(_rv("prompt", 1, template="candidate"), label="apo-1-r1-2")}
    resources, recorded = task_resources(current, meta)
    assert resources["prompt"].config["template"] == "candidate" and resources["policy"].version == 3
    assert recorded == {"question": "q", "resource.policy": "3", "resource.prompt": "apo-1-r1-2"}
    assert not any(k.startswith(OVERRIDE_PREFIX) for k in recorded), "the override itself is not copied into every rollout"
    assert task_resources(current, {})[1] == {"resource.policy": "3", "resource.prompt": "1"}
    with pytest.raises(ValidationError, match="use_resource.prompt"):
        task_resources(current, {"use_resource.prompt": "{not json"})


def test_the_sql_agent_prompt_from_a_resource_config() -> None:
    assert sql.render(sql.SYSTEM_TEMPLATE) == sql.SYSTEM_PROMPT
    assert sql.SYSTEM_PROMPT.count("CREATE TABLE") == 2
    assert sql.render("Write SQL.").endswith(sql.SCHEMA), "no {schema}: the schema follows the text"
    system, examples = sql.from_prompt_config(sql.prompt_config())
    assert (system, examples) == (sql.SYSTEM_PROMPT, sql.EXAMPLES)
    system, examples = sql.from_prompt_config({"template": "Only SQL. {schema}", "examples": json.dumps([["q1", "SELECT 1"]])})
    assert system == "Only SQL. " + sql.SCHEMA and examples == [("q1", "SELECT 1")]
    with pytest.raises(ValueError, match="examples"):
        sql.from_prompt_config({"examples": "[1, 2]"})
