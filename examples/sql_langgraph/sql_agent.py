"""The write-ups' SQL agent: a LangGraph graph (write_query -> execute_query -> check_query -> rewrite_query,
looping until the check says the query is correct or ``max_turns``), wrapped in a ``LitSQLAgent`` whose
reward is ``evaluate_query`` (execution match with the gold query).

Agent Lightning's ``examples/spider/sql_agent.py`` with the imports changed (``rolloutbus`` for
``agentlightning``), prompts a 135M model follows (below), and the data: Spider cannot be downloaded here, so
the tasks are the project's generated SQLite databases (``data.py``). Run it as a dry run against any
OpenAI-compatible endpoint:

    OPENAI_API_BASE=http://127.0.0.1:8000/v1 OPENAI_MODEL=policy python examples/sql_langgraph/sql_agent.py
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import rolloutbus as agl

# The prompts are Agent Lightning's in substance (write a query for the schema; check it and end with a verdict in
# capitals; rewrite it given the result and the check), worded for a 135M model: the write prompt is the project's
# SQL demo's (rolloutbus/demo/sql.py), which that model follows, with worked examples on the same database as
# earlier turns when the database has them (data.py writes three beside each database; without them this model
# answers in prose). The rewrite continues that chat: it sees the examples again, then its query, the result and
# the check.
WRITE_PROMPT = """You translate questions into SQLite queries for this database:
{schema}
Reply with one SQL query only."""
CHECK_PROMPT = """You check SQLite queries. The database:
{schema}
Question: {question}
Query: {query}
Result: {result}
If the query answers the question, reply THE QUERY IS CORRECT. Otherwise say what is wrong and end with THE QUERY IS INCORRECT."""
REWRITE_PROMPT = """That query returned: {result}
A check of it said: {feedback}
Reply with a corrected SQL query only."""
EXAMPLES_SUFFIX = ".examples.json"  # [[question, query], ...] beside a database file: its worked examples


class State(TypedDict, total=False):
    question: str
    query: str
    execution: str
    feedback: str
    num_turns: int


def run_sql(query: str, db_path: str) -> list[tuple[Any, ...]]:
    """The rows of one read-only query (raises sqlite3.Error)."""
    path = db_path.removeprefix("sqlite:///")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(query).fetchmany(200)
    finally:
        conn.close()


def _norm(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(round(v, 2) if isinstance(v, float) else v for v in r) for r in rows)


def evaluate_query(predicted_query: str, ground_truth_query: str, db_path: str, raise_on_error: bool = False) -> float:
    """1.0 when the predicted query returns the gold query's rows (a multiset; column names ignored)."""
    try:
        result_pred = run_sql(predicted_query, db_path)
    except sqlite3.Error:
        if raise_on_error:
            raise
        return 0.0
    result_true = run_sql(ground_truth_query, db_path)
    return 1.0 if _norm(result_pred) == _norm(result_true) else 0.0


def extract_sql(text: str) -> str:
    """The query in a reply: a fenced block's, else from the first SELECT or WITH; up to the first ``;``.
    Empty when the reply holds no query (the rewrite then keeps the query it was given, as Agent Lightning's does)."""
    fenced = re.search(r"```(?:sql|sqlite)?\s*(.*?)```", text, re.S | re.I)
    text = fenced.group(1) if fenced else text
    found = re.search(r"(?is)\b(select|with)\b.*", text)
    return found.group(0).split(";")[0].strip() if found else ""


def verdict(feedback: str) -> bool:
    """The check's verdict: its last ``THE QUERY IS CORRECT`` / ``... INCORRECT``, in any case (a small model
    writes "The QUERY is CORRECT."); no verdict is not correct."""
    text = feedback.upper()
    return text.rfind("THE QUERY IS CORRECT") > text.rfind("THE QUERY IS INCORRECT")


def worked_examples(db_path: str) -> list[tuple[str, str]]:
    """The database's worked examples (question, query), from the file beside it; none without one."""
    path = Path(db_path.removeprefix("sqlite:///")).with_suffix(EXAMPLES_SUFFIX)
    return [(str(q), str(a)) for q, a in json.loads(path.read_text())] if path.exists() else []


