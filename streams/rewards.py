"""Automatic intermediate rewards from what the spans say happened. Pure.

Rules (each a number added to the turn that caused the signal; 0 turns a rule off). Every automatic rule is off
by default: measured on both demo tasks, none beat the final reward alone (docs/training.md, *Credit assignment,
measured*); ``deploy/rewards/air.toml`` holds the values they defaulted to before (``air.toml`` column):

==================  =======  ========  =======================================================
rule                default  air.toml  fires on
==================  =======  ========  =======================================================
tool_failed           0.0     -0.1     a span with ``tool.ok == false``
tool_succeeded        0.0      0.0     a span with ``tool.ok == true``
tool_recovered        0.0      0.0     a successful call of a tool whose previous call in the
                                       attempt failed (the SQL agent's rewrite that fixes a
                                       failing query), on top of ``tool_succeeded``
exception             0.0     -0.2     ``kind == "exception"``, an ``exception`` event, or an
                                       ERROR status on a span that is neither a tool call nor a
                                       validator
validator_pass        0.0      0.1     a validator span (``kind == "validator"``, or a
validator_fail        0.0     -0.1     ``validator.verdict`` attribute) whose verdict is pass /
                                       fail (attribute, else its status)
explicit_scale        1.0      1.0     ``Span.reward`` (emit_reward mid-run): value × scale; the
                                       agent's own intermediate rewards count by default
intermediate_cap      0.5      0.5     not a rule: the rule signals of one attempt (explicit
                                       rewards excluded) are scaled down together so that their
                                       sum lies within ±cap, keeping the final reward (0..1 in
                                       the demos) dominant; 0: no cap
==================  =======  ========  =======================================================

Per task, the rules are configuration (``rolloutbus process --reward-rules FILE``, ``rolloutbus demo --reward-rules
FILE``): ``deploy/rewards/air.toml`` the former defaults, ``deploy/rewards/calc.toml`` and ``deploy/rewards/sql.toml``
rules for the demo's two tasks, ``deploy/rewards/final-only.toml`` every rule off, the agent's explicit intermediate
rewards included. Measured on the SQL agent, its rules cost learning against the final reward alone; on the
calculator the former defaults changed nothing (docs/training.md, *Credit assignment, measured*).

A signal lands on the latest LLM turn at or before it (by ``sequence_id``); signals before the
first turn have nothing to credit and are returned as unassigned.

The final reward (:func:`find_final_reward`) is the FINISHED event's ``final_reward``; an attempt that
ends without one (no FINISHED, or a FINISHED with none) takes its last reward span, by
``sequence_id``, as Agent Lightning's ``find_final_reward`` does. A reward is counted once: the
reward span that is the final reward (the last one, when it gave the final reward or equals the
reported one) is not also an intermediate reward. The final reward is carried by the last step
(:mod:`streams.credit`), wherever its span stands; every other reward span is an intermediate
reward of the step before it.

Config file (TOML or JSON), all keys optional::

    [rewards]            # the table is optional in TOML; JSON is a flat object
    tool_failed = -0.5
    exception = 0
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from schemas.models import Span
from streams.assembly import Trajectory
from streams.transitions import Step

_PASS = {"pass", "passed", "true", "ok", "1", "yes", "accept", "accepted"}
_FAIL = {"fail", "failed", "false", "error", "0", "no", "reject", "rejected"}


@dataclass(frozen=True)
class RewardRules:
    """Weights of the automatic reward rules (see the module docstring)."""

    tool_failed: float = 0.0
    tool_succeeded: float = 0.0
    tool_recovered: float = 0.0
    exception: float = 0.0
    validator_pass: float = 0.0
    validator_fail: float = 0.0
    explicit_scale: float = 1.0
    intermediate_cap: float = 0.5

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> RewardRules:
        """Build from a dict; unknown keys and non-numbers are a ValueError naming them."""
        data = data.get("rewards", data) if isinstance(data.get("rewards"), dict) else data
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown reward rule(s) {unknown}; known: {sorted(known)}")
        out: dict[str, float] = {}
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"reward rule {key!r} must be a finite number, got {value!r}")
            out[key] = float(value)
        if out.get("intermediate_cap", 0.0) < 0:
            raise ValueError(f"intermediate_cap must be >= 0 (0: no cap), got {out['intermediate_cap']}")
        return cls(**out)

    @classmethod
    def load(cls, path: str | Path) -> RewardRules:
        """Read a ``.toml`` or ``.json`` rules file."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read reward rules file {p}: {exc.strerror}") from exc
        try:
            data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"reward rules file {p} is not valid {p.suffix.lstrip('.') or 'TOML'}: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"reward rules file {p} must hold an object of rule = number")
        return cls.from_mapping(data)


@dataclass(frozen=True)
class Signal:
    """One reward-bearing observation in a trajectory."""

    sequence_id: int
    span_id: str
    rule: str
    value: float


