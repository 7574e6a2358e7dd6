"""The calc demo's agent loop, standard library only, for the agents the Agent Lightning drivers run in
their own interpreters (al_e2e_driver.py, al1_e2e_driver.py): ``calc a+b`` → the calculator's result →
``answer n``, four turns at most, scored against the problem's answer."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

OPS = {"gain": "+", "more": "+", "lose": "-", "less": "-", "times": "*", "each": "*"}


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def play(task: dict[str, Any], chat: Callable[[list[dict[str, str]]], str]) -> tuple[list[str], int | None, float]:
    """One episode; ``chat(messages)`` is the LLM call → (its replies, the answer, the reward): 1.0 when the
    answer is right, ``1 / (1 + |n - answer|)`` for a wrong ``n``, 0.0 without one."""
    messages = [{"role": "user", "content": task["question"]}]
    answer, replies = None, []
    for _ in range(4):
        text = chat(messages).strip()
        replies.append(text)
        messages.append({"role": "assistant", "content": text})
        if m := re.fullmatch(r"calc (-?\d{1,4})([+\-*])(-?\d{1,4})", text):
            messages.append({"role": "tool", "content": str(_apply(int(m.group(1)), m.group(2), int(m.group(3))))})
        elif m := re.fullmatch(r"answer (-?\d{1,6})", text):
            answer = int(m.group(1))
            break
        else:
            break
    value = int(task["numbers"][0])
    for word, n in zip(task["words"], task["numbers"][1:]):
        value = _apply(value, OPS[word], int(n))
    return replies, answer, 0.0 if answer is None else 1.0 / (1 + abs(answer - value))
