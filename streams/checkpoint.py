"""The commit point, one for every stage of the worker: rows written → outputs delivered → changelog → offsets.

A stage's records may be committed (the span stage's offsets) or acked (the faust agents' events, whose
offsets faust then commits) only once everything they caused is durable, in this order:

1. **rows written** — the sink wrote every row they produced (ClickHouse dedup tokens make a replay of
   them invisible);
2. **outputs delivered** — the broker has every record they produced (summaries, group batches, dead
   letters). A record it did not take for lack of time or a connection is sent again and fails the
   commit point; one it refuses for good (too large, not authorised) is logged and dropped, since it
   would be refused at every commit point and hold every later one back;
3. **changelog** — the state entries they changed (completed attempts, group tables) are sent and
   delivered. Only now: an entry that landed before what it records, then a crash, would restore a
   state (an attempt done, a group emitted) whose output was lost;
4. **offsets** — committed or acked.

:class:`Checkpoint` runs the four steps, in that order, for any stage; the stage (:class:`Committing`)
does each step's work on its own Kafka client: the span stage on librdkafka (:mod:`streams.spans_stage`,
synchronous, holding the event loop: :meth:`Checkpoint.commit_now`), the group stage on faust's
aiokafka (:mod:`streams.groups_stage`, awaited). Inserts are pipelined: a commit point hands its rows to
the sink's writer thread, and the entries and offsets it took go only once those rows are written —
the span stage settles them at a later commit point (it reads on meanwhile), the group stage awaits its
batch without holding the loop. On a failure nothing past the last written rows is committed: what a
commit point took waits for the next one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from prometheus_client import Counter, Histogram

from foundation.errors import ClickHouseError
from streams.health import StreamHealth

T = TypeVar("T")

SINK_LATENCY = Histogram("rolloutbus_streams_sink_flush_seconds", "ClickHouse flush latency")
SINK_ROWS = Counter("rolloutbus_streams_sink_rows_total", "Rows written to ClickHouse", ["table"])
SINK_REPLACED = Counter("rolloutbus_streams_sink_rows_replaced_total",
                        "transitions rows replaced by their group's rows before they were written (written once, not twice)")


class Committing(Protocol):
    """A stage's half of its commit points: what each step does on the stage's own Kafka client."""

    def take(self, final: bool) -> Any:
        """What this commit point carries (changelog entries, offsets or events to ack), as of now: the
        moment its rows are handed to the sink."""

    async def deliver(self) -> float | None:
        """Step 2: wait until the broker has every record produced so far (raise KafkaUnavailable if not). →
        the monotonic time step 3 must be done by too (one wait shared by both), or None."""

    async def send_changelog(self, points: list[Any], by: float | None) -> None:
        """Step 3: send the changelog entries of ``points`` and wait for them (raise KafkaUnavailable if not)."""

    async def commit(self, points: list[Any], final: bool) -> None:
        """Step 4: commit or ack what ``points`` carry (none: nothing was ready; earlier commits may be checked)."""

    def put_back(self, points: list[Any], sent: bool) -> bool:
        """``points`` failed before their offsets went (``sent``: in step 3, their entries sent, landed or not).
        → True when the stage took their content back (the checkpoint forgets them), False to leave them queued."""


class Checkpoint:
    """Runs a stage's commit points: its four steps in order, on rows written by the worker's one sink.

    ``flush`` writes every row not yet written and ``submit`` hands the buffered ones to the sink's writer
    thread (→ the batch's number); ``submit=None``: each commit point writes its rows before it goes on.
    ``wait``: a pipelined commit point awaits its own batch (without holding the loop) instead of leaving
    its entries and offsets to the first commit point that finds them written. ``final`` (a revoke, a stop)
    writes everything and commits before it returns.

    A commit point whose settling fails before its changelog (step 3) stays queued for the next one; the
    stage is told (``put_back``), and a stage that merges what it takes (the group stage: its table entries
    once per key) takes the point's content back instead. One commit point at a time."""

    def __init__(self, stage: Committing, sink: Any, flush: Callable[[], None], submit: Callable[[], int] | None,
                 *, wait: bool = False) -> None:
        self.stage = stage
        self.sink = sink
        self.flush = flush
        self.submit = submit
        self.wait = wait
        # (batch number, what the commit point took) of commit points whose rows are not known to be written yet
        self.unsettled: list[tuple[int, Any]] = []
        self._lock = asyncio.Lock()

    async def commit(self, final: bool = False) -> None:
        """One commit point; raises ClickHouseError or KafkaUnavailable (nothing past the failure committed)."""
        async with self._lock:
            seq = self._hand_off(final)  # 1: raises the batch before's failure (nothing taken yet)
            point = self.stage.take(final)
            self.unsettled.append((seq or 0, point))
            try:
                if self.wait:
                    if seq is not None:
                        await self._written(seq)
                    ready = [p for _, p in self.unsettled]
                else:
                    ready = [p for s, p in self.unsettled if s <= self.sink.written]
                by = await self.stage.deliver() if ready else None  # 2
            except BaseException:
                if self.stage.put_back([p for _, p in self.unsettled], sent=False):
                    self.unsettled.clear()  # their content is the stage's again: the next point takes it
                raise
            del self.unsettled[:len(ready)]
            if ready:
                try:
                    await self.stage.send_changelog(ready, by)  # 3
                except BaseException:
                    self.stage.put_back(ready, sent=True)
                    raise
            await self.stage.commit(ready, final)  # 4

    def commit_now(self, final: bool = False) -> None:
        """:meth:`commit` for a stage whose steps never wait on the event loop (librdkafka's own waits block)."""
        at_once(self.commit(final))

    def _hand_off(self, final: bool) -> int | None:
        """The rows buffered now go to the sink; → the number of the batch that holds them (None: none to wait for)."""
        if final or self.submit is None:
            self.flush()  # the batch in flight first, then the rest
            return None if self.wait else self.sink.submitted
        if self.wait:  # handed off in _written, once no batch is being written
            return self.sink.submitted + (1 if self.sink.buffered else 0) if self.sink.pending else None
        return self.submit()  # raises the batch in flight's failure: its rows go with the next one

    async def _written(self, target: int) -> None:
        """Wait, without holding the event loop, until batch ``target`` is written (handing the rows to the
        sink's writer when no batch is being written). Raises ClickHouseError (the rows kept)."""
        # The rows buffered now go with the next batch, whoever hands it off (the span stage too).
        while self.sink.written < target:
            fut = self.sink.inflight
            if fut is not None and not fut.done():
                waiting = asyncio.wrap_future(fut)
                await asyncio.wait([waiting])
                if not waiting.cancelled():
                    waiting.exception()  # seen here; raised below by whoever collects the batch
                continue
            assert self.submit is not None
            self.submit()  # collects the batch before (raising its failure), hands off the rest


def at_once(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends to its end, here (a librdkafka stage's commit point: a revoke
    calls it from inside librdkafka's poll, where nothing can be awaited)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a commit point that must not wait on the event loop waited on it")


class SinkWrites:
    """The worker's one sink, as both stages' checkpoints write it: each write and hand-off counted in the
    metrics and reported to /readyz (ClickHouse takes rows, or not)."""

    def __init__(self, sink: Any, health: StreamHealth) -> None:
        self.sink = sink
        self.health = health
        self._replaced_seen = 0  # sink.rows_dropped already counted in rolloutbus_streams_sink_rows_replaced_total
        self._written_seen: dict[str, int] = {}  # sink.rows_written already counted in rolloutbus_streams_sink_rows_total
        self._batch_seen = 0  # sink.written at the last look

    def flush(self) -> None:
        """Write every row not yet written (both stages share the sink). Raises ClickHouseError, keeping them."""
        if self.sink.pending:
            self._call(self.sink.flush)

    def submit(self) -> int:
        """Hand the buffered rows to the sink's writer (after the batch before them is written); → the
        batch's number. Raises the batch before's ClickHouseError, keeping the rows."""
        return self._call(self.sink.submit)

    def _call(self, call: Callable[[], T]) -> T:
        try:
            out = call()
        except ClickHouseError:
            self._metrics()
            self.health.clickhouse(False)
            raise
        self._metrics()
        return out

    def _metrics(self) -> None:
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


__all__ = ["Checkpoint", "Committing", "SinkWrites", "at_once"]
