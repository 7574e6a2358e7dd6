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
    """Each LLM call of the trajectory becomes one :class:`Step`, in ``sequence_id`` order.

    Which spans are LLM calls follows Agent Lightning's ``TracerTraceToTriplet``:

    * a span carrying an ``llm`` record, whose name ``llm_call_match`` finds (unset: any name);
    * one step per response id: a later span with the same ``request_id`` (a duplicate export, or the
      instrumentation's span of a call the proxy also recorded) is the same call; it only fills in
      token ids the first one lacks;
    * an LLM span nested in an LLM call, with no response id of its own, is that call (its outermost
      one), whichever of the two came first: a nested span ends, so is exported and numbered, before
      its parent;
    * LLM spans without a response id that are not nested in one another (concurrent calls, siblings)
      are separate calls, each its own step, whatever their token ids;
    * with ``exclude_llm_call_in_reward`` (default), an LLM call inside a reward span or reward
      operation (an LLM-as-judge) is not a step;
    * the agent of a step is its own ``agent_name`` or that of the nearest enclosing span that names
      one, else that of another view of the same call; ``agent_match`` (``re.search``) decides ``trained``.

    Steps come in the order of their calls' ``sequence_id`` (a call nested in another: the outer one's),
    not of their start times: sequence ids are the one order every producer and the span stage agree
    on (the proxy numbers a call when it starts, the span stage numbers spans as they arrive), while
    start times come from different clocks. Concurrent calls whose spans end out of order therefore
    come out in the order they were numbered.

    An empty ``response_mask`` means every response token came from the policy (all ones).
    """
    pattern = _resolve(agent_match, agent_matcher)
    llm_pattern = _resolve(llm_call_match, llm_call_matcher)
    spans = trajectory.spans
    by_id = {s.span_id: s for s in spans} if any(s.parent_id for s in spans) else {}
    calls: list[tuple[Span, list[Span]]] = []  # (an LLM call's span, its ancestors), in sequence order
    for span in spans:
        llm = span.llm
        if llm is None or (llm_pattern is not None and llm_pattern.search(span.name) is None):
            continue
        ancestors = _ancestors(span, by_id) if by_id else []
        if exclude_llm_call_in_reward and any(is_reward_span(a) for a in ancestors):
            continue
        calls.append((span, ancestors))
    owner = _owners(calls)
    steps: list[Step] = []
    step_of: dict[str, Step] = {}
    for span, ancestors in calls:
        if owner[span.span_id] is not span:
            continue
        llm = span.llm
        assert llm is not None
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
        step_of[span.span_id] = step
    for span, ancestors in calls:
        same = step_of[owner[span.span_id].span_id]
        llm = span.llm
        assert llm is not None
        # The same call seen again: its step keeps its own, and takes token ids and an agent it does not have
        # (the instrumentation's view of a call may come first, the proxy's names the agent from its header).
        if same.agent_name is None:
            agent = span.agent_name or next((a.agent_name for a in ancestors if a.agent_name), None)
            if agent is not None:
                same.agent_name, same.trained = agent, is_trained(agent, pattern)
        if not len(same.prompt_token_ids) and len(llm.prompt_token_ids):
            same.prompt_token_ids = llm.prompt_token_ids
        if not len(same.response_token_ids) and len(llm.response_token_ids):
            same.response_token_ids, same.response_logprobs = llm.response_token_ids, llm.response_logprobs
            same.response_mask = list(llm.response_mask) or [1] * len(llm.response_token_ids)
    return steps


def _owners(calls: list[tuple[Span, list[Span]]]) -> dict[str, Span]:
    """The span whose step each LLM call span is: the first with its response id; for one without, the
    call it is nested in (the outermost); else itself."""
    call_ids = {span.span_id for span, _ in calls}
    first_with: dict[str, Span] = {}
    for span, _ in calls:
        rid = span.llm.request_id if span.llm is not None else None
        if rid:
            first_with.setdefault(rid, span)
    ancestors_of = {span.span_id: ancestors for span, ancestors in calls}
    spans = {span.span_id: span for span, _ in calls}
    owner: dict[str, Span] = {}

    def resolve(span_id: str) -> Span:
        if span_id in owner:
            return owner[span_id]
        span = spans[span_id]
        owner[span_id] = span  # for now: a parent cycle (broken ids) ends here instead of recursing forever
        rid = span.llm.request_id if span.llm is not None else None
        if rid:
            got = first_with[rid]
        else:
            outer = next((a for a in ancestors_of[span_id] if a.span_id in call_ids), None)
            got = resolve(outer.span_id) if outer is not None else span
        owner[span_id] = got
        return got

    for span_id in spans:
        resolve(span_id)
    return owner


__all__ = [
    "Step", "agent_matcher", "llm_call_matcher", "is_trained", "is_reward_span", "extract_transitions",
]
