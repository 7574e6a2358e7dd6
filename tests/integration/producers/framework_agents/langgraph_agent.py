"""LangGraph: a two-node graph (``writer`` → ``critic``), each node a ``ChatOpenAI`` on the proxy, traced by
OpenInference's LangChain instrumentation (what LangGraph users trace with)."""

from __future__ import annotations

from typing import Any, TypedDict

from harness import MODEL, agent_headers, run


def body(base_url: str) -> list[dict[str, Any]]:
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        question: str
        draft: str
        review: str

    def llm(name: str) -> ChatOpenAI:
        return ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", max_tokens=6, temperature=1.0, max_retries=0,
                          timeout=60, default_headers=agent_headers(name))

    writer, critic = llm("writer"), llm("critic")

    def write(state: State) -> dict[str, str]:
        return {"draft": str(writer.invoke([HumanMessage(f"Answer: {state['question']}")]).content)}

    def review(state: State) -> dict[str, str]:
        return {"review": str(critic.invoke([HumanMessage(f"Check this answer: {state['draft']}")]).content)}

    graph = StateGraph(State)
    graph.add_node("writer", write)
    graph.add_node("critic", review)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "critic")
    graph.add_edge("critic", END)
    out = graph.compile().invoke({"question": "1 + 2", "draft": "", "review": ""})
    return [{"agent": "writer", "text": out["draft"]}, {"agent": "critic", "text": out["review"]}]


if __name__ == "__main__":
    run("langgraph", "langchain", body)
