"""CrewAI: a crew of two agents, ``writer`` and ``critic``, one task each in sequence, each agent's ``LLM`` on
the proxy, traced by OpenInference's CrewAI instrumentation (CrewAI's own telemetry is off)."""

from __future__ import annotations

from typing import Any

from harness import MODEL, agent_headers, run


def body(base_url: str) -> list[dict[str, Any]]:
    from crewai import LLM, Agent, Crew, Process, Task

    def llm(name: str) -> LLM:
        # custom_openai: CrewAI's own OpenAI client on any OpenAI-compatible endpoint (without it, a model name
        # CrewAI does not know goes to LiteLLM).
        return LLM(model=MODEL, custom_openai=True, base_url=base_url, api_key="unused", max_tokens=6, temperature=1.0,
                   max_retries=0, default_headers=agent_headers(name))

    writer = Agent(role="writer", goal="Answer the question", backstory="A writer.", llm=llm("writer"), max_iter=1,
                   allow_delegation=False)
    critic = Agent(role="critic", goal="Check the answer", backstory="A critic.", llm=llm("critic"), max_iter=1,
                   allow_delegation=False)
    tasks = [Task(description="1 + 2", expected_output="a number", agent=writer),
             Task(description="Check the answer.", expected_output="yes or no", agent=critic)]
    out = Crew(agents=[writer, critic], tasks=tasks, process=Process.sequential).kickoff()
    return [{"agent": t.agent, "text": t.raw} for t in out.tasks_output]


if __name__ == "__main__":
    run("crewai", "crewai", body)
