"""Automatic prompt optimization (APO): the algorithm, pure. The process around it is ``trainer.apo_cli``.

A prompt is a ``prompt_template`` resource: its ``config["template"]`` is the text optimized (other
config entries, such as worked examples, travel with it unchanged). One run is a beam search:

1. the incumbent (the latest published version) and any user candidates are scored on validation tasks;
2. each round, every prompt in the beam gets ``branch`` children: the optimizer LLM reads low- and
   high-reward trajectories of that prompt and writes a critique (the "textual gradient"), then
   rewrites the prompt to answer it; children are scored; the best ``beam_width`` of beam and children
   stay in the beam;
3. the best candidate of the run is published as a new version only if it beats the incumbent's score.

Here: the candidates, the meta-prompts, reading the LLM's rewrite, scoring, and the search. Scoring and
the LLM are functions the caller passes, so the search runs on fakes in unit tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MAX_TEMPLATE_CHARS = 4000
_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


@dataclass
class Candidate:
    """One prompt of a run, with where it came from and its validation score."""

    id: str
    config: dict[str, str]  # the resource config; config["template"] is the text optimized
    source: str  # incumbent | user | optimizer
    round: int = 0
    parent_id: str = ""
    critique: str = ""
    note: str = ""  # why it was not scored (a rejected rewrite), or what was odd about it
    rewards: dict[int, float] = field(default_factory=dict)  # validation task index → reward
    tasks: int = 0  # validation tasks published for it
    published_version: int | None = None
    created_ns: int = 0

    @property
    def template(self) -> str:
        return self.config.get("template", "")

    @property
    def rejected(self) -> bool:
        """A rewrite that is not a usable prompt (see :func:`parse_rewrite`): recorded, never scored."""
        return self.note.startswith("rejected")

    @property
    def scored(self) -> bool:
        return self.tasks > 0 and not self.rejected

    @property
    def score(self) -> float | None:
        """Mean reward over its validation tasks; a task with no finished rollout counts 0."""
        if not self.scored:
            return None
        return sum(self.rewards.values()) / self.tasks

    @property
    def score_se(self) -> float | None:
        """Standard error of :attr:`score` (over tasks)."""
        if not self.scored or self.tasks < 2:
            return None
        values = [self.rewards.get(i, 0.0) for i in range(self.tasks)]
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        return math.sqrt(var / len(values))


def paired_difference(first: Sequence[float], final: Sequence[float]) -> tuple[float, float]:
    """Mean of ``final - first`` over the same tasks and its standard error (paired, n-1 variance)."""
    d = [b - a for a, b in zip(first, final)]
    n = len(d)
    if n == 0:
        raise ValueError("a paired difference needs scores on the same tasks")
    mean = sum(d) / n
    if n == 1:
        return mean, math.nan  # one task says nothing about the spread
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return mean, math.sqrt(var / n)


# --------------------------------------------------------------------------- what the optimizer LLM reads


@dataclass(frozen=True)
class Trajectory:
    """One rollout as the critique shows it: the task, what happened, the reward."""

    task: str
    steps: tuple[str, ...]
    reward: float

    def render(self, limit: int = 300) -> str:
        lines = [f"Task: {_clip(self.task, limit)}"]
        lines += [f"  {_clip(s, limit)}" for s in self.steps]
        lines.append(f"  Reward: {self.reward:g}")
        return "\n".join(lines)


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def placeholders(template: str) -> list[str]:
    """The ``{name}`` placeholders of a template, in order, once each."""
    return list(dict.fromkeys(_PLACEHOLDER.findall(template)))


def critique_messages(template: str, failures: Sequence[Trajectory], successes: Sequence[Trajectory]) -> list[dict[str, str]]:
    """Ask for a textual gradient: why did this prompt lead to these low rewards?"""
    parts = [f"An AI assistant was given this prompt:\n---\n{template}\n---"]
    if failures:
        parts.append("It did badly on these tasks:\n" + "\n".join(t.render() for t in failures))
    if successes:
        parts.append("It did well on these:\n" + "\n".join(t.render() for t in successes))
    parts.append("In two or three sentences, say what in the prompt caused the bad results and what the prompt "
                 "should say instead.")
    return [{"role": "system", "content": "You review prompts written for AI assistants and explain their mistakes."},
            {"role": "user", "content": "\n\n".join(parts)}]


def rewrite_messages(template: str, critique: str) -> list[dict[str, str]]:
    """Ask for the edit: the prompt rewritten to answer the critique."""
    keep = placeholders(template)
    rule = f" Keep {', '.join(keep)} exactly as written: the program fills {'it' if len(keep) == 1 else 'them'} in." if keep else ""
    return [{"role": "system", "content": "You improve prompts written for AI assistants."},
            {"role": "user", "content": f"Here is a prompt:\n---\n{template}\n---\nFeedback on it: {critique.strip()}\n\n"
                                        f"Rewrite the prompt so that it fixes the problems in the feedback.{rule} "
                                        "Reply with the new prompt only."}]


_FENCE = re.compile(r"```[a-zA-Z]*\n?(.*?)```", re.S)
_LEAD = re.compile(r"^(?:here is|here's|sure|certainly)[^\n]*?(?:prompt|version)[^\n]*:\s*\n?", re.I)
_LABEL = re.compile(r"^(?:new |improved |rewritten |revised )?prompt\s*:\s*", re.I)


def parse_rewrite(reply: str, parent: str) -> tuple[str, str]:
    """``(template, note)`` from the LLM's rewrite. A non-empty ``note`` starting with "rejected" means
    the reply is not a usable prompt (empty, the parent unchanged, too long); other notes are kept as
    remarks (a placeholder of the parent is missing)."""
    text = reply.strip()
    m = _FENCE.search(text)
    if m:
        text = m.group(1).strip()
    text = _LEAD.sub("", text, count=1).strip()
    text = _LABEL.sub("", text, count=1).strip()
    text = text.strip("-").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    if not text:
        return "", "rejected: the rewrite was empty"
    if text == parent.strip():
        return text, "rejected: the rewrite is the parent unchanged"
    if len(text) > MAX_TEMPLATE_CHARS:
        return text[:MAX_TEMPLATE_CHARS], f"rejected: the rewrite is over {MAX_TEMPLATE_CHARS} characters"
    lost = [p for p in placeholders(parent) if p not in text]
    return text, f"lost {', '.join(lost)}" if lost else ""


# --------------------------------------------------------------------------- the search


Expand = Callable[[list[Candidate], int], list[Candidate]]  # (beam, round) → children (critique and template set)
Score = Callable[[list[Candidate]], None]  # fills rewards and tasks of each candidate
Record = Callable[[list[Candidate]], None]


def rank(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Best first: higher score; on a tie the incumbent, then the earlier candidate (stable)."""
    scored = [c for c in candidates if c.score is not None]
    return sorted(scored, key=lambda c: (-(c.score or 0.0), c.source != "incumbent"))


