"""The group stage: rollout summaries on ``<prefix>rollouts-done`` → GRPO groups on rb.batches.

A faust agent on the done topic (keyed by group id) adds each summary to its group, in a faust table;
a complete (or timed-out) group → advantages → ``GroupBatch`` on rb.batches, plus groups and
transitions rows. The store agents (rb.resources, rb.metrics, rb.dlq: ResourceVersion, TrainStep,
DeadLetter rows) are faust agents too, and ack through this stage's commit point.

Delivery: faust events are acked (so their offsets may be committed) only at a *commit point*
(:class:`streams.checkpoint.Checkpoint`, its steps done here on faust's aiokafka client): after the sink
wrote the rows they produced, the broker took what they sent and the table entries they changed. A crash
replays what was not acked; sink dedup tokens + ReplacingMergeTree make the replay invisible to FINAL
readers, and the group stage merges a rollout once by id.

Table writes use an explicit partition (the partition of the source record, kept in the state), so
they also work from timers; state values are JSON/Avro bytes (raw serializers). A changed entry
reaches its changelog at the commit point — once per key however often it changed, before the acks —
so the changelog never runs ahead of what was flushed by more than the records about to be acked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import BrokerResponseError
from prometheus_client import Counter

from foundation.errors import ClickHouseError, DecodeError, KafkaUnavailable, ValidationError
from schemas import codec
from schemas.models import DeadLetter, GroupBatch, ResourceVersion, TrainStep
from streams.checkpoint import Checkpoint
from streams.grouping import GroupPolicy, ShortGroupWarnings, advantages, build_batch, ready, sibling_groups
from streams.health import StreamHealth
from streams.rollout import RolloutResult
from streams.sink import dead_letter_row, group_row, resource_version_row, rollout_row, train_step_row
from streams.spans_stage import DLQ_OUT, SEP, dead_letter_reason

log = logging.getLogger("rolloutbus.streams")

GROUPS_OUT = Counter("rolloutbus_streams_groups_emitted_total", "GroupBatch records emitted", ["complete"])

SCAN_EVERY_S = 30.0


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _refused_for_good(exc: BaseException, topic: str, consequence: str = "") -> bool:
    """The broker's (or the producer's own) answer that it will never take this record (too large, not authorised):
    logged, and the record is not sent again (it would be refused at every commit point and hold every ack
    back). Anything else (a timeout, a lost connection, a leader moving) is worth sending again."""
    if isinstance(exc, BrokerResponseError) and not exc.retriable:
        log.error("%s refused a record for good (%r): not sent again%s", topic, exc, consequence)
        return True
    return False


@dataclass
class _Point:
    """What one commit point carries: the events to ack, and the table entries changed, with their values then."""

    acks: list[tuple[Any, Any]] = field(default_factory=list)  # (stream, event)
    changes: list[tuple[tuple[int, bytes], tuple[Any, int, bool], bytes | None]] = field(default_factory=list)


class GroupStage:
    """Group state in two faust tables, emission, and the commit point of every faust agent.

    ``flush``/``submit``: the worker's sink writes (:class:`streams.checkpoint.SinkWrites`); ``pipelined``
    False: each commit point writes its rows on the loop before it goes on."""

    def __init__(self, app: Any, *, policy: GroupPolicy, completed_retention_s: float, sink: Any, health: StreamHealth,
                 done_topic: Any, batches_topic: Any, dlq_topic: Any, group_state: Any, group_members: Any,
                 flush: Callable[[], None], submit: Callable[[], int], pipelined: bool = True,
                 on_emit: Callable[[GroupBatch], None] | None = None) -> None:
        self.app = app
        self.policy = policy
        self.completed_retention_s = completed_retention_s
        self.sink = sink
        self.health = health  # what /readyz reports (streams/health.py)
        self.done_topic, self.batches_topic, self.dlq_topic = done_topic, batches_topic, dlq_topic
        self.group_state, self.group_members = group_state, group_members
        self._open_groups: set[str] = set()  # groups not yet emitted (see expire_groups)
        self._incomplete: set[str] = set()  # open groups with a member's summary missing (logged once)
        self._short = ShortGroupWarnings(policy)  # groups past their timeout that can never be emitted (rate-limited)
        self._last_scan = 0
        self._pending: list[tuple[Any, Any]] = []  # (stream, event) to ack at the next commit point
        # Batches and dead letters produced since the last commit point: (topic, key, value, delivery). Sent
        # again while the broker is away; the changelog entries they depend on wait until they are delivered.
        self._out: list[tuple[Any, bytes | None, bytes, Any]] = []
        # table entries changed since the last commit point: (table id, key) → (table, partition, fresh)
        self._dirty: dict[tuple[int, bytes], tuple[Any, int, bool]] = {}
        self.stats = {"dlq": 0, "groups": 0}
        self.on_emit = on_emit  # each emitted batch, after it is queued (the trackers' report)
        # The commit point awaits its own batch without holding the event loop (the span stage reads on).
        self.checkpoint = Checkpoint(self, sink, flush, submit if pipelined else None, wait=True)

    # ------------------------------------------------------------------ table helpers

    def _put(self, table: Any, partition: int, key: str, value: bytes | None) -> None:
        """Change a table entry now; its changelog record goes out at the next commit point (one per
        key, however often it changed since), before the offsets of what changed it are acked."""
        k = key.encode()
        slot = (id(table), k)
        prev = self._dirty.get(slot)
        fresh = prev[2] if prev is not None else k not in table.data  # not on the changelog yet
        if value is None:
            table.data.pop(k, None)
            if fresh:  # created and dropped since the last commit point: the changelog never saw it
                self._dirty.pop(slot, None)
                return
        else:
            table.data[k] = value
        self._dirty[slot] = (table, partition, fresh)

    def _take_changelogs(self) -> list[tuple[tuple[int, bytes], tuple[Any, int, bool], bytes | None]]:
        """The changed entries and their values now (sent once the rows written so far are in ClickHouse)."""
        dirty, self._dirty = self._dirty, {}
        return [(slot, how, how[0].data.get(slot[1])) for slot, how in dirty.items()]

    @staticmethod
    def _get(table: Any, key: str) -> bytes | None:
        return table.data.get(key.encode())

    # ------------------------------------------------------------------ commit point

    async def commit_point(self) -> None:
        """Write the rows buffered so far; wait until the broker has every batch and dead letter produced
        so far; then persist the table entries changed so far and wait for them; then ack what they
        carried. The rows are written on the sink's writer thread while the event loop (the span stage)
        runs on; the entries and acks are the ones taken before it. On a failure nothing is acked and the
        entries go at the next commit point, with their values then."""
        await self.checkpoint.commit()

    def ack_later(self, stream: Any, event: Any) -> None:
        """``event`` is processed: acked at the next commit point that succeeds."""
        self._pending.append((stream, event))

    async def maybe_commit(self) -> None:
        if self.sink.due() or len(self._pending) >= self.sink.batch_size:
            await self.try_commit()

    async def try_commit(self) -> None:
        """The group stage's commit point from its timer and agents: a failure (the broker or ClickHouse away) is
        logged and tried again at the next one, as the span stage does; raised there, it ended the worker."""
        try:
            await self.commit_point()
        except (ClickHouseError, KafkaUnavailable) as exc:
            log.error("group stage commit point failed (retrying; nothing is acked past what was written): %s", exc)
            self.health.problem("groups", "the group stage's commit point is failing (see the worker log)")
        else:
            self.health.clear("groups")  # its own name: the span stage's next commit does not clear it

    # The checkpoint's steps on faust's producer (streams.checkpoint.Committing).

    def take(self, final: bool) -> _Point:
        pending, self._pending = self._pending, []
        return _Point(pending, self._take_changelogs())

    async def deliver(self) -> None:
        # faust's flush stops waiting for its send buffer after 0.1 s without a send
        # (ProducerBuffer.flush_atmost), so each record's own future is awaited: it resolves once
        # the broker has it. First what was produced (a group's batch), then the entries that
        # record it (the group marked emitted): they go to other partitions, maybe other brokers,
        # and an entry landing first, then a crash, would restore the group as emitted with its
        # batch lost. A crash between the two sends the batch again; the trainer drops it by id.
        await self.app.producer.flush()
        await self._deliver()

    async def send_changelog(self, points: list[_Point], by: float | None) -> None:
        changes = [(point, c) for point in points for c in point.changes]
        sent = [table.send_changelog(partition, k, value) for _, ((_, k), (table, partition, _fresh), value) in changes]
        await self.app.producer.flush()
        results = await asyncio.gather(*sent, return_exceptions=True)
        again = [((point, c), r) for (point, c), r in zip(changes, results) if isinstance(r, BaseException)
                 and not _refused_for_good(r, f"the changelog of table {c[1][0].name}")]
        for point in points:  # what is put back if this fails: the entries not delivered
            point.changes = [c for (p, c), _ in again if p is point]
        if again:
            raise KafkaUnavailable(f"{len(again)} changelog entries not delivered ({again[0][1]!r}); "
                                   "sent again at the next commit point")

    async def commit(self, points: list[_Point], final: bool) -> None:
        for point in points:
            for stream, event in point.acks:
                await stream.ack(event)

    def put_back(self, points: list[_Point], sent: bool) -> bool:
        """The events are acked at the next commit point that succeeds; the entries go with it, with their values
        then. An entry sent may be on the changelog, failed or not: dropping the key later needs a tombstone.
        → True: the points are emptied here, and the next commit point takes their content again."""
        for point in reversed(points):
            self._pending[:0] = point.acks
        for point in points:
            for slot, (table, partition, fresh), _ in point.changes:
                self._dirty.setdefault(slot, (table, partition, fresh and not sent))
            point.acks, point.changes = [], []
        return True

    def _produce(self, topic: Any, key: bytes | None, value: bytes) -> None:
        """Queue a record for the broker; the next commit point waits for its delivery (and sends it again)."""
        self._out.append((topic, key, value, topic.send_soon(key=key, value=value)))

    async def _deliver(self) -> None:
        """Wait until the broker has every batch and dead letter produced so far. One it did not take for
        lack of time or a connection is queued again for the next commit point and this one fails: its
        acks and entries wait. One the broker refuses for good (too large for the topic, not authorised)
        would be refused at every commit point and hold every ack back: it is logged and left."""
        out = list(self._out)  # taken off once answered: a commit point cancelled meanwhile loses none
        results = await asyncio.gather(*(fut for *_, fut in out), return_exceptions=True)
        del self._out[:len(out)]  # (only appended to meanwhile)
        again = []
        for (topic, key, value, _), res in zip(out, results):
            if not isinstance(res, BaseException):
                continue
            name = topic.get_topic_name()
            if not _refused_for_good(res, name, "; that group is stored, not trained" if topic is self.batches_topic else ""):
                self._produce(topic, key, value)
                again.append(f"{name}: {res!r}")
        # Only a record sent again holds the commit point back: one refused for good is logged and left, and the
        # entries and acks after it go on (else its group, never marked emitted, would be emitted and refused again).
        if again:
            raise KafkaUnavailable(f"{len(again)} records not delivered ({again[0]}); sent again at the next commit point")

    # ------------------------------------------------------------------ dead letters

    async def dead_letter(self, event: Any, reason: str, detail: str) -> None:
        msg = event.message
        dl = DeadLetter(
            source_topic=msg.topic, partition=msg.partition, offset=msg.offset, key=msg.key,
            value=msg.value if isinstance(msg.value, (bytes, type(None))) else None,
            reason=reason, detail=detail[:4000], stage="streams", time_ns=time.time_ns(),
        )
        self._produce(self.dlq_topic, msg.key, codec.encode(dl))
        DLQ_OUT.labels(msg.topic).inc()
        self.stats["dlq"] += 1
        log.warning("dead letter %s[%s]@%s: %s: %s", msg.topic, msg.partition, msg.offset, reason, detail)

    # ------------------------------------------------------------------ groups

    async def on_rollout_done(self, event: Any) -> None:
        """Add a rollout summary to its group. The group's state holds only who is in it; each
        member's summary is stored once, as it arrived, and read back when the group is emitted."""
        msg = event.message
        try:
            result = RolloutResult.from_bytes(msg.value)
        except (ValueError, TypeError, KeyError) as exc:
            await self.dead_letter(event, "decode.rollout_summary", str(exc))
            return
        gid = msg.key.decode()
        raw = self._get(self.group_state, gid)
        state = json.loads(raw) if raw else {"p": msg.partition, "first": time.time_ns(), "members": {}, "emitted": False}
        if state["emitted"]:
            log.info("rollout %s finished after its group %s was emitted; stored, not trained", result.rollout_id, gid)
            return
        # As grouping.merge: a later attempt replaces an earlier one; a re-delivered or older one is ignored.
        current = state["members"].get(result.rollout_id)
        if current is not None and tuple(current) >= (result.attempt, result.finished_ns):
            return
        state["members"][result.rollout_id] = [result.attempt, result.finished_ns]
        self._put(self.group_members, state["p"], f"{gid}{SEP}{result.rollout_id}", msg.value)
        self._put(self.group_state, state["p"], gid, _dumps(state))
        self._open_groups.add(gid)
        self._maybe_emit(gid, state, time.time_ns(), {result.rollout_id: result})

    def _maybe_emit(self, gid: str, state: dict[str, Any], now: int, loaded: dict[str, RolloutResult] | None = None) -> None:
        """Emit the group if it is ready. Not a coroutine on purpose: deciding, queueing the batch and
        marking the group emitted are one step with no await in it, so the timer (expire_groups) and
        the agent cannot both emit one group."""
        why = ready(len(state["members"]), state["first"], now, self.policy)
        if why is None:
            return
        members = []
        for rid in state["members"]:
            result = (loaded or {}).get(rid)
            if result is None:
                raw = self._get(self.group_members, f"{gid}{SEP}{rid}")
                if raw is None:
                    # Written with the state, to another table: a rebalance that did not recover that
                    # table leaves it out. The group waits (a later recovery brings it) rather than go short.
                    if gid not in self._incomplete:
                        self._incomplete.add(gid)
                        log.error("group %s: the summary of member %s is missing from the group-members table; "
                                  "not emitted until it is there", gid, rid)
                    return
                result = RolloutResult.from_bytes(raw)
            members.append(result)
        self._incomplete.discard(gid)
        batch = build_batch(members, self.policy, now, complete=why == "complete")
        adv = advantages([r.reward for r in sorted(members, key=lambda r: r.rollout_id)],
                         self.policy.scale_by_std, self.policy.eps)
        self.sink.add("groups", group_row(batch, adv))
        for result in members:
            self.sink.add_transitions(result, gid, now, final=True)  # replaces its rows still buffered
            self.sink.add("rollouts", rollout_row(result, gid, now))
        # Delivered before the entry below is sent (commit_point): the marker never lands without the batch.
        self._produce(self.batches_topic, gid.encode(), codec.encode(batch))
        # Only the marker stays: a replay or a straggler finds the group emitted and is not trained twice.
        for rid in state["members"]:
            self._put(self.group_members, state["p"], f"{gid}{SEP}{rid}", None)
        self._put(self.group_state, state["p"], gid, _dumps({"p": state["p"], "first": state["first"], "members": {}, "emitted": True, "at": now}))
        self._open_groups.discard(gid)
        GROUPS_OUT.labels(str(batch.complete).lower()).inc()
        self.stats["groups"] += 1
        if self.on_emit is not None:
            self.on_emit(batch)

    async def expire_groups(self) -> None:
        """Emit groups that reached their timeout; forget emitted markers past their retention; warn (at most once
        per five minutes) about a group past its timeout with too few rollouts ever to be emitted.

        Each tick looks only at the groups still open (an index kept as they change); a full scan of
        the table, which also finds groups its changelog restored, runs every ``SCAN_EVERY_S`` (or half the
        group timeout, if shorter).

        Only groups of the partitions this worker processes now, and not while faust rebalances: its
        table also holds standby copies of other workers' partitions (faust applies them in batches,
        so they lag) and can hold entries of partitions it no longer owns, and a partition being
        recovered holds older states of its groups. Emitting any of those would send a group that
        its owner sends too, possibly short of a member."""
        if self.app.rebalancing:
            return
        now = time.time_ns()
        owned = self._owned_partitions()
        if now - self._last_scan >= min(SCAN_EVERY_S, self.policy.timeout_s / 2) * 1e9:
            self._last_scan = now
            self._open_groups.clear()
            for key, raw in list(self.group_state.data.items()):
                if raw is None:
                    continue
                state = json.loads(raw)
                if state["p"] not in owned:
                    continue
                gid = key.decode() if isinstance(key, bytes) else key
                if not state["emitted"]:
                    self._open_groups.add(gid)
                elif (now - state.get("at", now)) / 1e9 >= self.completed_retention_s:
                    self._put(self.group_state, state["p"], gid, None)
        for gid in list(self._open_groups):
            raw = self._get(self.group_state, gid)
            state = json.loads(raw) if raw else None
            if state is None or state["emitted"] or state["p"] not in owned:
                self._open_groups.discard(gid)
                continue
            self._maybe_emit(gid, state, now)
            if gid in self._open_groups:  # not emitted: say once in a while when it never will be, and why
                line = self._short.note(gid, len(state["members"]), state["first"], now,
                                        split=lambda g=gid: any(self._get(self.group_state, o) for o in sibling_groups(g)))
                if line:
                    log.warning("%s", line)

    def _owned_partitions(self) -> set[int]:
        """Partitions of the done topic (and so of the group tables) assigned to this worker now."""
        topic = self.done_topic.get_topic_name()
        return {tp.partition for tp in self.app.consumer.assignment() if tp.topic == topic}

    # ------------------------------------------------------------------ the store agents

    async def on_store_record(self, event: Any) -> None:
        """A ResourceVersion, TrainStep or DeadLetter record → its table's row."""
        msg = event.message
        source = (msg.topic, msg.partition, msg.offset)
        try:
            record = codec.decode(msg.value)
        except (DecodeError, ValidationError) as exc:
            if msg.topic == self.dlq_topic.get_topic_name():
                log.error("unreadable record on the dead-letter topic at %s@%s: %s", msg.partition, msg.offset, exc)
            else:
                await self.dead_letter(event, dead_letter_reason(exc), str(exc))
            return
        if isinstance(record, ResourceVersion):
            self.sink.add("resource_versions", resource_version_row(record), source)
        elif isinstance(record, TrainStep):
            self.sink.add("train_steps", train_step_row(record), source)
        elif isinstance(record, DeadLetter):
            self.sink.add("dead_letters", dead_letter_row(record, msg.partition, msg.offset), source)
        elif isinstance(record, GroupBatch):  # pragma: no cover - not expected on these topics
            pass
        else:
            await self.dead_letter(event, "unexpected_record", f"{record.schema_name} on {msg.topic}")


__all__ = ["GroupStage", "SCAN_EVERY_S"]
