"""The faust-streaming worker: the wiring of the stages it hosts, in one process and one event loop.

* ``spans``    — rb.spans (Span + RolloutEvent, keyed by rollout_id), read in batches by
  :class:`streams.spans_stage.SpanStage` (a task of this app): stores spans, assembles attempts in
  memory, completes an attempt on FINISHED (or times it out), writes spans / rollouts / transitions
  rows, and re-keys the result by group id onto ``<prefix>rollouts-done``. At tens of thousands of
  spans a second, faust's per-event machinery would cost more than all the work itself, so this
  stage reads with confluent-kafka and commits its own offsets (see :mod:`streams.attempts`).
* ``groups``   — faust agent on ``<prefix>rollouts-done`` (keyed by group_id): :class:`streams.groups_stage.GroupStage`,
  group state in faust tables; a complete (or timed-out) group → advantages → ``GroupBatch`` on
  rb.batches + groups and transitions rows.
* ``feedback`` — faust agent on ``<prefix>feedback`` (keyed by rollout_id): :class:`streams.feedback_stage.FeedbackStage`,
  late rewards → the rollout's stored final reward, a one-rollout batch for a task-less rollout, or a dead letter
  (the span stage sends a reward span that came after its attempt completed there too).
* ``resources``/``metrics``/``dlq`` — faust agents that store ResourceVersion, TrainStep, DeadLetter
  records (through the group stage's commit point).

Delivery: both stages commit at a *commit point* (:mod:`streams.checkpoint`): rows written, then what
they produced delivered, then the changelog, then the offsets (the span stage's) or the acks (faust's
events). A crash replays what was not committed; sink dedup tokens + ReplacingMergeTree make the replay
invisible to FINAL readers, and the group stage merges a rollout once by id. Records of the faust agents'
topics are admitted in offset order (:mod:`streams.frontier`, with the guards of :mod:`streams.faust_guards`).
"""

from __future__ import annotations

import asyncio
import gc
import os
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import faust

from foundation.errors import ClickHouseError, KafkaUnavailable
from schemas.models import GroupBatch
from streams.checkpoint import SinkWrites
from streams.faust_guards import REPLAY_TOPICS, STRICT_TOPICS
from streams.faust_guards import install as install_faust_guards
from streams.feedback_stage import FeedbackStage, feedback_topic_name
from streams.frontier import Frontier
from streams.grouping import GroupPolicy
from streams.groups_stage import GroupStage
from streams.health import StreamHealth
from streams.rollout import Settings
from streams.sink import ClickHouseSink
from streams.spans_stage import LAG, SpanStage, span_group, state_topic_name

log = logging.getLogger("rolloutbus.streams")


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
    # Late feedback (streams/feedback_stage.py): applied when given at most this long after its rollout finished.
    feedback_window_s: float = 3600.0
    feedback_baseline: str = "loo"
    feedback_baseline_window: int = 64


HOLD_AT_BATCHES = 4  # sink batches buffered (inserts failing) before the span stage stops fetching


def done_topic_name(prefix: str) -> str:
    return f"{prefix}rollouts-done"


