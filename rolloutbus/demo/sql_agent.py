"""A Text-to-SQL agent, written the way a user writes theirs: the official ``openai`` client, pointed at the
LLM proxy by ``base_url`` only, and the public ``producers`` API for what the model cannot say itself.

The loop (Spider-style): write a query, run it on the question's SQLite database (a tool span each
time), on an error show the error and let the model rewrite it (at most ``max_rewrites`` times,
``ROLLOUTBUS_AGENT_REWRITES``, default ``MAX_REWRITES``; 0 is the single-turn form), answer with the
rows. Final reward: execution match with the gold query (``ROLLOUTBUS_AGENT_REWARD=graded``, the demo's
``--sql-reward graded``: training rollouts also earn partial credit for a partial answer, :data:`sql.REWARDS`;
validation and evaluation rollouts are always scored by execution match). Intermediate signals go through the stream
processor's reward rules when it is given them (``deploy/rewards/sql.toml``): a query that fails is a failed
tool call, an empty result a failed validator.
Validation and evaluation rollouts (mode ``val`` or ``test``) sample greedily, whatever the temperature.

The prompt is a resource: if the runner hands it a ``prompt_template`` resource named ``prompt``
(``ROLLOUTBUS_AGENT_PROMPT_RESOURCE``), its ``template`` is the system prompt (``{schema}`` marks where
the question's database schema goes) and its ``examples`` the worked examples, used as given whatever
the database (they are written on the company database); a new version is used from the next rollout
on. Without one, the built-in prompt with worked examples on the question's own database.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from foundation.errors import ConfigError
from producers import emit_span, emit_tool_call
from producers.proxy import proxy_headers, proxy_token, proxy_url
from rolloutbus.demo import sql
from rolloutbus.trainer_api import LitAgent, PromptTemplate, Rollout

MAX_REWRITES = 2
GREEDY_MODES = ("val", "test")  # rollouts that measure the policy rather than explore


def _reward_from_env() -> str:
    kind = os.environ.get("ROLLOUTBUS_AGENT_REWARD", "match")
    if kind not in sql.REWARDS:
        raise ConfigError(f"ROLLOUTBUS_AGENT_REWARD={kind!r}: choose one of {', '.join(sql.REWARDS)}")
    return kind


def _rewrites_from_env() -> int:
    raw = os.environ.get("ROLLOUTBUS_AGENT_REWRITES", str(MAX_REWRITES))
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"ROLLOUTBUS_AGENT_REWRITES={raw!r}: give a whole number >= 0 (0: one query, no rewrite)")
    return n


class SQLAgent(LitAgent):
    """Answers questions about the demo's SQLite databases by writing queries."""

    name = "sql-writer"

    def __init__(self, proxy: str | None = None, temperature: float | None = None, max_tokens: int = 48,
                 prompt_resource: str | None = None, max_rewrites: int | None = None, reward: str | None = None) -> None:
        self.proxy = proxy or os.environ.get("ROLLOUTBUS_LLM_PROXY_URL", "http://127.0.0.1:8788")
        self.prompt_resource = prompt_resource or os.environ.get("ROLLOUTBUS_AGENT_PROMPT_RESOURCE", "prompt")
        self.temperature = float(temperature if temperature is not None else os.environ.get("ROLLOUTBUS_AGENT_TEMPERATURE", "1.0"))
        self.max_tokens = max_tokens
        if max_rewrites is not None and max_rewrites < 0:
            raise ConfigError(f"max_rewrites={max_rewrites}: give a whole number >= 0 (0: one query, no rewrite)")
        self.max_rewrites = _rewrites_from_env() if max_rewrites is None else max_rewrites
        if reward is not None and reward not in sql.REWARDS:
            raise ConfigError(f"reward={reward!r}: choose one of {', '.join(sql.REWARDS)}")
        self.reward = _reward_from_env() if reward is None else reward

    def rollout(self, task: Any, resources: Mapping[str, Any], rollout: Rollout) -> float:
        from openai import OpenAI

        question = sql.Question.from_json(task)
        client = OpenAI(base_url=proxy_url(self.proxy), api_key=proxy_token() or "not-needed", max_retries=0, timeout=300)
        temperature = 0.0 if rollout.mode in GREEDY_MODES else self.temperature
        prompt = resources.get(self.prompt_resource)
        if isinstance(prompt, PromptTemplate):  # its version's config whole: the template and the examples
            template, examples = sql.template_from_config(dict(prompt.config()))
            messages = sql.question_messages(question, template, examples)
        else:
            messages = sql.question_messages(question)
        db = sql.connect(question.db)
        rows: list[Any] | None = None
        try:
            for _ in range(1 + self.max_rewrites):
                reply = client.chat.completions.create(
                    model="policy", messages=messages, temperature=temperature, max_tokens=self.max_tokens,  # type: ignore[arg-type]
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
        finally:
            db.close()
        # The gold runs on a fresh copy: a model's ``WITH ... DELETE`` passes execute()'s SELECT/WITH check.
        kind = "match" if rollout.mode in GREEDY_MODES else self.reward
        gold_db = sql.connect(question.db)
        try:
            return sql.graded_reward(kind, gold_db, rows, question.gold)
        finally:
            gold_db.close()


__all__ = ["GREEDY_MODES", "MAX_REWRITES", "SQLAgent"]
