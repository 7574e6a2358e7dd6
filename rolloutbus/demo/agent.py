"""The demo agent, written against the public API the way a user writes theirs.

It talks to its model only through the LLM proxy (an OpenAI-compatible endpoint per rollout, so every
call is recorded with its token ids), calls a calculator tool and reports each call with
``emit_tool_call``, and returns the checker's verdict as its final reward.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from producers import emit_tool_call
from producers.proxy import proxy_headers, proxy_url
from rolloutbus.demo.calc import Problem, calculator, check, parse_action
from rolloutbus.trainer_api import LitAgent, Rollout

MAX_TURNS = 4


def chat(base_url: str, messages: list[dict[str, str]], *, temperature: float, max_tokens: int = 16,
         headers: Mapping[str, str] | None = None, timeout: float = 60.0) -> str:
    """One OpenAI-style chat completion; returns the assistant's text."""
    body = json.dumps({"model": "policy", "messages": messages, "temperature": temperature, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(f"{base_url}/chat/completions", data=body, method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data = json.loads(resp.read())
    return str(data["choices"][0]["message"]["content"] or "")


class CalcAgent(LitAgent):
    """Solves ``"5 3 gain"``-style problems with a calculator, over several turns."""

    name = "calc-solver"

    def __init__(self, proxy: str | None = None, temperature: float | None = None) -> None:
        self.proxy = proxy or os.environ.get("ROLLOUTBUS_LLM_PROXY_URL", "http://127.0.0.1:8788")
        self.temperature = float(temperature if temperature is not None else os.environ.get("ROLLOUTBUS_AGENT_TEMPERATURE", "1.0"))

    def rollout(self, task: Any, resources: Mapping[str, Any], rollout: Rollout) -> float:
        problem = Problem.from_json(task if isinstance(task, str) else json.dumps(task))
        base = proxy_url(self.proxy)
        messages = [{"role": "user", "content": problem.text}]
        answer: str | None = None
        for _ in range(MAX_TURNS):
            text = chat(base, messages, temperature=self.temperature, headers=proxy_headers())
            messages.append({"role": "assistant", "content": text})
            kind, arg = parse_action(text)
            if kind == "calc":
                ok, result = calculator(arg)
                emit_tool_call("calculator", arguments=arg, result=result if ok else None, ok=ok, error=None if ok else result)
                messages.append({"role": "tool", "content": result})
            elif kind == "answer":
                answer = arg
                break
            else:
                break  # neither a tool call nor an answer: the episode ends unsolved
        return check(problem, answer)