def beam_search(incumbent: Candidate, seeds: Sequence[Candidate], *, rounds: int, beam_width: int,
                expand: Expand, score: Score, record: Record, say: Callable[[str], None] = lambda _: None) -> list[Candidate]:
    """Every candidate of the run, in the order made (the incumbent first), each scored or rejected."""
    pool = [incumbent, *seeds]
    score(pool)
    record(pool)
    beam = rank(pool)[:beam_width]
    say(f"round 0: {_summary(pool)}")
    for r in range(1, rounds + 1):
        children = expand(beam, r)
        usable = [c for c in children if not c.rejected]
        if usable:
            score(usable)
        record(children)
        pool += children
        beam = rank([*beam, *usable])[:beam_width]
        say(f"round {r}: {_summary(children)}; beam {', '.join(f'{c.id} {c.score:.3f}' for c in beam)}")
    return pool


def _summary(cands: Sequence[Candidate]) -> str:
    return ", ".join(f"{c.id} {c.score:.3f}" if c.score is not None else f"{c.id} ({c.note})" for c in cands) or "nothing"


def winner(incumbent: Candidate, pool: Sequence[Candidate], min_gain: float = 0.0) -> Candidate | None:
    """The candidate to publish: the best of the run, if it is not the incumbent and scores more than
    ``min_gain`` above it (0: any gain; on a few validation tasks one task more is noise, so a margin helps)."""
    ranked = rank(pool)
    if not ranked or ranked[0] is incumbent or incumbent.score is None:
        return None
    best = ranked[0]
    return best if (best.score or 0.0) - incumbent.score > min_gain else None


__all__ = ["Candidate", "MAX_TEMPLATE_CHARS", "Trajectory", "beam_search", "critique_messages", "paired_difference",
           "parse_rewrite", "placeholders", "rank", "rewrite_messages", "winner"]
