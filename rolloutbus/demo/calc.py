"""The demo's task: arithmetic word problems solved with a calculator tool over several turns.

A problem is digits and keywords, e.g. ``"5 3 gain"`` (or ``"5 3 2 gain times"``): combine the first
two numbers with the operation the keyword names, then the result and the next number with the next
keyword's, and so on. The agent calls the calculator (``calc 5+3``), reads its answer (``8``), and
answers (``answer 8``). Which operation each keyword names is what the policy learns from reward: the
supervised warm-up demonstrations hold misconceptions (for five of the six keywords they most often
use a wrong operation), so the starting policy knows the format but its most likely choice is often
wrong. The demo uses one operation per problem.

Everything here is pure: tasks, the calculator, the checker, the demonstrations.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

KEYWORDS: dict[str, str] = {"gain": "+", "more": "+", "lose": "-", "less": "-", "times": "*", "each": "*"}
OPS = ("+", "-", "*")
_CALC = re.compile(r"^calc (-?\d{1,4})([+\-*])(-?\d{1,4})$")
_ANSWER = re.compile(r"^answer (-?\d{1,6})$")


@dataclass(frozen=True)
class Problem:
    """Numbers ``n0 n1 .. nk`` and keywords ``w1 .. wk``: fold left, ``((n0 w1 n1) w2 n2) ...``."""

    numbers: tuple[int, ...]
    words: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join([*map(str, self.numbers), *self.words])

    @property
    def answer(self) -> int:
        value = self.numbers[0]
        for word, n in zip(self.words, self.numbers[1:]):
            value = apply(value, KEYWORDS[word], n)
        return value

    @property
    def family(self) -> str:
        """Its keywords (task selection judges an unseen problem by its keywords' recent rollouts)."""
        return " ".join(self.words)

    def to_json(self) -> str:
        return json.dumps({"question": self.text, "numbers": list(self.numbers), "words": list(self.words)})

    @classmethod
    def from_json(cls, data: str) -> Problem:
        d = json.loads(data)
        return cls(tuple(int(n) for n in d["numbers"]), tuple(str(w) for w in d["words"]))


def apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def calculator(expression: str) -> tuple[bool, str]:
    """The tool: ``"5+3"`` → ``(True, "8")``; anything else → ``(False, reason)``."""
    match = re.fullmatch(r"(-?\d{1,4})([+\-*])(-?\d{1,4})", expression.strip())
    if not match:
        return False, f"cannot evaluate {expression.strip()[:40]!r}: expected <int><op><int>"
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    return True, str(apply(a, op, b))


def parse_action(text: str) -> tuple[str, str]:
    """The agent's move: ``("calc", "5+3")``, ``("answer", "16")`` or ``("invalid", text)``."""
    text = text.strip()
    m = _CALC.match(text)
    if m:
        return "calc", f"{m.group(1)}{m.group(2)}{m.group(3)}"
    m = _ANSWER.match(text)
    if m:
        return "answer", m.group(1)
    if text.startswith("calc "):
        return "calc", text[5:]
    return "invalid", text


def check(problem: Problem, answer: str | None) -> float:
    """The final reward: 1.0 for the right number, 0.0 otherwise."""
    try:
        return 1.0 if answer is not None and int(answer) == problem.answer else 0.0
    except ValueError:
        return 0.0


def problem_space(steps: int = 1) -> int:
    """How many distinct problems of ``steps`` operations there are."""
    return 9 ** (steps + 1) * len(KEYWORDS) ** steps


def problems(count: int, seed: int, steps: int = 1, exclude: set[Problem] | None = None) -> list[Problem]:
    """``count`` distinct problems of ``steps`` operations, none of them in ``exclude``."""
    rng = random.Random(seed)
    words = sorted(KEYWORDS)
    space = problem_space(steps)
    if count + len(exclude or ()) > space:
        raise ValueError(f"{count} problems asked for, but only {space - len(exclude or ())} distinct ones of {steps} step(s) are left")
    out: list[Problem] = []
    seen = set(exclude or ())
    while len(out) < count:
        p = Problem(tuple(rng.randint(1, 9) for _ in range(steps + 1)), tuple(rng.choice(words) for _ in range(steps)))
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def split(train: int, held_out: int, seed: int = 7, steps: int = 1) -> tuple[list[Problem], list[Problem]]:
    """Training problems and held-out problems, disjoint."""
    test = problems(held_out, seed + 1, steps)
    return problems(train, seed, steps, exclude=set(test)), test


# The warm-up's misconceptions: for these keywords the demonstrations most often use the wrong
# operation named here, so the starting policy's most likely choice is wrong; RL must fix it.
MISCONCEPTIONS: dict[str, str] = {"more": "-", "lose": "+", "less": "*", "times": "+", "each": "-"}


def warmup_distribution(word: str) -> dict[str, float]:
    """How often the demonstrations use each operation for ``word``.

    Keywords with a misconception: the wrong operation 50%, the right one 30%, the third 20%.
    The others: right 60%, each wrong one 20%. The starting policy thus reads the keyword, but guesses.
    """
    right = KEYWORDS[word]
    wrong = MISCONCEPTIONS.get(word)
    if wrong is None:
        return {op: 0.6 if op == right else 0.2 for op in OPS}
    return {op: 0.3 if op == right else 0.5 if op == wrong else 0.2 for op in OPS}


def demonstration(problem: Problem, rng: random.Random) -> list[dict[str, str]]:
    """A full conversation for supervised warm-up, its operations drawn from :func:`warmup_distribution`.

    A wrong operation is followed through consistently (the calculator's real result is used), so the
    demonstrations teach the format, reading numbers and copying results, and a weak, partly wrong
    idea of what the keywords mean.
    """

    def pick(word: str) -> str:
        dist = warmup_distribution(word)
        return rng.choices(list(dist), weights=list(dist.values()))[0]

    conv = [{"role": "user", "content": problem.text}]
    value = problem.numbers[0]
    for word, n in zip(problem.words, problem.numbers[1:]):
        op = pick(word)
        conv.append({"role": "assistant", "content": f"calc {value}{op}{n}"})
        value = apply(value, op, n)
        conv.append({"role": "tool", "content": str(value)})
    conv.append({"role": "assistant", "content": f"answer {value}"})
    return conv


def sft_pairs(conversations: list[list[dict[str, str]]]) -> list[tuple[list[dict[str, str]], str]]:
    """(messages so far, the assistant's reply) for every assistant turn of every conversation."""
    pairs = []
    for conv in conversations:
        for i, msg in enumerate(conv):
            if msg["role"] == "assistant":
                pairs.append((conv[:i], msg["content"]))
    return pairs
