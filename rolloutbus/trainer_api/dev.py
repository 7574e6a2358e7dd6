"""``Trainer.dev``: the dry run. Each task runs once, in this process, against the endpoint the ``LLM``
resource names, with tracing on and no broker: the spans go to memory, not Kafka. Per task it prints the
steps (LLM calls with their agent, tool calls), the reward, and what would become transitions under the
Trainer's ``agent_match`` / ``llm_call_match`` (the stream worker's own :func:`streams.transitions.extract_transitions`
on the same spans).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from producers.transport import ROLLOUT_EVENT, SPAN
from rolloutbus.trainer_api.agent import Adapted
from rolloutbus.trainer_api.tracing import recording


class MemoryTransport:
    """Keeps the records a rollout emits (the dry run's stand-in for the span transport)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def emit(self, key: str, name: str, record: dict[str, Any]) -> bool:
        self.records.append((name, record))
        return True

    def spans(self) -> list[Any]:
        """The spans as the stream worker decodes them."""
        from schemas.codec import decode, encode_raw

        return [decode(encode_raw(name, rec)) for name, rec in self.records if name == SPAN]

    def finished(self) -> dict[str, Any] | None:
        return next((rec for name, rec in reversed(self.records) if name == ROLLOUT_EVENT and rec["event"] == "FINISHED"), None)


@dataclass
class DevStep:
    sequence_id: int
    kind: str  # llm | tool | other span kinds
    name: str
    agent: str | None
    text: str  # the completion, the tool's arguments and result
    ok: bool = True
    trained: bool | None = None  # LLM calls: would this call be trained on


@dataclass
class DevResult:
    task_id: str
    status: str
    reward: float | None
    steps: list[DevStep] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def transitions(self) -> list[DevStep]:
        return [s for s in self.steps if s.kind == "llm" and s.trained is not None]


def describe(spans: Sequence[Any], agent_match: str | None, llm_call_match: str | None) -> list[DevStep]:
    """The steps of one attempt, in order, each LLM call marked with whether it would be trained. Pure."""
    from streams.assembly import assemble
    from streams.transitions import extract_transitions

    if not spans:
        return []
    traj = assemble(spans)
    trained = {s.span_id: s.trained for s in extract_transitions(traj, "", agent_match, llm_call_match=llm_call_match)}
    out = []
    for span in traj.spans:
        if span.tool is not None:
            text = f"{span.tool.arguments} -> {span.tool.result if span.tool.ok else span.tool.error}"
            ok = span.tool.ok
        else:
            text = span.attributes.get("gen_ai.completion", "") if span.llm is not None else span.status_message or ""
            ok = span.status_code != "ERROR"
        out.append(DevStep(span.sequence_id, span.kind, span.name, span.agent_name, text, ok, trained.get(span.span_id)))
    return out


def _short(text: str, width: int = 70) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render(result: DevResult, index: int, total: int, agent_match: str | None) -> list[str]:
    """The lines printed for one task. Pure."""
    reward = "none" if result.reward is None else f"{result.reward:g}"
    lines = [f"task {index}/{total} {result.task_id}: {result.status}, reward {reward} ({result.seconds:.1f}s)"]
    if result.error:
        lines.append(f"  error: {_short(result.error, 160)}")
    for s in result.steps:
        if s.kind == "llm":
            fate = "" if s.trained is None else ("  -> transition" if s.trained else "  -> stored, not trained")
            lines.append(f"  {s.sequence_id:>3} llm   {s.agent or '-':<16} {_short(s.text)!r}{fate}")
        elif s.kind == "tool":
            lines.append(f"  {s.sequence_id:>3} tool  {s.name:<16} {'ok ' if s.ok else 'ERR'} {_short(s.text)}")
        elif s.kind not in ("reward",):
            lines.append(f"  {s.sequence_id:>3} {s.kind:<5} {s.name:<16} {_short(s.text)}")
    n_llm = sum(1 for s in result.steps if s.kind == "llm")
    n_tr = sum(1 for s in result.transitions if s.trained)
    lines.append(f"  transitions: {n_tr} of {n_llm} LLM calls" + (f" (agent_match {agent_match!r})" if agent_match else ""))
    return lines


def summary(results: Sequence[DevResult], agent_match: str | None) -> list[str]:
    """The closing lines: mean reward; a warning when ``agent_match`` selected none of the calls made. Pure."""
    rewards = [r.reward or 0.0 for r in results]
    n_llm = sum(1 for r in results for s in r.steps if s.kind == "llm")
    n_tr = sum(1 for r in results for s in r.transitions if s.trained)
    lines = [f"dev: {len(results)} tasks, mean reward {sum(rewards) / max(1, len(rewards)):.3f}, "
             f"{sum(1 for r in results if r.status == 'succeeded')} succeeded, {n_tr} of {n_llm} LLM calls would be trained"]
    if n_llm and not n_tr:
        agents = sorted({s.agent or "(unnamed)" for r in results for s in r.steps if s.kind == "llm"})
        lines.append(f"dev: agent_match {agent_match!r} matches none of the agents that called the LLM ({', '.join(agents)}): "
                     "nothing would be trained")
    elif not n_llm:
        lines.append("dev: no LLM call was seen: point the agent's client at resources['main_llm'].get_base_url(...)")
    return lines


def run_dev(adapted: Adapted, rows: Sequence[Any], agent_match: str | None, llm_call_match: str | None,
            say: Callable[[str], None] = print) -> list[DevResult]:
    """Run each row once; print and return what happened."""
    results = []
    for i, row in enumerate(rows):
        mem = MemoryTransport()
        t0 = time.monotonic()
        task_id = str(row.get("id", f"dev-{i:04d}")) if isinstance(row, dict) else f"dev-{i:04d}"
        with recording():
            res = adapted.run(json.loads(json.dumps(row)), {}, task_id=task_id, mode="train", transport=mem)
        result = DevResult(task_id, res.status, res.reward, describe(mem.spans(), agent_match, llm_call_match),
                           res.error, time.monotonic() - t0)
        for line in render(result, i + 1, len(rows), agent_match):
            say(line)
        results.append(result)
    for line in summary(results, agent_match):
        say(line)
    return results


__all__ = ["DevResult", "DevStep", "MemoryTransport", "describe", "render", "run_dev", "summary"]