def schema_of(db_path: str) -> str:
    conn = sqlite3.connect(f"file:{db_path.removeprefix('sqlite:///')}?mode=ro", uri=True)
    try:
        return "\n".join(r[0] + ";" for r in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY name"))
    finally:
        conn.close()


def build_langgraph_sql_agent(database_path: str, openai_base_url: str, model: str, sampling_parameters: dict[str, Any],
                              max_turns: int, truncate_length: int) -> Any:
    """The four-node graph; compiled."""
    llm = ChatOpenAI(model=model, base_url=openai_base_url, api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
                     temperature=sampling_parameters.get("temperature", 0.7),
                     max_tokens=sampling_parameters.get("max_tokens", 64), max_retries=0, timeout=300)
    schema = schema_of(database_path)
    examples = worked_examples(database_path)

    def chat(question: str) -> list[BaseMessage]:
        """write_query's messages: the schema, the worked examples as earlier turns, the question."""
        shots = [m for q, a in examples for m in (HumanMessage(q), AIMessage(a))]
        return [SystemMessage(WRITE_PROMPT.format(schema=schema)), *shots, HumanMessage(question)]

    @tool
    def sql_db_query(query: str) -> str:
        """Run one SQLite query on the task's database and return its rows."""
        return repr(run_sql(query, database_path))

    def write_query(state: State) -> State:
        reply = str(llm.invoke(chat(state["question"])).content)
        return {"query": extract_sql(reply) or reply.strip(), "num_turns": 1}

    def execute_query(state: State) -> State:
        try:  # a LangChain tool, as the write-ups' QuerySQLDatabaseTool: the tracer records each call
            result = sql_db_query.invoke(state["query"])
        except sqlite3.Error as exc:
            result = f"Error: {exc}"
        return {"execution": result[:truncate_length]}

    def check_query(state: State) -> State:
        reply = llm.invoke([HumanMessage(CHECK_PROMPT.format(schema=schema, question=state["question"], query=state["query"],
                                                             result=state["execution"]))])
        return {"feedback": str(reply.content)[:truncate_length]}

    def rewrite_query(state: State) -> State:
        reply = llm.invoke([*chat(state["question"]), AIMessage(state["query"]),
                            HumanMessage(REWRITE_PROMPT.format(result=state["execution"], feedback=state["feedback"]))])
        return {"query": extract_sql(str(reply.content)) or state["query"], "num_turns": state.get("num_turns", 1) + 1}

    def after_check(state: State) -> str:
        # A query that failed is not correct whatever the check says (a 135M model's check often says it is).
        failed = state.get("execution", "").startswith("Error:")
        if (verdict(state.get("feedback", "")) and not failed) or state.get("num_turns", 1) >= max_turns:
            return END
        return "rewrite_query"

    builder = StateGraph(State)
    builder.add_node("write_query", write_query)
    builder.add_node("execute_query", execute_query)
    builder.add_node("check_query", check_query)
    builder.add_node("rewrite_query", rewrite_query)
    builder.add_edge(START, "write_query")
    builder.add_edge("write_query", "execute_query")
    builder.add_edge("execute_query", "check_query")
    builder.add_conditional_edges("check_query", after_check, {END: END, "rewrite_query": "rewrite_query"})
    builder.add_edge("rewrite_query", "execute_query")
    return builder.compile()


class LitSQLAgent(agl.LitAgent[dict]):
    def __init__(self, max_turns: int = 3, truncate_length: int = 1024) -> None:
        super().__init__()
        self.max_turns = max_turns
        self.truncate_length = truncate_length

    def rollout(self, task: dict, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        # Step 1: the shared LLM resource
        llm: agl.LLM = resources["main_llm"]
        # Step 2: the LangGraph agent, pointed at this attempt's URL
        agent = build_langgraph_sql_agent(
            database_path="sqlite:///" + task["db_path"],
            openai_base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
            model=llm.model,
            sampling_parameters=llm.sampling_parameters,
            max_turns=self.max_turns,
            truncate_length=self.truncate_length,
        )
        # Step 3: run it
        result = agent.invoke({"question": task["question"]}, {
            "callbacks": [self.tracer.get_langchain_handler()],
            "recursion_limit": 100,
        })
        # Step 4: the reward
        return evaluate_query(result["query"], task["ground_truth"], task["db_path"], raise_on_error=False)


if __name__ == "__main__":
    from data import datasets

    _, dev_data, _ = datasets()
    trainer = agl.Trainer(
        n_workers=1,
        initial_resources={"main_llm": agl.LLM(endpoint=os.environ["OPENAI_API_BASE"], model=os.environ.get("OPENAI_MODEL", "gpt-4.1-nano"),
                                               sampling_parameters={"temperature": 0.7})},
        adapter={"agent_match": "write|rewrite"},
    )
    trainer.dev(LitSQLAgent(), dev_dataset=dev_data[:10])
