"""The ClickHouse sink: ``add()`` buffers rows, ``flush()`` writes one insert per table.

Each insert carries an ``insert_deduplication_token`` derived from the Kafka offset ranges its rows
came from, so a batch delivered again after a restart (same offsets) is dropped by ClickHouse; the
tables are ReplacingMergeTree on each record's identity, so even a batch cut differently on
re-delivery is one row per record to a reader using FINAL (all views do). Rows that came from no
offset (the group stage's) are named in the token by their content: a replayed batch over the same
offsets that carries other such rows is a different batch, and is written.

A training rollout's ``transitions`` rows are written twice: when its attempt completes (so they are
queryable at once) and again, with their advantages, when its group is emitted. When the group's
rows arrive while the first rows still wait in the buffer, the first are dropped: the insert that
would have carried them carries their replacement (same rows, newer ``updated_ns``), and the token
ids go to ClickHouse once instead of twice.

Writes happen on one writer thread when rows are handed off with ``submit()`` (the stream worker's
commit points: the event loop reads on while ClickHouse inserts), in order, one batch in flight; the
caller learns from ``written`` which batches are in ClickHouse before it commits their offsets.

Row builders (``span_row`` ...) are pure functions: record in, dict of column → value out.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from foundation.errors import ClickHouseError
from schemas.models import DeadLetter, GroupBatch, ResourceVersion, Span, TrainStep
from streams import rowbinary
from streams.grouping import Advantages
from streams.rollout import RolloutResult

log = logging.getLogger(__name__)

TABLES = ("spans", "rollouts", "transitions", "groups", "resource_versions", "train_steps", "dead_letters")
# Tables that also take pre-encoded RowBinary rows (streams.rowbinary), and their column order.
ENCODED_COLUMNS = {"spans": rowbinary.SPANS_COLUMNS, "transitions": rowbinary.TRANSITIONS_COLUMNS}


# --------------------------------------------------------------------------- rows


def span_row(span: Span, partition: int, offset: int, late: bool = False, ingested_ns: int | None = None) -> dict[str, Any]:
    llm, tool, reward = span.llm, span.tool, span.reward
    return {
        "rollout_id": span.rollout_id,
        "attempt_id": span.attempt_id,
        "span_id": span.span_id,
        "sequence_id": span.sequence_id,
        "trace_id": span.trace_id,
        "parent_id": span.parent_id,
        "name": span.name,
        "kind": span.kind,
        "agent_name": span.agent_name,
        "start_time_ns": span.start_time_ns,
        "end_time_ns": span.end_time_ns,
        "status_code": span.status_code,
        "status_message": span.status_message,
        "attributes": span.attributes,
        "events": [(e.name, e.time_ns, e.attributes) for e in span.events],
        "resource": span.resource,
        "model": llm.model if llm else None,
        "prompt_token_ids": llm.prompt_token_ids if llm else [],
        "response_token_ids": llm.response_token_ids if llm else [],
        "response_logprobs": llm.response_logprobs if llm else [],
        "resource_version": llm.resource_version if llm else None,
        "reward": reward.value if reward else None,
        "reward_dimensions": reward.dimensions if reward else {},
        "tool_name": tool.name if tool else None,
        "tool_ok": tool.ok if tool else None,
        "tool_arguments": tool.arguments if tool else None,
        "tool_result": tool.result if tool else None,
        "tool_error": tool.error if tool else None,
        "late": late,
        "kafka_partition": partition,
        "kafka_offset": offset,
        "ingested_ns": ingested_ns if ingested_ns is not None else time.time_ns(),
    }


def rollout_row(result: RolloutResult, group: str, updated_ns: int) -> dict[str, Any]:
    return {
        "rollout_id": result.rollout_id,
        "attempt_id": result.attempt_id,
        "task_id": result.task_id,
        "mode": result.mode,
        "attempt": result.attempt,
        "resource_version": result.resource_version,
        "status": result.status,
        "final_reward": result.final_reward,
        "started_ns": result.started_ns,
        "finished_ns": result.finished_ns,
        "span_count": result.span_count,
        "spans_seen": result.spans_seen,
        "missing_sequence_ids": result.missing_sequence_ids,
        "transition_count": len(result.steps),
        "group_id": group,
        "error": result.error,
        "metadata": result.metadata,
        "updated_ns": updated_ns,
    }


def transition_rows(result: RolloutResult, group: str, updated_ns: int) -> list[dict[str, Any]]:
    return [
        {
            "rollout_id": s.rollout_id,
            "attempt_id": s.attempt_id,
            "turn": s.turn,
            "task_id": s.task_id,
            "span_id": s.span_id,
            "agent_name": s.agent_name,
            "resource_version": s.resource_version,
            "prompt_token_ids": s.prompt_token_ids,
            "response_token_ids": s.response_token_ids,
            "response_logprobs": s.response_logprobs,
            "response_mask": s.response_mask,
            "reward": s.reward,
            "return_": s.return_,
            "advantage": s.advantage,
            "trained": s.trained,
            "group_id": group,
            "credit": result.credit,
            "updated_ns": updated_ns,
        }
        for s in result.steps
    ]


def group_row(batch: GroupBatch, adv: Advantages) -> dict[str, Any]:
    return {
        "group_id": batch.group_id,
        "task_id": batch.task_id,
        "resource_version": batch.resource_version,
        "group_size": batch.group_size,
        "rollouts": len(batch.rollout_ids),
        "complete": batch.complete,
        "zero_variance": batch.zero_variance,
        "credit": batch.credit,
        "rollout_ids": batch.rollout_ids,
        "rewards": batch.rewards,
        "advantages": batch.advantages,
        "reward_mean": adv.mean,
        "reward_std": adv.std,
        "created_ns": batch.created_ns,
    }


def resource_version_row(rv: ResourceVersion) -> dict[str, Any]:
    return rv.model_dump()


def train_step_row(ts: TrainStep) -> dict[str, Any]:
    return ts.model_dump()


def dead_letter_row(dl: DeadLetter, dlq_partition: int, dlq_offset: int) -> dict[str, Any]:
    return {
        "source_topic": dl.source_topic,
        "partition": dl.partition,
        "offset": dl.offset,
        "reason": dl.reason,
        "detail": dl.detail,
        "stage": dl.stage,
        # String columns hold bytes as they are; raw bytes stay inspectable with hex().
        "key": dl.key,
        "value": dl.value,
        "time_ns": dl.time_ns,
        "dlq_partition": dlq_partition,
        "dlq_offset": dlq_offset,
    }


# --------------------------------------------------------------------------- sink


@dataclass
class _Buffer:
    rows: list[dict[str, Any]] = field(default_factory=list)
    encoded: list[bytes] = field(default_factory=list)  # RowBinary rows in ENCODED_COLUMNS[table] order
    # (rollout_id, attempt_id) → indexes into ``encoded`` of its rows that a newer write may replace
    replaceable: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    dropped: int = 0  # rows of ``encoded`` replaced before the flush (left as b"")
    # (topic, partition) → [min offset, max offset] of the records these rows came from
    ranges: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    # the content of the rows that came from no record, in order (None: there are none)
    unsourced: Any = None

    def note(self, source: tuple[str, int, int] | None, content: bytes) -> None:
        if source is None:
            if self.unsourced is None:
                self.unsourced = hashlib.sha1()
            self.unsourced.update(len(content).to_bytes(8, "little"))
            self.unsourced.update(content)
            return
        topic, partition, offset = source
        r = self.ranges.get((topic, partition))
        if r is None:
            self.ranges[(topic, partition)] = [offset, offset]
        elif offset > r[1]:  # the usual case: offsets arrive in order
            r[1] = offset
        elif offset < r[0]:
            r[0] = offset


def dedup_token(table: str, ranges: dict[tuple[str, int], list[int]], rows: int, unsourced: str = "") -> str | None:
    """A token naming exactly which Kafka records a batch holds, and the digest of the rows in it that
    came from none (``unsourced``); ``None`` when it came from no record."""
    if not ranges:
        return None
    parts = [f"{t}:{p}:{lo}-{hi}" for (t, p), (lo, hi) in sorted(ranges.items())]
    return hashlib.sha1(f"{table}|{rows}|{'|'.join(parts)}|{unsourced}".encode()).hexdigest()


def _load_insert_checks() -> None:
    """clickhouse-connect imports pandas and numpy (where installed) at its first insert of Python rows, to
    ask whether the rows are a DataFrame or an array: about 0.3 CPU-seconds that would stall the stream at
    its first flush. Paid when the sink is made instead (once per process)."""
    try:
        from clickhouse_connect.driver import options
    except ImportError:  # pragma: no cover - the sink's client is clickhouse-connect's
        return
    _ = options.pd, options.np


@dataclass
class _Batch:
    """Rows taken from the buffers together, written in order after every batch before them."""
    seq: int
    buffers: dict[str, _Buffer]
    count: int  # rows not written yet


class ClickHouseSink:
    """Buffers rows per table; flushes when ``batch_size`` rows are buffered or ``interval_s`` passed.

    ``flush()`` writes everything buffered before it returns. ``submit()`` hands the buffered rows to a
    writer thread as one numbered batch and returns at once; ``written`` is the number of the last batch
    whose every row is in ClickHouse (batches are written in order, one hand-off at a time). A batch
    whose insert failed stays whole, with the token it had, and is written first at the next
    ``submit()`` or ``flush()``."""

    def __init__(self, client: Any, batch_size: int = 20000, interval_s: float = 1.0) -> None:
        self.client = client
        self.batch_size = batch_size
        self.interval_s = interval_s
        self._buffers: dict[str, _Buffer] = defaultdict(_Buffer)
        self._last_flush = time.monotonic()
        self.rows_written: dict[str, int] = defaultdict(int)
        self.rows_dropped = 0  # transitions rows replaced in the buffer before they were written
        self.last_flush_s = 0.0
        self.submitted = 0  # the number of the last batch taken from the buffers
        self.written = 0  # every batch up to this number is written
        self._unwritten: list[_Batch] = []  # taken, not yet written, in order
        self._unwritten_rows = 0
        self._inflight: Future[dict[str, int]] | None = None
        self._writer: ThreadPoolExecutor | None = None
        _load_insert_checks()

    def add(self, table: str, row: dict[str, Any], source: tuple[str, int, int] | None = None) -> None:
        """Buffer one row; ``source`` is the (topic, partition, offset) it came from, for dedup tokens."""
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}; the sink writes {TABLES}")
        buf = self._buffers[table]
        buf.rows.append(row)
        buf.note(source, b"" if source is not None else repr(sorted(row.items())).encode())

    def add_many(self, table: str, rows: Iterable[dict[str, Any]], source: tuple[str, int, int] | None = None) -> None:
        for row in rows:
            self.add(table, row, source)

    def add_encoded(self, table: str, row: bytes, source: tuple[str, int, int] | None = None) -> None:
        """Buffer one RowBinary row of ``table`` (columns in ``ENCODED_COLUMNS[table]`` order)."""
        if table not in ENCODED_COLUMNS:
            raise ValueError(f"table {table!r} takes no encoded rows; these do: {sorted(ENCODED_COLUMNS)}")
        buf = self._buffers[table]
        buf.encoded.append(row)
        buf.note(source, row)

    def add_transitions(self, result: RolloutResult, group: str, updated_ns: int, source: tuple[str, int, int] | None = None,
                        *, final: bool = False) -> None:
        """Buffer the ``transitions`` rows of ``result`` (RowBinary: token ids never become Python rows).

        ``final``: these rows supersede the attempt's rows still in the buffer (the group stage's, with
        advantages); those are dropped. Otherwise they stay replaceable until the next flush."""
        buf = self._buffers["transitions"]
        key = (result.rollout_id, result.attempt_id)
        if final:
            for i in buf.replaceable.pop(key, ()):
                buf.encoded[i] = b""
                buf.dropped += 1
                self.rows_dropped += 1
        start = len(buf.encoded)
        for step in result.steps:
            self.add_encoded("transitions", rowbinary.transition(step, group, result.credit, updated_ns), source)
        if not final and result.steps:
            buf.replaceable.setdefault(key, []).extend(range(start, len(buf.encoded)))

    @property
    def buffered(self) -> int:
        """Rows added since the last hand-off."""
        return sum(len(b.rows) + len(b.encoded) - b.dropped for b in self._buffers.values())

    @property
    def pending(self) -> int:
        """Rows not known to be written: buffered, and in batches handed off."""
        return self.buffered + self._unwritten_rows

    @property
    def inflight(self) -> Future[dict[str, int]] | None:
        """The batch handed off last, until a ``wait()`` collects it."""
        return self._inflight

    @property
    def busy(self) -> bool:
        """A batch is being written."""
        return self._inflight is not None and not self._inflight.done()

    def due(self) -> bool:
        return self.buffered >= self.batch_size or (
            self.pending > 0 and time.monotonic() - self._last_flush >= self.interval_s
        )

    def flush(self) -> dict[str, int]:
        """Write every row not yet written (a batch handed off first); → rows this call wrote per table.
        Raises ClickHouseError, keeping the rows."""
        self.wait()
        self._take()
        try:
            return self._write()
        finally:
            self._count_unwritten()

    def submit(self) -> int:
        """Hand every buffered row to the writer thread as one batch, written after those before it;
        → its number (the last batch's when nothing is buffered). Waits for the batch handed off before
        (raising its ClickHouseError, the rows kept: they go with the next hand-off)."""
        self.wait()
        self._take()
        if self._unwritten:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="rolloutbus-sink")
            self._inflight = self._writer.submit(self._write)
        return self.submitted

    def wait(self) -> None:
        """Wait until the batch handed off last is written. Raises its ClickHouseError."""
        fut, self._inflight = self._inflight, None
        if fut is None:
            return
        try:
            fut.result()
        finally:
            self._count_unwritten()

    def _take(self) -> None:
        """The buffered rows become the next batch (rows all replaced before a write leave nothing to write)."""
        rows = self.buffered
        if rows:
            self.submitted += 1
            self._unwritten.append(_Batch(self.submitted, dict(self._buffers), rows))
            self._unwritten_rows += rows
        self._buffers = defaultdict(_Buffer)
        self._last_flush = time.monotonic()

    def _count_unwritten(self) -> None:
        self._unwritten_rows = sum(b.count for b in self._unwritten)

    def _write(self) -> dict[str, int]:
        """Write the batches taken, in order, one insert per table; a failure leaves the batch with the
        tables it has not written (on the writer thread when handed off: nothing else touches them then)."""
        written: dict[str, int] = defaultdict(int)
        while self._unwritten:
            started = time.monotonic()
            batch = self._unwritten[0]
            for table in TABLES:
                buf = batch.buffers.get(table)
                if buf is None:
                    continue
                if buf.rows or buf.encoded:
                    n = self._insert(table, buf)
                    batch.count -= n
                    written[table] += n
                    self.rows_written[table] += n
                del batch.buffers[table]
            self._unwritten.pop(0)
            self.last_flush_s = time.monotonic() - started  # the batch's, before ``written`` says it is in
            self.written = batch.seq
        return dict(written)

    def _insert(self, table: str, buf: _Buffer) -> int:
        n = len(buf.rows) + len(buf.encoded) - buf.dropped
        # The token names the rows' source records and the batch size, whichever way they travel.
        token = dedup_token(table, buf.ranges, n, buf.unsourced.hexdigest() if buf.unsourced is not None else "")
        try:
            if len(buf.encoded) > buf.dropped:
                settings = {"insert_deduplication_token": f"{token}-rb"} if token else {}
                self.client.raw_insert(table, ENCODED_COLUMNS[table], _pieces(buf.encoded), settings=settings, fmt="RowBinary")
            buf.encoded, buf.replaceable, buf.dropped = [], {}, 0
            if buf.rows:
                columns = list(buf.rows[0])
                data = [[row[c] for c in columns] for row in buf.rows]
                settings = {"insert_deduplication_token": token} if token else {}
                self.client.insert(table, data, column_names=columns, settings=settings)
        except Exception as exc:  # noqa: BLE001 - mapped once, here
            raise ClickHouseError(f"insert of {n} rows into {table} failed: {(str(exc).splitlines() or [repr(exc)])[0]}") from exc
        return n


def _pieces(encoded: list[bytes], size: int = 1 << 20) -> Iterator[bytes]:
    """The rows in pieces of about ``size`` bytes. One join of a whole batch (tens of MB of LLM rows) is fresh
    memory every time, page-faulted in; pieces of 1 MB reuse what the one before freed."""
    part: list[bytes] = []
    n = 0
    for row in encoded:
        part.append(row)
        n += len(row)
        if n >= size:
            yield b"".join(part)
            part, n = [], 0
    if part:
        yield b"".join(part)


__all__ = [
    "ENCODED_COLUMNS",
    "TABLES",
    "ClickHouseSink",
    "dedup_token",
    "span_row",
    "rollout_row",
    "transition_rows",
    "group_row",
    "resource_version_row",
    "train_step_row",
    "dead_letter_row",
]
