"""The in-flight attempts of one rb.spans partition, and the offset that is safe to commit. Pure.

The span stage keeps each attempt's spans in memory until the attempt completes; it does not write
them to a changelog. What makes that durable is the source topic itself. At a commit point (after
the sink flushed) the partition's committed offset is the next offset to read — so consumer lag
means what it always means, and rows below it are written (``sunk_below``) — and the commit's
metadata carries the first offset of the oldest attempt still in flight (``replay_from``). A
restarted worker reads from ``replay_from``: spans below ``sunk_below`` rebuild the attempts it must
still complete without being written again. Completed attempts are remembered (by the offset of
their FINISHED record) in a small changelog written at commit points, so a replay neither completes
an attempt twice nor misses a late span.

A restart after a crash therefore re-reads from the oldest in-flight attempt — bounded by the
inactivity timeout — which is the price of not writing every span twice.

Numbering. A span its producer did not number (``sequence_id`` 0: an OTLP span without one, an Agent
Lightning 1.x event, a proxied call without the agent's header) is numbered here, when it arrives:
one past the highest sequence id of its attempt so far. One attempt's spans are on one partition in
one order, whichever gateway or proxy replica sent them, so the numbers are distinct and follow the
arrival order with any number of replicas and no coordination between them; and a replay, which
re-reads every in-flight attempt from its first record, gives each span the number it had. Spans
numbered by the process that ran the attempt (our SDK, the agent's header to the proxy, Agent
Lightning's ``span_sequence_id``) keep theirs: the FINISHED ``span_count`` counts them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from schemas.codec import unpack_array
from schemas.models import SPANS_UNKNOWN, UNNUMBERED, RolloutEvent, RolloutEventType

Key = tuple[str, str]  # (rollout_id, attempt_id)
NUMBERED_BY = "rolloutbus.sequence_by"  # attribute of a span numbered here: "stream"


def span_view(d: dict[str, Any]) -> Any:
    """A decoded (and checked) Span dict → an object with the attribute shape of ``schemas.models.Span``.

    What the pure core and the row builders read, without pydantic's per-field validation (the
    dict was checked by :func:`schemas.checks.check_span`)."""
    v = SimpleNamespace(**d)
    llm = d["llm"]
    if llm is not None:
        v.llm = SimpleNamespace(
            model=llm["model"],
            # arrays, not lists: a 1,000-token prompt stays one buffer on its way to the sink
            prompt_token_ids=unpack_array("I", llm["prompt_token_ids"]),
            response_token_ids=unpack_array("I", llm["response_token_ids"]),
            response_logprobs=unpack_array("f", llm["response_logprobs"]),
            response_mask=list(llm["response_mask"]),  # a list of 0/1 either way (the decoders give bytes or a list)
            resource_version=llm["resource_version"],
            request_id=llm["request_id"],
            finish_reason=llm["finish_reason"],
        )
    if d["tool"] is not None:
        v.tool = SimpleNamespace(**d["tool"])
    if d["reward"] is not None:
        v.reward = SimpleNamespace(**d["reward"])
    if d["events"]:
        v.events = [SimpleNamespace(**e) for e in d["events"]]
    return v


def number(span: Any, sequence_id: int) -> None:
    """Give an unnumbered span its sequence id (in place), marking it as numbered by the stream."""
    span.sequence_id = sequence_id
    span.attributes = {**span.attributes, NUMBERED_BY: "stream"}


@dataclass
class Attempt:
    """One attempt still being assembled."""

    rollout_id: str
    attempt_id: str
    first_offset: int
    seen: float
    spans: dict[str, Any] = field(default_factory=dict)  # span_id → span (the first one kept)
    seqs: set[int] = field(default_factory=set)
    top: int = 0  # the highest sequence id so far: an unnumbered span gets the next one
    task_id: str = ""
    mode: str = "train"
    attempt: int = 1
    started_ns: int = 0
    resource_version: int | None = None
    finished: RolloutEvent | None = None
    finished_offset: int = -1
    finished_at: float = 0.0

    @property
    def key(self) -> Key:
        return (self.rollout_id, self.attempt_id)

    def all_in(self) -> bool:
        """FINISHED arrived and every sequence id up to its span_count is in (never when its sender
        could not know the spans: then the finish grace decides)."""
        if self.finished is None or self.finished.metadata.get(SPANS_UNKNOWN):
            return False
        return all(q in self.seqs for q in range(1, self.finished.span_count + 1))


class PartitionState:
    """Attempts of one partition: in flight, completed since the last commit point, and done."""

    def __init__(self, partition: int, sunk_below: int = 0) -> None:
        self.partition = partition
        self.sunk_below = sunk_below
        self.inflight: dict[Key, Attempt] = {}
        self.completing: dict[Key, int] = {}  # completed, rows not yet flushed → FINISHED offset
        self.done: dict[Key, tuple[int, int]] = {}  # → (FINISHED offset, completed ns), oldest first
        # (when its FINISHED was read, key) of attempts whose FINISHED found spans missing, in the order
        # read: the grace period is one length, so the head is always the next one due
        self.waiting: deque[tuple[float, Key]] = deque()
        self.position = -1  # next offset to process; -1: nothing processed yet
        self.committed: tuple[int, int] = (-1, -1)  # (position, replay_from) of the last commit

    def finished_offset(self, key: Key) -> int | None:
        off = self.completing.get(key)
        if off is not None:
            return off
        done = self.done.get(key)
        return done[0] if done is not None else None

    def _attempt(self, key: Key, offset: int, now: float) -> Attempt:
        att = self.inflight.get(key)
        if att is None:
            att = self.inflight[key] = Attempt(key[0], key[1], offset, now)
        return att

    def on_span(self, span: Any, offset: int, now: float) -> tuple[bool, bool, Attempt | None]:
        """→ (write its row, is it late, the attempt it made whole or None).

        An unnumbered span is numbered, in place (see the module docstring); one of a completed
        attempt stays 0. A span of a completed attempt after its FINISHED record is late (stored,
        flagged); one before it is a replay of a span already stored. Spans below ``sunk_below``
        were written before a restart: they rebuild state only."""
        self.position = offset + 1
        key = (span.rollout_id, span.attempt_id)
        fin = self.finished_offset(key)
        if fin is not None:
            late = offset > fin
            return late and offset >= self.sunk_below, late, None
        att = self._attempt(key, offset, now)
        kept = att.spans.get(span.span_id)
        if kept is None:
            if span.sequence_id == UNNUMBERED:
                number(span, att.top + 1)
            att.spans[span.span_id] = span
            att.seqs.add(span.sequence_id)
            att.top = max(att.top, span.sequence_id)
        elif span.sequence_id == UNNUMBERED:
            number(span, kept.sequence_id)  # a second copy: its row replaces the first's, with the same number
        att.seen = now
        return offset >= self.sunk_below, False, att if att.finished is not None and att.all_in() else None

    def on_event(self, ev: RolloutEvent, offset: int, now: float) -> Attempt | None:
        """Record a lifecycle event; → the attempt when a FINISHED found every span in."""
        self.position = offset + 1
        key = (ev.rollout_id, ev.attempt_id)
        if self.finished_offset(key) is not None:
            return None  # a replay of a completed attempt
        att = self._attempt(key, offset, now)
        if ev.event == RolloutEventType.FINISHED and not ev.task_id and att.task_id:
            # A FINISHED from a sender that knows only the ids (an attempt ended through Agent
            # Lightning's store API): the task, mode, attempt number and version are the STARTED's.
            ev = ev.model_copy(update={"task_id": att.task_id, "mode": att.mode, "attempt": att.attempt,
                                       "resource_version": ev.resource_version if ev.resource_version is not None
                                       else att.resource_version})
        att.task_id, att.mode, att.attempt, att.resource_version = ev.task_id, ev.mode, ev.attempt, ev.resource_version
        att.seen = now
        if ev.event == RolloutEventType.STARTED:
            att.started_ns = ev.time_ns
        elif ev.event == RolloutEventType.FINISHED:
            waits = att.finished is not None and att.finished_at == now  # already queued at this time
            att.finished, att.finished_offset, att.finished_at = ev, offset, now
            if att.all_in():
                return att
            if not waits:
                self.waiting.append((now, key))
        return None

    def skip(self, offset: int) -> None:
        """A record that changes no attempt (dead-lettered)."""
        self.position = offset + 1

    def complete(self, att: Attempt, finished_offset: int) -> None:
        """``att`` was completed and its rows buffered: it is done once they are flushed."""
        self.inflight.pop(att.key, None)
        self.completing[att.key] = finished_offset

    def graced(self, now: float, grace_s: float) -> list[Attempt]:
        """Attempts whose FINISHED has waited ``grace_s`` for missing spans, in the order they finished.

        Looks at the head of ``waiting`` only: cheap enough to ask after every poll, so an attempt
        completes when its grace ends rather than at the next tick."""
        graced = []
        waiting = self.waiting
        while waiting and now - waiting[0][0] >= grace_s:
            at, key = waiting.popleft()
            att = self.inflight.get(key)
            # gone: completed since (its last span came); another time: a later FINISHED, queued again
            if att is not None and att.finished_at == at:
                graced.append(att)
        return graced

    def idle(self, now: float, timeout_s: float) -> list[Attempt]:
        """Attempts without a FINISHED that have seen nothing for ``timeout_s``."""
        return [att for att in self.inflight.values() if att.finished is None and now - att.seen >= timeout_s]

    def commit_point(self, now_ns: int, retention_ns: int) -> tuple[list[tuple[Key, int | None]], tuple[int, int] | None]:
        """Call after the sink flushed. Completed attempts become done; done ones older than
        ``retention_ns`` are forgotten. → (changelog entries: key → FINISHED offset, None to
        forget; (offset to commit, replay_from) or None when nothing changed)."""
        entries: list[tuple[Key, int | None]] = []
        for key, off in self.completing.items():
            self.done[key] = (off, now_ns)
            entries.append((key, off))
        self.completing.clear()
        while self.done:
            key = next(iter(self.done))
            if now_ns - self.done[key][1] < retention_ns:
                break
            del self.done[key]
            entries.append((key, None))
        if self.position < 0:
            return entries, None
        commit = (self.position, min((a.first_offset for a in self.inflight.values()), default=self.position))
        if commit == self.committed:
            return entries, None
        self.committed = commit
        self.sunk_below = max(self.sunk_below, self.position)
        return entries, commit

    def restore(self, key: Key, finished_offset: int | None, completed_ns: int = 0) -> None:
        """Apply one changelog entry (replayed at assignment, in log order)."""
        if finished_offset is None:
            self.done.pop(key, None)
        else:
            self.done.pop(key, None)
            self.done[key] = (finished_offset, completed_ns)


__all__ = ["Attempt", "PartitionState", "span_view", "number", "Key", "NUMBERED_BY"]