class Worker:
    """Holds the faust app, its topics and tables, the sink, and the stages: the span stage (a faust task),
    the group stage and the store agents (faust agents, admitted by the frontier)."""

    def __init__(self, cfg: Config, sink: ClickHouseSink, health: StreamHealth | None = None,
                 on_group: Callable[[GroupBatch], None] | None = None) -> None:
        """``on_group``: called with each batch sent to rb.batches (``--report-to``'s report): the group stage's groups
        and the feedback stage's one-rollout batches of task-less rollouts that late feedback trains."""
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
        self.feedback_topic = self.app.topic(feedback_topic_name(p), partitions=cfg.partitions, **raw)
        STRICT_TOPICS.update((f"{p}metrics", f"{p}dlq", feedback_topic_name(p)))
        REPLAY_TOPICS.add(f"{p}resources")
        tbl = {"partitions": cfg.partitions, "default": None, "key_type": bytes, "value_type": bytes}
        self.group_state = self.app.Table("group-state", **tbl)
        self.group_members = self.app.Table("group-members", **tbl)
        self.writes = SinkWrites(sink, self.health)  # both stages' rows: metrics and ClickHouse's health
        self.groups = GroupStage(
            self.app, policy=cfg.groups, completed_retention_s=cfg.completed_retention_s, sink=sink, health=self.health,
            done_topic=self.done_topic, batches_topic=self.batches_topic, dlq_topic=self.dlq_topic,
            group_state=self.group_state, group_members=self.group_members,
            flush=self.writes.flush, submit=self.writes.submit, pipelined=cfg.sink_pipelined, on_emit=on_group,
        )
        self.feedback_applied = self.app.Table("feedback-applied", **tbl)
        self.feedback = FeedbackStage(
            self.app, sink=sink, health=self.health, batches_topic=self.batches_topic, dlq_topic=self.dlq_topic,
            table=self.feedback_applied, flush=self.writes.flush, submit=self.writes.submit, window_s=cfg.feedback_window_s,
            baseline=cfg.feedback_baseline, baseline_window=cfg.feedback_baseline_window, pipelined=cfg.sink_pipelined,
            on_emit=on_group,
        )
        self.frontier = Frontier(self.app, cfg.gap_accept_s)
        self.stage: SpanStage | None = None
        self._stopping = False
        self._register()

    @property
    def stats(self) -> dict[str, int]:
        """The faust side's counts (the span stage keeps its own)."""
        return {**self.groups.stats, **self.feedback.stats, **self.frontier.stats}

    def table_changelogs(self) -> list[str]:
        """The changelog topics of the group tables, as faust names them."""
        return [t.changelog_topic.get_topic_name() for t in (self.group_state, self.group_members, self.feedback_applied)]

    # ------------------------------------------------------------------ spans stage

    def make_stage(self) -> SpanStage:
        p = self.cfg.topic_prefix
        return SpanStage(
            self.cfg.kafka_conf, group=span_group(self.cfg.app_id), spans_topic=f"{p}spans", done_topic=done_topic_name(p),
            dlq_topic=f"{p}dlq", state_topic=state_topic_name(self.cfg.app_id), sink=self.sink, flush_sink=self.writes.flush,
            submit_sink=self.writes.submit if self.cfg.sink_pipelined else None,
            core=self.cfg.core, finish_grace_s=self.cfg.finish_grace_s, rollout_timeout_s=self.cfg.rollout_timeout_s,
            completed_retention_s=self.cfg.completed_retention_s, session_timeout_s=self.cfg.session_timeout_s,
            feedback_topic=feedback_topic_name(p),
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

    # ------------------------------------------------------------------ wiring

    def _register(self) -> None:
        app, groups = self.app, self.groups

        def make_agent(topic: Any, handler: Any, name: str, stage: Any = groups) -> None:
            async def agent(stream: Any) -> None:
                manual = stream.noack()
                async for event in manual.events():
                    if event.message.topic in STRICT_TOPICS:
                        verdict = await self.frontier.admit(event.message)
                        if verdict == "drop":
                            continue
                        if verdict == "duplicate":  # processed earlier in this assignment: only ack it
                            stage.ack_later(manual, event)
                            continue
                    try:
                        await handler(event)
                    except Exception:  # noqa: BLE001 - one bad record must not stop the stream
                        log.exception("processing %s[%s]@%s failed", event.message.topic, event.message.partition, event.message.offset)
                        await stage.dead_letter(event, "processing_error", "see worker log")
                    stage.ack_later(manual, event)
                    self._lag(event)
                    await stage.maybe_commit()

            agent.__name__ = agent.__qualname__ = name
            app.agent(topic, name=f"{self.cfg.app_id}.{name}")(agent)

        make_agent(self.done_topic, groups.on_rollout_done, "groups")
        make_agent(self.resources_topic, groups.on_store_record, "resources")
        make_agent(self.metrics_topic, groups.on_store_record, "metrics")
        make_agent(self.dlq_topic, groups.on_store_record, "dlq")
        make_agent(self.feedback_topic, self.feedback.on_feedback, "feedback", self.feedback)

        @app.task
        async def spans() -> None:
            await self.run_stage()

        @app.timer(self.cfg.tick_s)
        async def tick() -> None:
            await groups.expire_groups()
            await groups.try_commit()
            await self.feedback.try_commit()
            await self.frontier.reread_missing_tails()

        @app.on_partitions_revoked.connect
        async def on_revoked(app: Any, revoked: Any, **_: Any) -> None:
            await groups.try_commit()  # what it could not ack, the next owner reads again
            await self.feedback.try_commit()
            for tp in revoked:
                self.frontier.forget(tp)

    def _lag(self, event: Any) -> None:
        tp = event.message.tp
        try:
            hw = self.app.consumer.highwater(tp)
        except Exception:  # noqa: BLE001 - lag is best effort
            return
        if hw is not None:
            LAG.labels(tp.topic, str(tp.partition)).set(max(hw - event.message.offset - 1, 0))


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
                await worker.groups.commit_point()
                await worker.feedback.commit_final()
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
