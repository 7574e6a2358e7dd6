"""Agent Lightning's rollout queue on rb.tasks, both APIs': the claim bookkeeping of one gateway replica.
Pure (the consumer and its commits are :mod:`producers.ingest.agl.queue`; the records of 0.3's queue calls
:mod:`producers.ingest.agl.v0_3_queue_records`, of 1.x's :mod:`producers.ingest.agl.v1_api`). It imports
neither version: the task metadata keys both write, and the claims read back, are here.

The replicas are one consumer group on rb.tasks, so each task partition has one owner. The owner hands
its partitions' tasks out (a *claim*: one attempt of one rollout, with a deadline), and commits a
partition only up to its lowest task not yet done. Each commit carries, as its metadata, how far the
partition's tasks have been handed out and until when those claims live (:func:`claim_mark`), so a
replica that takes the partition over (a rebalance, a crash) holds the re-delivered, already handed-out
tasks until then instead of handing them out a second time: at most one live claim per task.

A claim ends when its attempt ends (``update_attempt`` on this replica, or the attempt's row in
ClickHouse for an update that reached another one). One that reaches its deadline first, or ends
``failed``/``timeout``, is offered again with the next attempt number, up to ``max_attempts`` attempts.
"""

from __future__ import annotations

import json
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from schemas.models import Task

# Task metadata keys of a rollout enqueued through either API (0.3's store, 1.x's server): its id and its
# config (max_attempts, timeout_seconds, retry_condition), which the claims read back.
ROLLOUT_ID = "agl.rollout_id"
CONFIG = "agl.config"
# Task metadata of a rollout created through 1.x's API (its Rollout's JSON): its controllers run it, not 0.3's
# dequeue (:attr:`Slot.agl1`). Its id and config go under the keys above.
AGL1_ROLLOUT = "agl1.rollout"


def new_attempt_id() -> str:
    """An attempt id as Agent Lightning's store makes them (``at-`` + 8 characters)."""
    return "at-" + uuid.uuid4().hex[:8]


def may_be_minted(attempt_id: str) -> bool:
    """Whether ``attempt_id`` has the shape :func:`new_attempt_id` gives (``at-`` + 8 hex digits): every attempt
    0.3's API hands out (dequeue, start_rollout, start_attempt) has it, so an attempt without it was never one of
    the control records'. ``'at-3f9c01ab'`` → True; ``'at-7-000001-0'`` → False."""
    return len(attempt_id) == 11 and attempt_id.startswith("at-") and all(c in "0123456789abcdef" for c in attempt_id[3:])


def rollout_count(task: Task) -> int:
    """Rollouts a task makes: a train task ``group_size`` (one GRPO group), any other one."""
    return max(1, task.group_size) if task.mode == "train" else 1


def rollout_id_of(task: Task, partition: int, offset: int, index: int) -> str:
    """A rollout's id, the same whichever replica hands it out: an enqueued rollout's own; for a task
    published otherwise, made of its place on rb.tasks."""
    if ROLLOUT_ID in task.metadata and rollout_count(task) == 1:
        return task.metadata[ROLLOUT_ID]
    return f"ro-{task.task_id}-p{partition}o{offset}-{index}"


def claim_mark(claimed_to: int, until: float) -> str:
    """The commit metadata of a partition: tasks up to offset ``claimed_to`` were handed out, and their
    claims live until ``until`` (seconds since the epoch) at the latest."""
    return json.dumps({"claimed_to": claimed_to, "until": round(until, 3)})


def read_mark(metadata: str | None) -> tuple[int, float]:
    """(claimed_to, until) of a commit's metadata; (-1, 0) when there is none."""
    try:
        mark = json.loads(metadata or "")
        return int(mark["claimed_to"]), float(mark["until"])
    except (ValueError, TypeError, KeyError):
        return -1, 0.0


RETRIED = ("failed", "timeout")  # the ends offered again when a rollout's config names no retry_condition


@dataclass(frozen=True)
class Limits:
    """How a rollout's claims end: its attempts, each claim's time, the ends that are offered again."""

    max_attempts: int
    timeout_s: float
    retry_on: tuple[str, ...] = RETRIED


def limits_of(task: Task, default: Limits) -> Limits:
    """The rollout's own config (``max_attempts``, ``timeout_seconds``, ``retry_condition``, as enqueued), each
    field the gateway's ``default`` where the task has none (a task of ``rolloutbus tasks publish``) or a bad one."""
    try:
        config = json.loads(task.metadata[CONFIG]) if CONFIG in task.metadata else {}
    except ValueError:
        config = {}
    if not isinstance(config, dict):
        config = {}
    attempts, timeout, retry = config.get("max_attempts"), config.get("timeout_seconds"), config.get("retry_condition")
    good_attempts = isinstance(attempts, int) and not isinstance(attempts, bool) and attempts >= 1
    good_timeout = (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < float("inf"))
    good_retry = isinstance(retry, list) and all(isinstance(r, str) for r in retry)
    return Limits(attempts if good_attempts else default.max_attempts, float(timeout) if good_timeout else default.timeout_s,
                  tuple(retry) if good_retry else default.retry_on)


