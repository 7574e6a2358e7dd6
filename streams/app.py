"""The faust-streaming worker: a thin shell around the pure core.

Stages, in one process and one event loop:

* ``spans``    — rb.spans (Span + RolloutEvent, keyed by rollout_id), read in batches by
  :class:`streams.spans_stage.SpanStage` (a task of this app): stores spans, assembles attempts in
  memory, completes an attempt on FINISHED (or times it out), writes spans / rollouts / transitions
  rows, and re-keys the result by group id onto ``<prefix>rollouts-done``. At tens of thousands of
  spans a second, faust's per-event machinery would cost more than all the work itself, so this
  stage reads with confluent-kafka and commits its own offsets (see :mod:`streams.attempts`).
* ``groups``   — faust agent on ``<prefix>rollouts-done`` (keyed by group_id): group state in a faust
  table; a complete (or timed-out) group → advantages → ``GroupBatch`` on rb.batches + groups and
  transitions rows.
* ``resources``/``metrics``/``dlq`` — faust agents that store ResourceVersion, TrainStep, DeadLetter
  records.

Delivery: faust events are acked (so their offsets may be committed) only at a *commit point*, after
the sink flushed the rows they produced and the producer flushed what they sent; the span stage
commits the same way. A crash replays what was not committed; sink dedup tokens +
ReplacingMergeTree make the replay invisible to FINAL readers, and the group stage merges a rollout
once by id.

Table writes use an explicit partition (the partition of the source record, kept in the state), so
they also work from timers; state values are JSON/Avro bytes (raw serializers). A changed entry
reaches its changelog at the commit point — once per key however often it changed, before the acks —
so the changelog never runs ahead of what was flushed by more than the records about to be acked.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import faust
from aiokafka.errors import BrokerResponseError
from prometheus_client import Counter, Histogram

from foundation.errors import ClickHouseError, DecodeError, KafkaUnavailable, ValidationError
from schemas import codec
from schemas.models import DeadLetter, GroupBatch, ResourceVersion, TrainStep
from streams.faust_guards import FRONTIER, REPLAY_TOPICS, START, STRICT_TOPICS
from streams.faust_guards import install as install_faust_guards
from streams.grouping import GroupPolicy, advantages, build_batch, ready
from streams.health import StreamHealth
from streams.rollout import RolloutResult, Settings
from streams.sink import (
    ClickHouseSink,
    dead_letter_row,
    group_row,
    resource_version_row,
    rollout_row,
    train_step_row,
)
from streams.spans_stage import DLQ_OUT, LAG, SEP, SpanStage, dead_letter_reason, span_group, state_topic_name

T = TypeVar("T")
log = logging.getLogger("rolloutbus.streams")

GROUPS_OUT = Counter("rolloutbus_streams_groups_emitted_total", "GroupBatch records emitted", ["complete"])
SINK_LATENCY = Histogram("rolloutbus_streams_sink_flush_seconds", "ClickHouse flush latency")
SINK_ROWS = Counter("rolloutbus_streams_sink_rows_total", "Rows written to ClickHouse", ["table"])
SINK_REPLACED = Counter("rolloutbus_streams_sink_rows_replaced_total",
                        "transitions rows replaced by their group's rows before they were written (written once, not twice)")
REREADS = Counter("rolloutbus_streams_rereads_total", "Partitions sought back to their frontier", ["reason"])


@dataclass
class Config:
    """Everything the worker needs, as plain values (built from StreamSettings by the CLI)."""

    app_id: str
    broker: str
    topic_prefix: str
    partitions: int
    core: Settings = field(default_factory=Settings)
    groups: GroupPolicy = field(default_factory=GroupPolicy)
    rollout_timeout_s: float = 600.0
    # Spans of one attempt come from several producers (the agent's process, the LLM proxy), so its
    # FINISHED event can overtake some of them: wait this long for sequence ids up to span_count.
    finish_grace_s: float = 10.0
    completed_retention_s: float = 3600.0
    store: str = "memory://"
    # faust's own files (RocksDB tables, ...): under the data dir, never the working directory.
    datadir: str | None = None
    tick_s: float = 0.5
    # Records past a partition's frontier this long after seeking back to it: ask the broker whether the
    # records at the frontier are still there (read again) or gone by retention (go on).
    gap_accept_s: float = 2.0
    # faust broker_credentials (KafkaSecurity.faust()); None: PLAINTEXT
    credentials: Any = None
    # librdkafka configuration (bootstrap servers, security) for the span stage
    kafka_conf: dict[str, Any] = field(default_factory=dict)
    # SIGTERM: flush and commit within half of this, and exit within all of it whatever happens.
    shutdown_timeout_s: float = 60.0
    # A restarted worker rejoins only when the dead member's session expired: keep it short.
    session_timeout_s: float = 10.0
    # Read on while ClickHouse inserts a batch (the sink's writer thread); False: wait for each insert.
    sink_pipelined: bool = True


# --------------------------------------------------------------------------- faust offset fixes
# streams/faust_guards.py: faust/aiokafka behaviours that lose or stall records, guarded there.


SCAN_EVERY_S = 30.0
HOLD_AT_BATCHES = 4  # sink batches buffered (inserts failing) before the span stage stops fetching


def done_topic_name(prefix: str) -> str:
    return f"{prefix}rollouts-done"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class Worker:
    """Holds the faust app, its topics and tables, the sink, and the commit-point bookkeeping."""

    def __init__(self, cfg: Config, sink: ClickHouseSink, health: StreamHealth | None = None) -> None:
        self.cfg = cfg
        self.sink = sink
        self.health = health or StreamHealth()  # what /readyz reports (streams/health.py)
        p = cfg.topic_prefix
        datadir = cfg.datadir or f"/tmp/rolloutbus-faust/{cfg.app_id}"
        os.makedirs(datadir, exist_ok=True)
        self.app = faust.App(
            cfg.app_id,
            broker=cfg.broker,
            store=cfg.store,
            datadir=datadir,
            topic_partitions=cfg.partitions,
            web_enabled=False,
            consumer_auto_offset_reset="earliest",
            # Events wait un-acked for the next commit point; faust must not block on them when it
            # stops or rebalances (they are simply replayed, and dedup makes that invisible).
            stream_wait_empty=False,
            broker_commit_every=100,
            broker_session_timeout=cfg.session_timeout_s,
            broker_heartbeat_interval=min(3.0, cfg.session_timeout_s / 3),
            broker_commit_interval=cfg.tick_s,
            broker_credentials=cfg.credentials,
            producer_max_request_size=16 * 1024 * 1024,
            consumer_max_fetch_size=16 * 1024 * 1024,
        )
        raw = {"key_serializer": "raw", "value_serializer": "raw"}
        self.done_topic = self.app.topic(done_topic_name(p), partitions=cfg.partitions, **raw)
        STRICT_TOPICS.add(done_topic_name(p))
        install_faust_guards()
        self.batches_topic = self.app.topic(f"{p}batches", **raw)
        self.dlq_topic = self.app.topic(f"{p}dlq", **raw)
        self.resources_topic = self.app.topic(f"{p}resources", **raw)
        self.metrics_topic = self.app.topic(f"{p}metrics", **raw)
        # Each record of these must reach its table: the same guards as the done topic (rb.resources is
        # compacted, so it is read again from its beginning on every assignment instead).
        STRICT_TOPICS.update((f"{p}metrics", f"{p}dlq"))
        REPLAY_TOPICS.add(f"{p}resources")
        tbl = {"partitions": cfg.partitions, "default": None, "key_type": bytes, "value_type": bytes}
        self.group_state = self.app.Table("group-state", **tbl)
        self.group_members = self.app.Table("group-members", **tbl)
        self._open_groups: set[str] = set()  # groups not yet emitted (see expire_groups)
        self._incomplete: set[str] = set()  # open groups with a member's summary missing (logged once)
        self._last_scan = 0
        self.stage: SpanStage | None = None
        self._stopping = False
        self._pending: list[tuple[Any, Any]] = []  # (stream, event) to ack at the next commit point
        self._replaced_seen = 0  # sink.rows_dropped already counted in rolloutbus_streams_sink_rows_replaced_total
        self._written_seen: dict[str, int] = {}  # sink.rows_written already counted in rolloutbus_streams_sink_rows_total
        self._batch_seen = 0  # sink.written at the last look
        # Batches and dead letters produced since the last commit point: (topic, key, value, delivery). Sent
        # again while the broker is away; the changelog entries they depend on wait until they are delivered.
        self._out: list[tuple[Any, bytes | None, bytes, Any]] = []
        self._lock = asyncio.Lock()
        # table entries changed since the last commit point: (table id, key) → (table, partition, fresh)
        self._dirty: dict[tuple[int, bytes], tuple[Any, int, bool]] = {}
        self._seeks: dict[tuple[str, int], tuple[int, float]] = {}  # partition → (frontier sought to, when)
        self._last_in: dict[tuple[str, int], float] = {}
        self.stats = {"dlq": 0, "groups": 0, "rereads": 0, "dropped": 0, "redelivered": 0}
        self._register()

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

    def flush_sink(self) -> None:
        """Write every row not yet written (both stages share the sink). Raises ClickHouseError, keeping them."""
        if self.sink.pending:
            self._sink_call(self.sink.flush)

    def submit_sink(self) -> int:
        """Hand the buffered rows to the sink's writer (after the batch before them is written); → the
        batch's number. Raises the batch before's ClickHouseError, keeping the rows."""
        return self._sink_call(self.sink.submit)

    def _sink_call(self, call: Callable[[], T]) -> T:
        try:
            out = call()
        except ClickHouseError:
            self._sink_metrics()
            self.health.clickhouse(False)
            raise
        self._sink_metrics()
        return out

    def _sink_metrics(self) -> None:
        """What the sink wrote since the last look (on the writer thread too), as metrics."""
        written = dict(self.sink.rows_written)
        for table, n in written.items():
            if n > self._written_seen.get(table, 0):
                SINK_ROWS.labels(table).inc(n - self._written_seen.get(table, 0))
        self._written_seen = written
        if self.sink.written != self._batch_seen:  # a whole batch went in: ClickHouse takes rows
            self._batch_seen = self.sink.written
            self.health.clickhouse(True)
            SINK_LATENCY.observe(self.sink.last_flush_s)
        SINK_REPLACED.inc(self.sink.rows_dropped - self._replaced_seen)
        self._replaced_seen = self.sink.rows_dropped

    async def commit_point(self) -> None:
        """Write the rows buffered so far; wait until the broker has every batch and dead letter produced
        so far; then persist the table entries changed so far and wait for them; then ack what they
        carried. The rows are written on the sink's writer thread while the event loop (the span stage)
        runs on; the entries and acks are the ones taken before it. On a failure nothing is acked and the
        entries go at the next commit point, with their values then."""
        async with self._lock:
            pending, self._pending = self._pending, []
            changes = self._take_changelogs()
            sending = False
            try:
                if self.cfg.sink_pipelined:
                    await self._write_sink()
                else:
                    self.flush_sink()
                # faust's flush stops waiting for its send buffer after 0.1 s without a send
                # (ProducerBuffer.flush_atmost), so each record's own future is awaited: it resolves once
                # the broker has it. First what was produced (a group's batch), then the entries that
                # record it (the group marked emitted): they go to other partitions, maybe other brokers,
                # and an entry landing first, then a crash, would restore the group as emitted with its
                # batch lost. A crash between the two sends the batch again; the trainer drops it by id.
                await self.app.producer.flush()
                await self._deliver()
                sending = True
                sent = [table.send_changelog(partition, k, value) for (_, k), (table, partition, _fresh), value in changes]
                await self.app.producer.flush()
                results = await asyncio.gather(*sent, return_exceptions=True)
                again = [(c, r) for c, r in zip(changes, results) if isinstance(r, BaseException)
                         and not _refused_for_good(r, f"the changelog of table {c[1][0].name}")]
                changes = [c for c, _ in again]
                if again:
                    raise KafkaUnavailable(f"{len(again)} changelog entries not delivered ({again[0][1]!r}); "
                                           "sent again at the next commit point")
            except BaseException:
                self._pending[:0] = pending  # acked at the next commit point that succeeds
                for slot, (table, partition, fresh), _ in changes:
                    # An entry sent may be on the changelog, failed or not: dropping the key later needs a tombstone.
                    self._dirty.setdefault(slot, (table, partition, fresh and not sending))
                raise
            for stream, event in pending:
                await stream.ack(event)

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

    async def _write_sink(self) -> None:
        """Wait, without holding the event loop, until every row buffered now is written (handing them to
        the sink's writer when no batch is being written). Raises ClickHouseError (the rows kept)."""
        if not self.sink.pending:
            return
        # The rows buffered now go with the next batch, whoever hands it off (the span stage too).
        target = self.sink.submitted + (1 if self.sink.buffered else 0)
        while self.sink.written < target:
            fut = self.sink.inflight
            if fut is not None and not fut.done():
                waiting = asyncio.wrap_future(fut)
                await asyncio.wait([waiting])
                if not waiting.cancelled():
                    waiting.exception()  # seen here; raised below by whoever collects the batch
                continue
            self.submit_sink()  # collects the batch before (raising its failure), hands off the rest

    async def _maybe_commit(self) -> None:
        if self.sink.due() or len(self._pending) >= self.sink.batch_size:
            await self._try_commit()

    async def _try_commit(self) -> None:
        """The group stage's commit point from its timer and agents: a failure (the broker or ClickHouse away) is
        logged and tried again at the next one, as the span stage does; raised there, it ended the worker."""
        try:
            await self.commit_point()
        except (ClickHouseError, KafkaUnavailable) as exc:
            log.error("group stage commit point failed (retrying; nothing is acked past what was written): %s", exc)
            self.health.problem("groups", "the group stage's commit point is failing (see the worker log)")
        else:
            self.health.clear("groups")  # its own name: the span stage's next commit does not clear it

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


    # ------------------------------------------------------------------ spans stage

    def make_stage(self) -> SpanStage:
        p = self.cfg.topic_prefix
        return SpanStage(
            self.cfg.kafka_conf, group=span_group(self.cfg.app_id), spans_topic=f"{p}spans", done_topic=done_topic_name(p),
            dlq_topic=f"{p}dlq", state_topic=state_topic_name(self.cfg.app_id), sink=self.sink, flush_sink=self.flush_sink,
            submit_sink=self.submit_sink if self.cfg.sink_pipelined else None,
            core=self.cfg.core, finish_grace_s=self.cfg.finish_grace_s, rollout_timeout_s=self.cfg.rollout_timeout_s,
            completed_retention_s=self.cfg.completed_retention_s, session_timeout_s=self.cfg.session_timeout_s,
        )

    async def run_stage(self) -> None:
        """The span stage's loop: poll a batch, complete what is due, commit when the sink is due."""
        stage = self.stage = self.make_stage()
        self.health.start()
        # Everything built so far (faust, the clients, the schemas) lives as long as the process:
        # keep the collector from walking it again on every full collection, and collect young
        # objects less often (the span stage allocates a few per span). Measured: ~3% of the CPU.
        # The middle generation holds the attempts in flight (their span views): walking it every 20
        # young collections cost as much as all the young ones (100k spans: 3 × 55-66 ms beside 81 ×
        # 2 ms, measured with gc.callbacks). Completed attempts are freed by reference counting, not by
        # the collector: walk it every 200 young collections.
        gc.collect()
        gc.freeze()
        gc.set_threshold(10_000, 200, 20)
        last_tick = last_commit = time.monotonic()
        try:
            while not self._stopping:
                # ClickHouse not taking rows: stop fetching (polling goes on, so the group keeps us)
                # rather than buffer without bound; what is not committed stays in Kafka.
                stage.hold(self.sink.pending >= HOLD_AT_BATCHES * self.sink.batch_size)
                n = stage.poll()
                self.health.polled(n)
                now = time.monotonic()
                if now - last_tick >= self.cfg.tick_s:
                    stage.tick()
                    last_tick = now
                else:
                    stage.finish_graced()  # when its grace ends, not at the next tick (up to tick_s later)
                if self.sink.due() or now - last_commit >= self.cfg.tick_s:
                    try:
                        stage.commit_point()
                        self.health.commit_ok()
                    except (ClickHouseError, KafkaUnavailable) as exc:
                        self.health.commit_failed(exc)
                        log.error("span stage commit point failed (retrying; nothing is committed past what was written): %s", exc)
                    last_commit = now
                self._watch(stage, now)
                await asyncio.sleep(0 if n else 0.005)
        finally:
            if not self._stopping:  # cancelled without a SIGTERM flush: the next owner replays
                stage.close()

    def _watch(self, stage: SpanStage, now: float) -> None:
        """Readiness: the stage's assignment and backlog; with no rows to write, whether ClickHouse answers."""
        self.health.watch(stage.consumer, stage.spans_topic, now)
        if not self.sink.busy and self.health.ping_due(now):  # a batch being written is a contact
            self.health.clickhouse(bool(self.sink.client.ping(timeout=2)), "not answering a ping")

    def stop_stage(self) -> None:
        """Final commit point of the span stage, then leave its consumer group."""
        self._stopping = True
        if self.stage is not None:
            try:
                self.stage.commit_point(final=True)
            finally:
                self.stage.close()

    # ------------------------------------------------------------------ groups stage

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
        why = ready(len(state["members"]), state["first"], now, self.cfg.groups)
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
        batch = build_batch(members, self.cfg.groups, now, complete=why == "complete")
        adv = advantages([r.reward for r in sorted(members, key=lambda r: r.rollout_id)],
                         self.cfg.groups.scale_by_std, self.cfg.groups.eps)
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

    async def expire_groups(self) -> None:
        """Emit groups that reached their timeout; forget emitted markers past their retention.

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
        if now - self._last_scan >= min(SCAN_EVERY_S, self.cfg.groups.timeout_s / 2) * 1e9:
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
                elif (now - state.get("at", now)) / 1e9 >= self.cfg.completed_retention_s:
                    self._put(self.group_state, state["p"], gid, None)
        for gid in list(self._open_groups):
            raw = self._get(self.group_state, gid)
            state = json.loads(raw) if raw else None
            if state is None or state["emitted"] or state["p"] not in owned:
                self._open_groups.discard(gid)
                continue
            self._maybe_emit(gid, state, now)

    def table_changelogs(self) -> list[str]:
        """The changelog topics of the group tables, as faust names them."""
        return [t.changelog_topic.get_topic_name() for t in (self.group_state, self.group_members)]

    def _owned_partitions(self) -> set[int]:
        """Partitions of the done topic (and so of the group tables) assigned to this worker now."""
        topic = self.done_topic.get_topic_name()
        return {tp.partition for tp in self.app.consumer.assignment() if tp.topic == topic}

    # ------------------------------------------------------------------ other topics

    async def on_store_record(self, event: Any) -> None:
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

    # ------------------------------------------------------------------ wiring

    def _register(self) -> None:
        app = self.app

        def make_agent(topic: Any, handler: Any, name: str) -> None:
            async def agent(stream: Any) -> None:
                manual = stream.noack()
                async for event in manual.events():
                    if event.message.topic in STRICT_TOPICS:
                        verdict = await self._admit(event.message)
                        if verdict == "drop":
                            continue
                        if verdict == "duplicate":  # processed earlier in this assignment: only ack it
                            self._pending.append((manual, event))
                            continue
                    try:
                        await handler(event)
                    except Exception:  # noqa: BLE001 - one bad record must not stop the stream
                        log.exception("processing %s[%s]@%s failed", event.message.topic, event.message.partition, event.message.offset)
                        await self.dead_letter(event, "processing_error", "see worker log")
                    self._pending.append((manual, event))
                    self._lag(event)
                    await self._maybe_commit()

            agent.__name__ = agent.__qualname__ = name
            app.agent(topic, name=f"{self.cfg.app_id}.{name}")(agent)

        make_agent(self.done_topic, self.on_rollout_done, "groups")
        make_agent(self.resources_topic, self.on_store_record, "resources")
        make_agent(self.metrics_topic, self.on_store_record, "metrics")
        make_agent(self.dlq_topic, self.on_store_record, "dlq")

        @app.task
        async def spans() -> None:
            await self.run_stage()

        @app.timer(self.cfg.tick_s)
        async def tick() -> None:
            await self.expire_groups()
            await self._try_commit()
            await self.reread_missing_tails()

        @app.on_partitions_revoked.connect
        async def on_revoked(app: Any, revoked: Any, **_: Any) -> None:
            await self._try_commit()  # what it could not ack, the next owner reads again
            for tp in revoked:
                for d in (START, FRONTIER, self._seeks, self._last_in):
                    d.pop((tp.topic, tp.partition), None)

    async def _admit(self, msg: Any) -> str:
        """``process``, ``duplicate`` (below the frontier) or ``drop`` (past it: seek back to it).

        Offsets of rb.spans and the done topic are contiguous (no compaction, no transactions); records
        arriving past the frontier mean faust skipped some. We seek back and drop what arrives past the
        frontier for ``gap_accept_s`` (stale buffered records). Past that, the broker decides: records
        it still has at the frontier are read again (a busy worker can take longer than that to drain
        what faust buffered before the seek); only a range that retention deleted is passed over."""
        key = (msg.topic, msg.partition)
        now = time.monotonic()
        self._last_in[key] = now
        expected = FRONTIER.get(key)
        offset = msg.offset
        if expected is None:  # before this assignment's start is known; faust re-delivers after its seek
            return "process"
        if offset == expected:
            FRONTIER[key] = offset + 1
            return "process"
        if offset < expected:
            self.stats["redelivered"] += 1
            return "duplicate"
        seek = self._seeks.get(key)
        if seek is None or seek[0] != expected:
            log.warning("%s[%d]: offsets %d..%d were not delivered; reading again from %d",
                        msg.topic, msg.partition, expected, offset - 1, expected)
            self._seeks[key] = (expected, now)
            await self._seek(msg.tp, expected, "gap")
            return "drop"
        if now - seek[1] < self.cfg.gap_accept_s:
            self.stats["dropped"] += 1
            return "drop"
        earliest = (await self.app.consumer.earliest_offsets(msg.tp)).get(msg.tp)
        if earliest is not None and earliest > expected:
            log.warning("%s[%d]: offsets %d..%d are no longer on the broker (retention); going on from %d",
                        msg.topic, msg.partition, expected, earliest - 1, earliest)
            FRONTIER[key] = earliest
            return await self._admit(msg)
        log.warning("%s[%d]: offsets from %d still not delivered; reading again from %d", msg.topic, msg.partition,
                    expected, expected)
        self._seeks[key] = (expected, now)
        await self._seek(msg.tp, expected, "gap")
        self.stats["dropped"] += 1
        return "drop"

    async def reread_missing_tails(self) -> None:
        """Seek back a partition whose records past the frontier never arrived (nothing later came to
        show the gap): quiet for a while with the high watermark above the frontier."""
        now = time.monotonic()
        for tp in list(self.app.consumer.assignment()):
            key = (tp.topic, tp.partition)
            expected = FRONTIER.get(key)
            if expected is None:
                continue
            try:
                hw = self.app.consumer.highwater(tp)
            except Exception:  # noqa: BLE001 - not known yet
                continue
            quiet = now - max(self._last_in.get(key, 0.0), self._seeks.get(key, (0, 0.0))[1])
            if hw is not None and hw > expected and quiet >= self.cfg.gap_accept_s * 5:
                log.info("%s[%d]: high watermark %d but nothing past %d arrived; reading again from %d",
                         tp.topic, tp.partition, hw, expected - 1, expected)
                self._seeks[key] = (expected, now)
                await self._seek(tp, expected, "tail")

    async def _seek(self, tp: Any, offset: int, reason: str) -> None:
        self.stats["rereads"] += 1
        REREADS.labels(reason).inc()
        # In the consumer's own thread (faust's seek() touches aiokafka's fetcher from this one, which
        # races with a fetch in flight and crashes the fetcher).
        await self.app.consumer.seek_wait({tp: offset})

    def _lag(self, event: Any) -> None:
        tp = event.message.tp
        try:
            hw = self.app.consumer.highwater(tp)
        except Exception:  # noqa: BLE001 - lag is best effort
            return
        if hw is not None:
            LAG.labels(tp.topic, str(tp.partition)).set(max(hw - event.message.offset - 1, 0))


def _refused_for_good(exc: BaseException, topic: str, consequence: str = "") -> bool:
    """The broker's (or the producer's own) answer that it will never take this record (too large, not authorised):
    logged, and the record is not sent again (it would be refused at every commit point and hold every ack
    back). Anything else (a timeout, a lost connection, a leader moving) is worth sending again."""
    if isinstance(exc, BrokerResponseError) and not exc.retriable:
        log.error("%s refused a record for good (%r): not sent again%s", topic, exc, consequence)
        return True
    return False


class HardStop:
    """Ends the process ``timeout_s`` after a stop signal, whatever the event loop is doing: a stop must
    end, and with the broker gone faust's own shutdown (or the span stage's wait for the broker) can
    take far longer. ``on_signal`` (a signal handler) and ``arm`` only note the time; a thread started
    here does the rest, so nothing in the handler takes a lock the interrupted code may hold."""

    def __init__(self, timeout_s: float, exit_: Any = os._exit) -> None:
        self.timeout_s = timeout_s
        self.armed_at: float | None = None
        self._exit = exit_
        threading.Thread(target=self._watch, name="rolloutbus-hard-stop", daemon=True).start()

    def on_signal(self, signum: int, frame: Any) -> None:
        self.arm()

    def arm(self) -> None:
        if self.armed_at is None:
            self.armed_at = time.monotonic()

    def _watch(self) -> None:
        while self.armed_at is None:
            time.sleep(0.2)
        time.sleep(max(0.0, self.armed_at + self.timeout_s - time.monotonic()))
        log.error("still stopping %.0fs after the signal (Kafka clients wedged?): exiting now; nothing "
                  "past the last commit is lost, the next worker replays it", self.timeout_s)
        logging.shutdown()
        self._exit(1)


def faust_worker(worker: Worker, loglevel: str = "warning") -> Any:
    """A faust.Worker whose SIGTERM/SIGINT first flushes the sink and commits, then stops."""

    class _Worker(faust.Worker):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # faust's terminal spinner sets the root logger to DEBUG so that it can spin on every record:
            # every debug line of aiokafka and faust (several per record produced) would be built.
            self.spinner = None
            self._rb_hard_stop = HardStop(worker.cfg.shutdown_timeout_s)

        def _schedule_shutdown(self, signal: Any) -> None:
            if getattr(self, "_rb_flushing", False):
                return

            async def flush_then_stop() -> None:
                try:
                    await asyncio.wait_for(flush(), worker.cfg.shutdown_timeout_s / 2)
                    log.warning("flushed and committed before shutdown: %s", {**(worker.stage.stats if worker.stage else {}), **worker.stats})
                except Exception:  # noqa: BLE001 - stopping anyway; un-committed records are replayed
                    log.exception("flush on shutdown failed or timed out (broker gone?); records not committed "
                                  "will be replayed by the next worker")
                finally:
                    faust.Worker._schedule_shutdown(self, signal)

            async def flush() -> None:
                worker.stop_stage()
                await worker.commit_point()
                await worker.app.commit(None)

            self._rb_hard_stop.arm()  # armed at the signal already, unless it came some other way
            self._rb_flushing = True
            asyncio.ensure_future(flush_then_stop())

        def install_signal_handlers(self) -> None:
            super().install_signal_handlers()
            # faust's stop runs on the event loop, and the span stage can hold the loop for seconds in a
            # librdkafka wait (the broker gone, records undelivered). The hard stop is armed in the signal's
            # own Python handler instead, which librdkafka's flush and poll let run between the slices of
            # their wait; the signal still reaches asyncio (through its wakeup fd) and faust's stop.
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._rb_hard_stop.on_signal)

    return _Worker(worker.app, loglevel=loglevel, quiet=True)


__all__ = ["Config", "HardStop", "Worker", "done_topic_name", "faust_worker"]
