"""A Text-to-SQL agent, written the way a user writes theirs: the official ``openai`` client, pointed at the
LLM proxy by ``base_url`` only, and the public ``producers`` API for what the model cannot say itself.

The loop (Spider-style): write a query, run it on SQLite (a tool span each time), on an error show the
error and let the model rewrite it (at most ``MAX_REWRITES`` times), answer with the rows. Final
reward: execution match with the gold query. Intermediate signals go through the stream processor's
reward rules: a query that fails is a failed tool call, an empty result a failed validator.

The prompt is a resource: if the runner hands it a ``prompt_template`` resource named ``prompt``
(``ROLLOUTBUS_AGENT_PROMPT_RESOURCE``), its ``template`` is the system prompt (``{schema}`` marks where
the schema goes) and its ``examples`` the worked examples; a new version is used from the next rollout
on. Without one, the built-in prompt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from producers import emit_span, emit_tool_call
from producers.context import RolloutContext
from producers.litagent import LitAgent
from producers.proxy import proxy_headers, proxy_token, proxy_url
from rolloutbus.demo import sql
from schemas import ResourceVersion

MAX_REWRITES = 2


class SQLAgent(LitAgent):
    """Answers questions about the company database by writing SQLite queries."""

    name = "sql-writer"

    def __init__(self, proxy: str | None = None, temperature: float | None = None, max_tokens: int = 48,
                 prompt_resource: str | None = None) -> None:
        self.proxy = proxy or os.environ.get("ROLLOUTBUS_LLM_PROXY_URL", "http://127.0.0.1:8788")
        self.prompt_resource = prompt_resource or os.environ.get("ROLLOUTBUS_AGENT_PROMPT_RESOURCE", "prompt")
        self.temperature = float(temperature if temperature is not None else os.environ.get("ROLLOUTBUS_AGENT_TEMPERATURE", "1.0"))
        self.max_tokens = max_tokens

    def rollout(self, task: Any, resources: Mapping[str, ResourceVersion], rollout: RolloutContext) -> float:
        from openai import OpenAI

        question = sql.Question.from_json(task)
        client = OpenAI(base_url=proxy_url(self.proxy), api_key=proxy_token() or "not-needed", max_retries=0, timeout=300)
        db = sql.connect()
        prompt = resources.get(self.prompt_resource)
        if prompt is not None and prompt.kind == "prompt_template":
            system, examples = sql.from_prompt_config(prompt.config)
            messages = sql.messages(question.text, system, examples)
        else:
            messages = sql.messages(question.text)
        rows: list[Any] | None = None
        for _ in range(1 + MAX_REWRITES):
            reply = client.chat.completions.create(
                model="policy", messages=messages, temperature=self.temperature, max_tokens=self.max_tokens,  # type: ignore[arg-type]
                extra_headers=proxy_headers(),
            )
            text = reply.choices[0].message.content or ""
            query = sql.extract_sql(text)
            ok, result = sql.execute(db, query)
            emit_tool_call("sqlite", arguments=query, result=f"{len(result)} rows" if ok else None, ok=ok,
                           error=None if ok else str(result))
            if ok:
                rows = list(result)
                if not rows:
                    emit_span("validator", "non_empty_result", {"validator.verdict": "fail"})
                break
            messages += [{"role": "assistant", "content": text}, sql.retry_message(result)]
        db.close()
        return 1.0 if rows is not None and sql.execution_match(sql.connect(), rows, question.gold) else 0.0


__all__ = ["MAX_REWRITES", "SQLAgent"]
