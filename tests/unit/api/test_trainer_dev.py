"""``Trainer.dev`` on the write-ups' LangGraph SQL agent against a stand-in OpenAI endpoint: every LLM call is
traced with its LangGraph node as the agent, the reward is the execution match, and ``agent_match
"write|rewrite"`` marks write_query's and rewrite_query's calls as transitions and check_query's as not."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.installs import installed

from rolloutbus import LLM, Trainer
from tests.unit.api.fake_openai import fake_openai

installed("langgraph", "pip install -e '.[test]' (the SQL example's agent)")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sql_langgraph"
sys.path.insert(0, str(EXAMPLE))

from data import datasets  # noqa: E402
from sql_agent import LitSQLAgent  # noqa: E402


def reply(gold: dict[str, str]) -> Any:
    """Writes a wrong query, finds it wrong once, rewrites it to the gold one, then finds it correct (in a small
    model's capitals)."""
    def answer(messages: list[dict[str, Any]]) -> str:
        text = " ".join(str(m.get("content")) for m in messages)
        question = next(q for q in gold if q in text)
        if text.startswith("You check"):
            return "The QUERY is CORRECT." if gold[question] in text else "Wrong table. THE QUERY IS INCORRECT"
        if "Reply with a corrected SQL query only" in str(messages[-1].get("content")):
            return f"Here it is:\n```sql\n{gold[question]}\n```"
        return "SELECT 1"
    return answer


def test_dev_traces_each_node_and_marks_transitions(tmp_path: Path) -> None:
    _, val, _ = datasets(tmp_path / "dbs", validation=4)
    rows = val[:2]
    lines: list[str] = []
    with fake_openai(reply({r["question"]: r["ground_truth"] for r in rows})) as (url, seen):
        trainer = Trainer(n_workers=1, adapter={"agent_match": "write|rewrite"}, say=lines.append,
                          initial_resources={"main_llm": LLM(endpoint=url, model="gpt-4.1-nano", sampling_parameters={"temperature": 0.7})})
        results = trainer.dev(LitSQLAgent(max_turns=3), dev_dataset=rows)
    assert len(seen) == 2 * 4  # write, check (wrong), rewrite, check (correct)
    for r in results:
        assert r.status == "succeeded" and r.reward == 1.0
        calls = [(s.agent, s.trained) for s in r.steps if s.kind == "llm"]
        assert calls == [("write_query", True), ("check_query", False), ("rewrite_query", True), ("check_query", False)]
        # execute_query's tool: SELECT 1 runs, then the gold query; each a tool span between the LLM calls
        assert [(s.kind, s.name, s.ok) for s in r.steps] == [
            ("llm", "chat.completions", True), ("tool", "sql_db_query", True), ("llm", "chat.completions", True),
            ("llm", "chat.completions", True), ("tool", "sql_db_query", True), ("llm", "chat.completions", True)]
    # write_query's chat: the schema, the database's worked examples (data.py's file) as turns, the question;
    # rewrite_query's goes on from it: the query, its result and the check's feedback.
    write, rewrite = seen[0]["body"]["messages"], seen[2]["body"]["messages"]
    assert write[0]["role"] == "system" and "CREATE TABLE" in write[0]["content"]
    assert [m["role"] for m in write[1:]] == ["user", "assistant"] * 3 + ["user"] and write[2]["content"].startswith("SELECT")
    assert write[-1]["content"] == rows[0]["question"]
    assert rewrite[: len(write)] == write and rewrite[len(write)]["content"] == "SELECT 1"
    assert "That query returned: [(1,)]" in rewrite[-1]["content"] and "THE QUERY IS INCORRECT" in rewrite[-1]["content"]
    out = "\n".join(lines)
    assert "-> stored, not trained" in out and "-> transition" in out and "tool  sql_db_query     ok  SELECT 1 -> [(1,)]" in out
    assert "transitions: 2 of 4 LLM calls (agent_match 'write|rewrite')" in out
    assert "dev: 2 tasks, mean reward 1.000, 2 succeeded, 4 of 8 LLM calls would be trained" in out


def test_dev_says_when_agent_match_selects_nothing(tmp_path: Path) -> None:
    _, val, _ = datasets(tmp_path / "dbs", validation=4)
    lines: list[str] = []
    with fake_openai(lambda messages: "THE QUERY IS CORRECT" if "You check" in str(messages) else "SELECT * FROM nowhere") as (url, _):
        results = Trainer(adapter={"agent_match": "^planner$"}, say=lines.append,
                          initial_resources={"main_llm": LLM(endpoint=url)}).dev(LitSQLAgent(), dev_dataset=val[:1])
    # A query that fails is a failed tool call, rewritten whatever the check says, up to max_turns; the reward is 0.
    assert [(s.name, s.ok) for s in results[0].steps if s.kind == "tool"] == [("sql_db_query", False)] * 3
    assert results[0].reward == 0.0
    assert any("agent_match '^planner$' matches none of the agents that called the LLM (check_query, rewrite_query, write_query)"
               in x for x in lines), lines


def test_sql_extraction_and_the_checks_verdict() -> None:
    from sql_agent import extract_sql, verdict

    assert extract_sql("```sql\nSELECT a FROM t;\n```") == "SELECT a FROM t"
    assert extract_sql("Sure: select a from t; -- done") == "select a from t"
    assert extract_sql("The answer is 2022.") == ""  # no query: rewrite_query keeps the one it was given
    assert verdict("The QUERY is CORRECT.") and verdict("THE QUERY IS INCORRECT. Fixed: THE QUERY IS CORRECT")
    assert not verdict("The QUERY is not CORRECT.") and not verdict("THE QUERY IS CORRECT? No: THE QUERY IS INCORRECT")
    assert not verdict("Looks fine.")


def test_calls_outside_the_trainers_rollouts_are_left_as_written(tmp_path: Path) -> None:
    """The hook is process-wide once installed; a request made in a plain rollout keeps its own headers."""
    import httpx

    from producers import rollout
    from rolloutbus.trainer_api.tracing import install

    install()
    with fake_openai(lambda messages: "x") as (url, seen):
        class Keep:
            def emit(self, *args: Any) -> bool:
                return True

        with rollout("t", transport=Keep()) as r:  # type: ignore[arg-type]
            base = url.removesuffix("/v1") + f"/rollout/{r.rollout_id}/attempt/{r.attempt_id}/v1"
            httpx.post(base + "/chat/completions", json={"messages": []}, timeout=10)
    assert "x-rolloutbus-sequence-id" not in {k.lower() for k in seen[0]["headers"]}


def test_async_agents_calls_are_named_too(tmp_path: Path) -> None:
    import httpx

    from rolloutbus import LitAgent, agent_scope

    class Async(LitAgent[dict]):
        async def rollout(self, task: dict, resources: Any, rollout: Any) -> float:
            llm = resources["main_llm"]
            with agent_scope("planner"):
                async with httpx.AsyncClient() as client:
                    await client.post(llm.get_base_url() + "/chat/completions", json={"messages": [{"role": "user", "content": "q"}]})
            return 0.5

    with fake_openai(lambda messages: "plan") as (url, _):
        results = Trainer(adapter={"agent_match": "plan"}, say=lambda line: None,
                          initial_resources={"main_llm": LLM(endpoint=url)}).dev(Async(), [{"q": 1}])
    assert results[0].reward == 0.5
    assert [(s.agent, s.trained, s.text) for s in results[0].steps if s.kind == "llm"] == [("planner", True, "plan")]
