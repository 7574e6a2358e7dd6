"""A fixed, seeded synthetic workload of agent rollouts, as plain Python data.

The same workload feeds every side of the bench (our producers, our gateway, Agent Lightning's
store), so the comparisons carry the same span count, the same token counts and the same attribute
bytes. Nothing here imports a third-party package: this module also runs inside the separate
Agent Lightning virtual environment (``bench/agentlightning_store.py``, imported as ``bench.workload``). The converter to our Avro
span dicts imports ``schemas.codec`` only when it is called.

A rollout is a sequence of spans with strictly increasing ``sequence_id``: a user message first, a
reward last, and in between LLM calls (1,000-token prompt, ~50-token response with logprobs) and
small spans (tool calls and messages) mixed by ``llm_fraction``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SPANS_PER_ROLLOUT",
    "SynthSpan",
    "WorkloadSpec",
    "generate",
    "iter_rollouts",
    "size_summary",
    "spec_for",
    "to_agentlightning",
    "to_avro",
]

# Fixed epoch so timestamps (and thus every byte) depend on the seed only, never on the clock.
_EPOCH_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
_VOCAB = 151_000  # Qwen-sized vocabulary: token ids need the full uint32 width on the wire
_TOOLS = ("search", "calculator", "python", "read_file", "http_get")


@dataclass(frozen=True)
class WorkloadSpec:
    """What determines the workload. Equal specs give equal workloads, byte for byte."""

    seed: int = 7
    rollouts: int = 64
    spans_per_rollout: int = 16
    llm_fraction: float = 0.25
    prompt_tokens: int = 1000
    response_tokens: int = 50  # mean; each response is drawn in [0.8x, 1.2x]

    def __post_init__(self) -> None:
        if self.rollouts < 1:
            raise ValueError(f"rollouts must be >= 1, got {self.rollouts}")
        if self.spans_per_rollout < 2:
            raise ValueError(f"spans_per_rollout must be >= 2 (a message and a reward), got {self.spans_per_rollout}")
        if not 0.0 <= self.llm_fraction <= 1.0:
            raise ValueError(f"llm_fraction must be in [0, 1], got {self.llm_fraction}")
        if self.prompt_tokens < 1 or self.response_tokens < 1:
            raise ValueError("prompt_tokens and response_tokens must be >= 1")

    @property
    def total_spans(self) -> int:
        return self.rollouts * self.spans_per_rollout


SPANS_PER_ROLLOUT = 16  # the benches that take a size in spans send whole rollouts of 16


def spec_for(spans: int, llm_fraction: float = 0.25, seed: int = 7) -> WorkloadSpec:
    """The workload with ``spans`` spans, rounded to whole rollouts of 16 (at least one)."""
    return WorkloadSpec(seed=seed, rollouts=max(1, round(spans / SPANS_PER_ROLLOUT)), spans_per_rollout=SPANS_PER_ROLLOUT,
                        llm_fraction=llm_fraction)


@dataclass(frozen=True)
class SynthSpan:
    """One span of a synthetic rollout. ``kind`` is llm | tool | message | reward."""

    rollout_id: str
    attempt_id: str
    trace_id: str
    span_id: str
    parent_id: str | None
    sequence_id: int
    kind: str
    name: str
    start_time_ns: int
    end_time_ns: int
    attributes: dict[str, str] = field(default_factory=dict)
    # llm
    model: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    response_token_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    # tool
    tool_name: str | None = None
    tool_arguments: str = ""
    tool_result: str | None = None
    # reward
    reward: float | None = None


def _hex(rng: random.Random, chars: int) -> str:
    return f"{rng.getrandbits(chars * 4):0{chars}x}"


def _text(rng: random.Random, lo: int, hi: int) -> str:
    """Printable filler of a seeded length in [lo, hi] (stands for a message or tool payload)."""
    n = rng.randint(lo, hi)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     ") for _ in range(n))


def _rollout(spec: WorkloadSpec, index: int) -> list[SynthSpan]:
    # One RNG per rollout, derived from (seed, index): rollouts are independent of each other, so
    # a consumer that generates rollout i alone gets the same spans as one that generates all.
    digest = hashlib.sha256(f"{spec.seed}:{index}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "little"))
    rollout_id = f"ro-{spec.seed}-{index:06d}"
    attempt_id = f"at-{spec.seed}-{index:06d}-0"
    trace_id = _hex(rng, 32)
    root_id = _hex(rng, 16)
    t = _EPOCH_NS + index * 1_000_000_000
    spans: list[SynthSpan] = []
    common = {"agent.name": "bench-agent", "task.id": f"task-{index % 97}"}
    n = spec.spans_per_rollout
    for seq in range(n):
        dur = rng.randint(50_000, 5_000_000)
        span_id = root_id if seq == 0 else _hex(rng, 16)
        parent = None if seq == 0 else root_id
        base: dict[str, Any] = dict(
            rollout_id=rollout_id, attempt_id=attempt_id, trace_id=trace_id, span_id=span_id,
            parent_id=parent, sequence_id=seq, start_time_ns=t, end_time_ns=t + dur,
        )
        if seq == 0:
            s = SynthSpan(kind="message", name="message.user",
                          attributes={**common, "role": "user", "content": _text(rng, 80, 200)}, **base)
        elif seq == n - 1:
            value = round(rng.random(), 4)
            s = SynthSpan(kind="reward", name="reward", reward=value,
                          attributes={**common, "reward.value": json.dumps(value)}, **base)
        elif rng.random() < spec.llm_fraction:
            r = rng.randint(int(spec.response_tokens * 0.8), int(spec.response_tokens * 1.2))
            s = SynthSpan(
                kind="llm", name="llm.chat", model="bench-policy",
                prompt_token_ids=[rng.randrange(_VOCAB) for _ in range(spec.prompt_tokens)],
                response_token_ids=[rng.randrange(_VOCAB) for _ in range(max(1, r))],
                response_logprobs=[round(-rng.expovariate(2.0), 4) for _ in range(max(1, r))],
                attributes={**common, "gen_ai.system": "bench", "gen_ai.request.model": "bench-policy"},
                **base,
            )
        elif rng.random() < 0.6:
            tool = rng.choice(_TOOLS)
            args = json.dumps({"query": _text(rng, 10, 60)})
            result = _text(rng, 40, 300)
            s = SynthSpan(kind="tool", name=f"tool.{tool}", tool_name=tool, tool_arguments=args, tool_result=result,
                          attributes={**common, "tool.name": tool}, **base)
        else:
            s = SynthSpan(kind="message", name="message.assistant",
                          attributes={**common, "role": "assistant", "content": _text(rng, 40, 400)}, **base)
        spans.append(s)
        t += dur + rng.randint(10_000, 200_000)
    return spans


def iter_rollouts(spec: WorkloadSpec) -> Iterator[list[SynthSpan]]:
    """Yield the workload one rollout (a list of spans in sequence order) at a time."""
    for i in range(spec.rollouts):
        yield _rollout(spec, i)


def generate(spec: WorkloadSpec) -> list[list[SynthSpan]]:
    """The whole workload: ``spec.rollouts`` lists of ``spec.spans_per_rollout`` spans."""
    return list(iter_rollouts(spec))


# --------------------------------------------------------------------------- converters


def to_avro(span: SynthSpan) -> dict[str, Any]:
    """Our ``rolloutbus.Span`` Avro dict (token ids and logprobs packed), ready for ``encode_raw``."""
    from schemas.codec import pack_floats, pack_tokens

    d: dict[str, Any] = {
        "span_id": span.span_id, "trace_id": span.trace_id, "parent_id": span.parent_id,
        "rollout_id": span.rollout_id, "attempt_id": span.attempt_id, "sequence_id": span.sequence_id,
        "name": span.name, "kind": span.kind, "start_time_ns": span.start_time_ns,
        "end_time_ns": span.end_time_ns, "status_code": "OK", "status_message": None,
        "attributes": dict(span.attributes), "events": [], "resource": {"service.name": "bench"},
        "llm": None, "reward": None, "tool": None, "agent_name": "bench-agent",
    }
    if span.kind == "llm":
        d["llm"] = {
            "model": span.model, "prompt_token_ids": pack_tokens(span.prompt_token_ids),
            "response_token_ids": pack_tokens(span.response_token_ids),
            "response_logprobs": pack_floats(span.response_logprobs), "response_mask": b"",
            "resource_version": None, "request_id": None, "finish_reason": "stop",
        }
    elif span.kind == "tool":
        d["tool"] = {"name": span.tool_name or "", "arguments": span.tool_arguments, "result": span.tool_result,
                     "ok": True, "error": None}
    elif span.kind == "reward":
        d["reward"] = {"value": float(span.reward or 0.0), "primary": "reward", "dimensions": {}}
    return d


def to_agentlightning(span: SynthSpan) -> dict[str, Any]:
    """The body Agent Lightning 1.x's store accepts for this span: an ``EventCreate`` JSON dict.

    Agent Lightning 1.x stores *events* per rollout attempt (``POST /api/rollouts/{rollout_id}/attempt/
    {attempt_id}/events`` with ``{"event_type", "data"}``). An LLM span becomes a ``model_request``
    event shaped the way its gateway records one (OpenAI response with vLLM's ``prompt_token_ids`` and
    per-choice ``token_ids``, logprobs as ``logprobs.content[].logprob``), so its own triplet query can
    read the token ids back; a reward becomes a ``reward`` event (``{"value": ...}``); tool calls and
    messages are user-defined event types. Every event also carries the span's identity, name, times
    and the same attributes our Avro span carries, so both sides hold the same information.
    """
    data: dict[str, Any] = {
        "span_id": span.span_id, "trace_id": span.trace_id, "parent_id": span.parent_id,
        "sequence_id": span.sequence_id, "name": span.name,
        "start_time_ns": span.start_time_ns, "end_time_ns": span.end_time_ns,
        "attributes": dict(span.attributes),
    }
    if span.kind == "llm":
        event_type = "model_request"
        data.update({
            "model": span.model,
            "request": {"model": span.model},  # token ids once, in the response, as its gateway keeps them
            "response": {
                "model": span.model,
                "prompt_token_ids": span.prompt_token_ids,
                "choices": [{
                    "index": 0, "finish_reason": "stop", "token_ids": span.response_token_ids,
                    "logprobs": {"content": [{"logprob": lp} for lp in span.response_logprobs]},
                }],
            },
            "status": "ok", "http_status": 200, "finish_reason": "stop",
        })
    elif span.kind == "reward":
        event_type = "reward"
        data["value"] = float(span.reward or 0.0)
    elif span.kind == "tool":
        event_type = "tool_call"
        data.update({"tool": span.tool_name, "arguments": span.tool_arguments, "result": span.tool_result})
    else:
        event_type = "message"
    return {"event_type": event_type, "data": data}


def size_summary(rollouts: list[list[SynthSpan]]) -> dict[str, int]:
    """Counts that must match on every side of a comparison (spans, kinds, tokens, attribute bytes)."""
    out = {"spans": 0, "llm": 0, "tool": 0, "message": 0, "reward": 0,
           "prompt_tokens": 0, "response_tokens": 0, "attribute_bytes": 0}
    for spans in rollouts:
        for s in spans:
            out["spans"] += 1
            out[s.kind] += 1
            out["prompt_tokens"] += len(s.prompt_token_ids)
            out["response_tokens"] += len(s.response_token_ids)
            out["attribute_bytes"] += sum(len(k) + len(v) for k, v in s.attributes.items())
    return out
