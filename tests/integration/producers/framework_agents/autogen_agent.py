"""AutoGen (agentchat): two ``AssistantAgent``s, ``writer`` and ``critic``, taking turns in a round-robin team,
each on an ``OpenAIChatCompletionClient`` pointed at the proxy, traced by OpenInference's AutoGen agentchat
instrumentation."""

from __future__ import annotations

import asyncio
from typing import Any

from harness import MODEL, agent_headers, run


def body(base_url: str) -> list[dict[str, Any]]:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.teams import RoundRobinGroupChat
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    def client(name: str) -> OpenAIChatCompletionClient:
        # model_info: the model is not one AutoGen knows by name.
        return OpenAIChatCompletionClient(
            model=MODEL, base_url=base_url, api_key="unused", max_tokens=6, temperature=1.0, max_retries=0, timeout=60,
            default_headers=agent_headers(name),
            model_info={"vision": False, "function_calling": False, "json_output": False, "family": "unknown",
                        "structured_output": False})

    async def main() -> list[dict[str, Any]]:
        writer = AssistantAgent("writer", model_client=client("writer"), system_message="Answer briefly.")
        critic = AssistantAgent("critic", model_client=client("critic"), system_message="Check the answer.")
        result = await RoundRobinGroupChat([writer, critic], max_turns=2).run(task="1 + 2")
        return [{"agent": m.source, "text": str(m.content)} for m in result.messages if m.source != "user"]

    return asyncio.run(main())


if __name__ == "__main__":
    run("autogen", "autogen", body)