@dataclass
class Slot:
    """One rollout of a task at (partition, offset)."""

    partition: int
    offset: int
    index: int
    task: Task
    rollout_id: str
    limits: Limits
    attempts: int = 0  # attempts handed out so far (held ones count as one)
    done: bool = False

    @property
    def agl1(self) -> bool:
        """Created through Agent Lightning 1.x's API: its controllers run it (attempt ``"0"``), not 0.3's dequeue."""
        return AGL1_ROLLOUT in self.task.metadata


@dataclass
class Claim:
    slot: Slot
    attempt_id: str
    attempt: int
    worker_id: str | None
    started: float
    deadline: float
    held: bool = False  # handed out by an earlier owner: its attempt id is not known here


@dataclass
class ClaimBook:
    """The tasks of the partitions this replica owns: offered, claimed, done. ``claim_timeout_s`` and
    ``max_attempts`` are the gateway's, for rollouts whose config does not set their own (:func:`limits_of`)."""

    claim_timeout_s: float
    max_attempts: int = 2
    _offers: deque[Slot] = field(default_factory=deque)
    _slots: dict[tuple[int, int], list[Slot]] = field(default_factory=dict)
    _claims: dict[tuple[str, str], Claim] = field(default_factory=dict)  # by (rollout id, attempt id)
    _held: list[Claim] = field(default_factory=list)
    _marks: dict[int, tuple[int, float]] = field(default_factory=dict)  # partition → (claimed_to, until)
    _highest: dict[int, int] = field(default_factory=dict)

    def defaults(self) -> dict[str, Any]:
        """The config an enqueued rollout gets for what its request leaves out (:func:`task_from_request`)."""
        return {"max_attempts": self.max_attempts, "timeout_seconds": self.claim_timeout_s, "retry_condition": list(RETRIED)}

    # ------------------------------------------------------------------ partitions

    def assign(self, partition: int, mark: tuple[int, float]) -> None:
        """A partition became ours; ``mark`` is its last commit's (:func:`read_mark`)."""
        self._marks[partition] = mark

    def revoke(self, partition: int) -> None:
        """A partition is no longer ours: forget its tasks (the next owner gets them re-delivered)."""
        self._offers = deque(s for s in self._offers if s.partition != partition)
        for key in [k for k in self._slots if k[0] == partition]:
            del self._slots[key]
        for aid in [a for a, c in self._claims.items() if c.slot.partition == partition]:
            del self._claims[aid]
        self._held = [c for c in self._held if c.slot.partition != partition]
        self._marks.pop(partition, None)
        self._highest.pop(partition, None)

    def add(self, partition: int, offset: int, task: Task, *, now: float) -> None:
        """A task delivered from an owned partition. One an earlier owner handed out (at or below its
        mark, whose claims may still live) is held until the mark's time, then checked and re-offered."""
        if (partition, offset) in self._slots:
            return
        self._highest[partition] = max(self._highest.get(partition, -1), offset)
        limits = limits_of(task, Limits(self.max_attempts, self.claim_timeout_s))
        slots = [Slot(partition, offset, i, task, rollout_id_of(task, partition, offset, i), limits)
                 for i in range(rollout_count(task))]
        self._slots[(partition, offset)] = slots
        claimed_to, until = self._marks.get(partition, (-1, 0.0))
        for s in slots:
            if offset <= claimed_to:
                # Checked (ClickHouse) before it is offered again, even when its claims are past their time.
                s.attempts = 1
                self._held.append(Claim(s, attempt_id="", attempt=1, worker_id=None, started=now,
                                        deadline=max(until, now), held=True))
            else:
                self._offers.append(s)

    def add_unreadable(self, partition: int, offset: int) -> None:
        """A record that is no task (the runners' group sends it to rb.dlq): done, nothing to offer."""
        self._highest[partition] = max(self._highest.get(partition, -1), offset)
        self._slots.setdefault((partition, offset), [])

    def offered(self) -> int:
        return len(self._offers)

    # ------------------------------------------------------------------ claims

    def take(self, worker_id: str | None, *, now: float, rollout_id: str | None = None, attempt_id: str | None = None,
             agl1: bool = False) -> Claim | None:
        """Hand the next offered rollout to ``worker_id``: a new attempt with a deadline; None: nothing offered.
        Only rollouts of one API are handed out: 0.3's dequeue (``agl1`` False) or 1.x's controllers (True),
        whose claim names the rollout (``rollout_id``) and the attempt id it gives its agent (``attempt_id``)."""
        for slot in list(self._offers):
            if slot.done or (slot.partition, slot.offset) not in self._slots:
                self._offers.remove(slot)
                continue
            if slot.agl1 != agl1 or (rollout_id is not None and slot.rollout_id != rollout_id):
                continue
            self._offers.remove(slot)
            slot.attempts += 1
            claim = Claim(slot, attempt_id or new_attempt_id(), slot.attempts, worker_id, now, now + slot.limits.timeout_s)
            self._claims[(slot.rollout_id, claim.attempt_id)] = claim
            return claim
        return None

    def untake(self, claim: Claim) -> None:
        """A claim that could not be handed out after all (its commit failed): offered again, first."""
        if self._claims.pop((claim.slot.rollout_id, claim.attempt_id), None) is not None and \
                (claim.slot.partition, claim.slot.offset) in self._slots:
            claim.slot.attempts -= 1
            self._offers.appendleft(claim.slot)

    def claims(self) -> list[Claim]:
        """Live claims, held ones included."""
        return [*self._claims.values(), *self._held]

    def end(self, claim: Claim, status: str) -> bool:
        """The claim's attempt ended with ``status``. A ``succeeded`` one finishes its rollout; another (failed,
        timeout) is offered again while its rollout has attempts left and its config retries that end (its
        ``retry_condition``). True when it was offered again."""
        if claim.held:
            if not any(c is claim for c in self._held):
                return False  # ended already
            self._held = [c for c in self._held if c is not claim]
        elif self._claims.pop((claim.slot.rollout_id, claim.attempt_id), None) is not claim:
            return False
        slot = claim.slot
        if (slot.partition, slot.offset) not in self._slots or slot.done:
            return False
        if status != "succeeded" and slot.attempts < slot.limits.max_attempts and status in slot.limits.retry_on:
            self._offers.append(slot)
            return True
        slot.done = True
        return False

    def claim_of(self, attempt_id: str, rollout_id: str | None = None) -> Claim | None:
        """The live claim of an attempt (0.3's attempt ids are unique; 1.x's are all ``"0"``: name the rollout)."""
        if rollout_id is not None:
            return self._claims.get((rollout_id, attempt_id))
        return next((c for c in self._claims.values() if c.attempt_id == attempt_id), None)

    def held_claim_of(self, rollout_id: str) -> Claim | None:
        """A claim an earlier owner handed out, of this rollout (its attempt id is not known here)."""
        return next((c for c in self._held if c.slot.rollout_id == rollout_id), None)

    def offered_slots(self, *, agl1: bool) -> list[Slot]:
        """The rollouts offered now (not claimed, not done), of one API, in the order they are handed out."""
        return [s for s in self._offers if s.agl1 == agl1 and not s.done and (s.partition, s.offset) in self._slots]

    def settle(self, rollout_ids: set[str]) -> None:
        """Offered rollouts that were run (or ended) through another replica: done here, no longer offered."""
        for slot in [s for s in self._offers if s.rollout_id in rollout_ids]:
            self._offers.remove(slot)
            slot.done = True

    def expired(self, now: float) -> list[Claim]:
        return [c for c in self.claims() if c.deadline <= now]

    # ------------------------------------------------------------------ commits

    def committable(self, partition: int) -> int | None:
        """The offset to commit: the lowest task of the partition not yet done (None: nothing read)."""
        if partition not in self._highest:
            return None
        open_offsets = [off for (p, off), slots in self._slots.items() if p == partition and not all(s.done for s in slots)]
        return min(open_offsets) if open_offsets else self._highest[partition] + 1

    def forget_done(self, partition: int, below: int) -> None:
        """Drop the partition's tasks below a committed offset (all done)."""
        for key in [k for k in self._slots if k[0] == partition and k[1] < below]:
            del self._slots[key]

    def mark(self, partition: int) -> tuple[int, float]:
        """(claimed_to, until) to commit with the partition: the highest offset handed out (by us or an
        earlier owner) and the latest deadline of its live claims."""
        claimed_to, until = self._marks.get(partition, (-1, 0.0))
        for c in self.claims():
            if c.slot.partition == partition:
                claimed_to, until = max(claimed_to, c.slot.offset), max(until, c.deadline)
        for (p, off), slots in self._slots.items():
            if p == partition and any(s.attempts for s in slots):
                claimed_to = max(claimed_to, off)
        self._marks[partition] = (claimed_to, until)
        return claimed_to, until

    def partitions(self) -> list[int]:
        return sorted(self._marks)


__all__ = ["ClaimBook", "Claim", "Slot", "Limits", "limits_of", "rollout_count", "rollout_id_of", "claim_mark", "read_mark",
           "RETRIED", "ROLLOUT_ID", "CONFIG", "AGL1_ROLLOUT", "new_attempt_id"]
