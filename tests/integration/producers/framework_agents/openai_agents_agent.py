"""The OpenAI Agents SDK: a ``writer`` agent, then a ``critic`` agent on its answer, each on a chat-completions
model whose client points at the proxy, traced by OpenInference's Agents SDK instrumentation (the SDK's own
exporter to OpenAI's servers is removed: nothing leaves the machine)."""

from __future__ import annotations

import asyncio
from typing import Any

from harness import MODEL, agent_headers, run


def body(base_url: str) -> list[dict[str, Any]]:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner
    from openai import AsyncOpenAI

    def agent(name: str, instructions: str) -> Agent:
        client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60, default_headers=agent_headers(name))
        return Agent(name=name, instructions=instructions, model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                     model_settings=ModelSettings(max_tokens=6, temperature=1.0))

    async def main() -> list[dict[str, Any]]:
        draft = await Runner.run(agent("writer", "Answer briefly."), "1 + 2")
        review = await Runner.run(agent("critic", "Check the answer."), f"Answer: {draft.final_output}")
        return [{"agent": "writer", "text": str(draft.final_output)}, {"agent": "critic", "text": str(review.final_output)}]

    return asyncio.run(main())


if __name__ == "__main__":
    run("openai-agents", "openai-agents", body)