def _verdict(span: Span) -> bool | None:
    raw = span.attributes.get("validator.verdict", span.attributes.get("verdict"))
    if raw is not None:
        v = raw.strip().strip('"').lower()
        if v in _PASS:
            return True
        if v in _FAIL:
            return False
    if span.status_code == "OK":
        return True
    if span.status_code == "ERROR":
        return False
    return None


def _is_validator(span: Span) -> bool:
    return span.kind == "validator" or "validator.verdict" in span.attributes


def span_signals(span: Span, rules: RewardRules) -> list[Signal]:
    """The rule signals one span raises (explicit rewards excluded, see :func:`signals`)."""
    out: list[Signal] = []

    def add(rule: str, value: float) -> None:
        if value:
            out.append(Signal(span.sequence_id, span.span_id, rule, value))

    if span.tool is not None:
        add("tool_succeeded" if span.tool.ok else "tool_failed", rules.tool_succeeded if span.tool.ok else rules.tool_failed)
    elif _is_validator(span):
        verdict = _verdict(span)
        if verdict is not None:
            add("validator_pass" if verdict else "validator_fail", rules.validator_pass if verdict else rules.validator_fail)
    elif span.kind == "exception" or span.status_code == "ERROR" or any(e.name == "exception" for e in span.events):
        add("exception", rules.exception)
    return out


@dataclass(frozen=True)
class FinalReward:
    """An attempt's final reward and the reward span that is it (``None``: no span is)."""

    value: float | None
    span_id: str | None = None
    from_span: bool = False  # the value came from the span, not from the FINISHED event


def find_final_reward(trajectory: Trajectory, reported: float | None = None) -> FinalReward:
    """The final reward of an attempt: ``reported`` (the FINISHED event's) when there is one, else
    the value of its last reward span (Agent Lightning's ``find_final_reward``), else none.

    The last reward span *is* the final reward when it gave the value or when its value equals the
    reported one (the agent's ``emit_reward`` and its return, or a runner that reports what the
    agent emitted): that span is then no intermediate reward, so the reward is not counted twice."""
    last = next((s for s in reversed(trajectory.spans) if s.reward is not None), None)
    if last is None:
        return FinalReward(reported)
    assert last.reward is not None
    if reported is None:
        return FinalReward(last.reward.value, last.span_id, from_span=True)
    if math.isclose(last.reward.value, reported, rel_tol=1e-9, abs_tol=1e-9):
        return FinalReward(reported, last.span_id)
    return FinalReward(reported)


def signals(trajectory: Trajectory, rules: RewardRules, final_reward: float | None = None) -> list[Signal]:
    """Every intermediate reward signal in the trajectory, in order; ``final_reward`` is the one the
    FINISHED event reported. The reward span that is the final reward is left out (see
    :func:`find_final_reward`)."""
    ruled: list[Signal] = []
    explicit: list[Signal] = []
    outcome = find_final_reward(trajectory, final_reward).span_id
    failed: set[str] = set()  # tools whose last call failed
    for span in trajectory.spans:
        ruled.extend(span_signals(span, rules))
        if span.tool is not None:
            if span.tool.ok and span.tool.name in failed and rules.tool_recovered:
                ruled.append(Signal(span.sequence_id, span.span_id, "tool_recovered", rules.tool_recovered))
            (failed.discard if span.tool.ok else failed.add)(span.tool.name)
        if span.reward is not None and span.span_id != outcome and rules.explicit_scale:
            explicit.append(Signal(span.sequence_id, span.span_id, "explicit", span.reward.value * rules.explicit_scale))
    total = math.fsum(s.value for s in ruled)
    if rules.intermediate_cap and abs(total) > rules.intermediate_cap:
        k = rules.intermediate_cap / abs(total)
        ruled = [Signal(s.sequence_id, s.span_id, s.rule, s.value * k) for s in ruled]
    return sorted(ruled + explicit, key=lambda s: s.sequence_id)


def assign(steps: list[Step], sigs: list[Signal]) -> tuple[list[float], list[Signal]]:
    """Per-step intermediate reward sums, and the signals that came before any step (unassigned)."""
    rewards = [0.0] * len(steps)
    unassigned: list[Signal] = []
    seqs = [s.sequence_id for s in steps]
    for sig in sigs:
        # latest step at or before the signal: steps are in sequence order, so scan from the end.
        idx = next((i for i in range(len(seqs) - 1, -1, -1) if seqs[i] <= sig.sequence_id), None)
        if idx is None:
            unassigned.append(sig)
        else:
            rewards[idx] += sig.value
    return rewards, unassigned


def intermediate_rewards(
    trajectory: Trajectory, steps: list[Step], rules: RewardRules, final_reward: float | None = None
) -> list[float]:
    """Convenience: signals → per-step sums (unassigned signals dropped)."""
    return assign(steps, signals(trajectory, rules, final_reward))[0]


__all__ = ["RewardRules", "Signal", "FinalReward", "find_final_reward", "span_signals", "signals", "assign", "intermediate_rewards"]
