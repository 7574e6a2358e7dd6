"""LLM spans → MDP transitions (state = prompt ids, action = response ids). Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from streams.assembly import Trajectory


@dataclass
class Step:
    """One LLM call of a trajectory as the trainer sees it.

    ``reward`` is the intermediate reward landed on this turn, ``return_`` its credit, ``advantage``
    the group-relative advantage (filled in by grouping). ``trained`` is false for agents that
    ``agent_match`` leaves out: their turns are stored for analysis, never trained on.
    """

    rollout_id: str
    attempt_id: str
    task_id: str
    span_id: str
    turn: int
    sequence_id: int
    agent_name: str | None
    resource_version: int | None
    prompt_token_ids: Sequence[int]
    response_token_ids: Sequence[int]
    response_logprobs: Sequence[float] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    trained: bool = True
    reward: float = 0.0
    return_: float = 0.0
    advantage: float = 0.0


def agent_matcher(agent_match: str | None) -> re.Pattern[str] | None:
    """Compile ``agent_match``; a bad pattern is a ValueError that names it."""
    if not agent_match:
        return None
    try:
        return re.compile(agent_match)
    except re.error as exc:
        raise ValueError(f"agent_match {agent_match!r} is not a valid regular expression: {exc}") from exc


def is_trained(agent_name: str | None, pattern: re.Pattern[str] | None) -> bool:
    """No pattern: every agent is trained. Otherwise ``re.search`` on the agent name ('' when unnamed)."""
    return pattern is None or pattern.search(agent_name or "") is not None


def extract_transitions(
    trajectory: Trajectory, task_id: str, agent_match: str | re.Pattern[str] | None = None
) -> list[Step]:
    """Each span carrying an ``llm`` call, in trajectory order, becomes one :class:`Step`.

    An empty ``response_mask`` means every response token came from the policy (all ones).
    """
    pattern = agent_match if isinstance(agent_match, re.Pattern) else agent_matcher(agent_match)
    steps: list[Step] = []
    for span in trajectory.spans:
        llm = span.llm
        if llm is None:
            continue
        mask = list(llm.response_mask) or [1] * len(llm.response_token_ids)
        steps.append(
            Step(
                rollout_id=span.rollout_id,
                attempt_id=span.attempt_id,
                task_id=task_id,
                span_id=span.span_id,
                turn=len(steps),
                sequence_id=span.sequence_id,
                agent_name=span.agent_name,
                resource_version=llm.resource_version,
                # the span's own sequences, not copies (the stream worker's are arrays over the wire bytes)
                prompt_token_ids=llm.prompt_token_ids,
                response_token_ids=llm.response_token_ids,
                response_logprobs=llm.response_logprobs,
                response_mask=mask,
                trained=is_trained(span.agent_name, pattern),
            )
        )
    return steps


__all__ = ["Step", "agent_matcher", "is_trained", "extract_transitions"]
