"""Hand-made spans and events for the stream core tests."""

from __future__ import annotations

from typing import Any

from schemas.models import LLMCall, Reward, RolloutEvent, Span, ToolCall


def span(seq: int, rid: str = "r1", att: str = "a1", **kw: Any) -> Span:
    base: dict[str, Any] = dict(
        span_id=kw.pop("span_id", f"{rid}-{att}-{seq}"),
        trace_id="t" * 32,
        rollout_id=rid,
        attempt_id=att,
        sequence_id=seq,
        name=kw.pop("name", f"s{seq}"),
        start_time_ns=1000 + seq,
        end_time_ns=2000 + seq,
    )
    base.update(kw)
    return Span(**base)


def llm(seq: int, prompt: list[int] | None = None, response: list[int] | None = None, agent: str | None = "solver", rv: int | None = 3, **kw: Any) -> Span:
    resp = response if response is not None else [seq, seq + 1]
    return span(
        seq,
        kind="llm",
        agent_name=agent,
        llm=LLMCall(
            prompt_token_ids=prompt if prompt is not None else [1, 2, seq],
            response_token_ids=resp,
            response_logprobs=[-0.5] * len(resp),
            resource_version=rv,
        ),
        **kw,
    )


def tool(seq: int, ok: bool, **kw: Any) -> Span:
    return span(seq, kind="tool", tool=ToolCall(name="calc", ok=ok, error=None if ok else "boom"), **kw)


def reward(seq: int, value: float, **kw: Any) -> Span:
    return span(seq, kind="reward", reward=Reward(value=value), **kw)


def finished(rid: str = "r1", att: str = "a1", task: str = "task1", reward_: float | None = 1.0, span_count: int = 0, **kw: Any) -> RolloutEvent:
    return RolloutEvent(
        rollout_id=rid, attempt_id=att, event="FINISHED", time_ns=kw.pop("time_ns", 10_000), task_id=task,
        status=kw.pop("status", "succeeded"), final_reward=reward_, span_count=span_count, **kw,
    )
