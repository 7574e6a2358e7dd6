"""LLM spans → MDP transitions (state = prompt ids, action = response ids). Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.models import Span
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
    return _compile(agent_match, "agent_match")


def llm_call_matcher(llm_call_match: str | None) -> re.Pattern[str] | None:
    """Compile ``llm_call_match`` (a regex searched in span names); a bad pattern is a ValueError."""
    return _compile(llm_call_match, "llm_call_match")


def _compile(pattern: str | None, what: str) -> re.Pattern[str] | None:
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{what} {pattern!r} is not a valid regular expression: {exc}") from exc


def is_trained(agent_name: str | None, pattern: re.Pattern[str] | None) -> bool:
    """No pattern: every agent is trained. Otherwise ``re.search`` on the agent name ('' when unnamed)."""
    return pattern is None or pattern.search(agent_name or "") is not None


AGL_OPERATION = "agentlightning.operation"
AGL_REWARD = "agentlightning.reward"


def is_reward_span(span: Span) -> bool:
    """A span that gives a reward, or Agent Lightning's reward operation (``operation(name="agentlightning.reward")``)."""
    return span.reward is not None or (
        span.name == AGL_OPERATION and span.attributes.get("agentlightning.operation.name") == AGL_REWARD
    )


def _ancestors(span: Span, by_id: dict[str, Span]) -> list[Span]:
    """The span's parents within the trajectory, nearest first (a parent outside it ends the chain)."""
    out: list[Span] = []
    seen = {span.span_id}
    parent = span.parent_id
    while parent is not None and parent in by_id and parent not in seen:
        seen.add(parent)
        p = by_id[parent]
        out.append(p)
        parent = p.parent_id
    return out


def _resolve(pattern: str | re.Pattern[str] | None, compile_: Any) -> re.Pattern[str] | None:
    return pattern if isinstance(pattern, re.Pattern) else compile_(pattern)


def extract_transitions(
    trajectory: Trajectory,
    task_id: str,
    agent_match: str | re.Pattern[str] | None = None,
    *,
    llm_call_match: str | re.Pattern[str] | None = None,
    exclude_llm_call_in_reward: bool = True,
) -> list[Step]:
    """Each LLM call of the trajectory, in trajectory order, becomes one :class:`Step`.

    Which spans are LLM calls follows Agent Lightning's ``TracerTraceToTriplet``:

    * a span carrying an ``llm`` record, whose name ``llm_call_match`` finds (unset: any name);
    * one step per response id: a later span with the same ``request_id`` (a duplicate export, or the
      instrumentation's span of a call the proxy also recorded) is the same call; it only fills in
      token ids the first one lacks;
    * an LLM span nested in a counted LLM call, with no response id of its own, is the same call;
    * with ``exclude_llm_call_in_reward`` (default), an LLM call inside a reward span or reward
      operation (an LLM-as-judge) is not a step;
    * the agent of a step is its own ``agent_name`` or that of the nearest enclosing span that names
      one; ``agent_match`` (``re.search``) decides ``trained``.

    An empty ``response_mask`` means every response token came from the policy (all ones).
    """
    pattern = _resolve(agent_match, agent_matcher)
    llm_pattern = _resolve(llm_call_match, llm_call_matcher)
    spans = trajectory.spans
    by_id = {s.span_id: s for s in spans} if any(s.parent_id for s in spans) else {}
    steps: list[Step] = []
    by_response: dict[str, Step] = {}
    counted: set[str] = set()
    for span in spans:
        llm = span.llm
        if llm is None or (llm_pattern is not None and llm_pattern.search(span.name) is None):
            continue
        ancestors = _ancestors(span, by_id) if by_id else []
        if exclude_llm_call_in_reward and any(is_reward_span(a) for a in ancestors):
            continue
        rid = llm.request_id
        same = by_response.get(rid) if rid else None
        if same is None and not rid:
            same = next((st for a in ancestors if (st := _step_of(a.span_id, steps, counted)) is not None), None)
        if same is not None:
            # The same call seen again: keep the first step, take token ids it does not have.
            if not len(same.prompt_token_ids) and len(llm.prompt_token_ids):
                same.prompt_token_ids = llm.prompt_token_ids
            if not len(same.response_token_ids) and len(llm.response_token_ids):
                same.response_token_ids, same.response_logprobs = llm.response_token_ids, llm.response_logprobs
                same.response_mask = list(llm.response_mask) or [1] * len(llm.response_token_ids)
            continue
        agent = span.agent_name or next((a.agent_name for a in ancestors if a.agent_name), None)
        mask = list(llm.response_mask) or [1] * len(llm.response_token_ids)
        step = Step(
            rollout_id=span.rollout_id,
            attempt_id=span.attempt_id,
            task_id=task_id,
            span_id=span.span_id,
            turn=len(steps),
            sequence_id=span.sequence_id,
            agent_name=agent,
            resource_version=llm.resource_version,
            # the span's own sequences, not copies (the stream worker's are arrays over the wire bytes)
            prompt_token_ids=llm.prompt_token_ids,
            response_token_ids=llm.response_token_ids,
            response_logprobs=llm.response_logprobs,
            response_mask=mask,
            trained=is_trained(agent, pattern),
        )
        steps.append(step)
        counted.add(span.span_id)
        if rid:
            by_response[rid] = step
    return steps


def _step_of(span_id: str, steps: list[Step], counted: set[str]) -> Step | None:
    if span_id not in counted:
        return None
    return next((st for st in reversed(steps) if st.span_id == span_id), None)


__all__ = [
    "Step", "agent_matcher", "llm_call_matcher", "is_trained", "is_reward_span", "extract_transitions",
]
