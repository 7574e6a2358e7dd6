"""A bounded, append-only on-disk spool of encoded records: the transport's write-ahead log.

Every record the transport accepts is appended here before it is handed to Kafka, so a broker
outage or a SIGKILL never loses it. Records are numbered with a global, monotonic index; segment
files are named after the index of their first record. Delivered records advance an acknowledged
low-watermark (persisted in ``ack``); segments wholly below it are deleted. On start the spool
replays every record at or above the watermark, in order.

Frame: ``<u32 payload length><u32 crc32 of payload>`` then payload = ``<u16 key length><key><value>``.
A torn frame at the end of the last segment (a crash mid-write) is detected by length/CRC and cut off.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")
_KEYLEN = struct.Struct("<H")
FRAME_OVERHEAD = _HEADER.size + _KEYLEN.size  # bytes a record takes in the spool beyond its key and value
_SEG_SUFFIX = ".seg"


def _encode_frame(key: bytes, value: bytes) -> bytes:
    payload = _KEYLEN.pack(len(key)) + key + value
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _read_frames(path: Path, start_pos: int = 0) -> Iterator[tuple[int, bytes, bytes]]:
    """Yield (position after the frame, key, value) for every intact frame; stop at a torn one."""
    with open(path, "rb") as fh:
        fh.seek(start_pos)
        pos = start_pos
        while True:
            head = fh.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return
            length, crc = _HEADER.unpack(head)
            payload = fh.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                return
            (klen,) = _KEYLEN.unpack_from(payload)
            pos += _HEADER.size + length
            yield pos, payload[2 : 2 + klen], payload[2 + klen :]


@dataclass
class _Segment:
    base: int  # index of the first record
    path: Path
    count: int = 0
    size: int = 0

    @property
    def end(self) -> int:
        return self.base + self.count


class SpoolLocked(Exception):
    """Another live process owns this spool directory."""


class Spool:
    """Append-only segments + an acknowledged low-watermark. Not thread-safe: one owner thread."""

    def __init__(self, directory: Path, max_bytes: int = 1 << 30, segment_bytes: int = 64 << 20) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        # Space comes back a whole segment at a time: keep segments small next to the bound.
        self.segment_bytes = min(segment_bytes, max(max_bytes // 8, 4096))
        # The lock dies with the process, so a SIGKILLed owner frees the spool for the next one.
        self._lock_fh = open(self.dir / "lock", "a+")
        try:
            fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_fh.close()
            raise SpoolLocked(str(self.dir)) from None
        self.acked = self._read_ack()
        self.segments: list[_Segment] = []
        self._size = 0  # bytes in self.segments (size_bytes is read for every batch the transport takes)
        self._scan()
        self._writer: BinaryIO | None = None
        self._dirty = False
        self._cursor: tuple[int, int, int] | None = None  # (next index, segment base, file position)

    # ------------------------------------------------------------------ state

    def _read_ack(self) -> int:
        try:
            return int((self.dir / "ack").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _scan(self) -> None:
        for path in sorted(self.dir.glob(f"*{_SEG_SUFFIX}"), key=lambda p: int(p.stem)):
            seg = _Segment(int(path.stem), path)
            good = 0
            for pos, _k, _v in _read_frames(path):
                seg.count += 1
                good = pos
            actual = path.stat().st_size
            if actual != good:
                log.warning("spool segment %s: cut a torn tail of %d bytes (a crash mid-write)", path, actual - good)
                with open(path, "r+b") as fh:
                    fh.truncate(good)
            seg.size = good
            if seg.end <= self.acked:
                path.unlink(missing_ok=True)
                continue
            if self.segments and seg.base != self.segments[-1].end:
                # A gap means records between were already acknowledged and deleted; nothing lost.
                log.debug("spool: gap before segment %s", path)
            self.segments.append(seg)
            self._size += seg.size
        if self.segments:
            self.acked = max(self.acked, self.segments[0].base)

    @property
    def head(self) -> int:
        """The index the next appended record gets."""
        return self.segments[-1].end if self.segments else self.acked

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def pending(self) -> int:
        """Records appended but not yet acknowledged."""
        return self.head - self.acked

    def full(self, extra: int = 0) -> bool:
        return self.size_bytes + extra > self.max_bytes

    # ------------------------------------------------------------------ write

    def append(self, key: bytes, value: bytes) -> int:
        """Append one record; returns its index. The caller checks ``full`` first (the policy is theirs)."""
        return self.append_many([(key, value)])

    def append_many(self, records: list[tuple[bytes, bytes]]) -> int:
        """Append records in order, one write per segment they go to; returns the index of the first.
        The caller checks ``full`` for all of them first."""
        first = self.head
        frames: list[bytes] = []
        size = 0
        seg = self.segments[-1] if self.segments else None
        for key, value in records:
            if seg is None or seg.size + size >= self.segment_bytes:
                if frames:
                    self._write(seg, frames, size)  # type: ignore[arg-type]
                    frames, size = [], 0
                seg = self._roll()
            payload = _KEYLEN.pack(len(key)) + key + value
            frames.append(_HEADER.pack(len(payload), zlib.crc32(payload)))
            frames.append(payload)
            size += _HEADER.size + len(payload)
        if frames:
            self._write(seg, frames, size)  # type: ignore[arg-type]
        return first

    def _roll(self) -> _Segment:
        """The segment to append to: the last one unless it is full (or closed by an ack), else a new one."""
        seg = self.segments[-1] if self.segments else None
        if seg is None or seg.size >= self.segment_bytes:
            self._close_writer()
            seg = _Segment(self.head, self.dir / f"{self.head:020d}{_SEG_SUFFIX}")
            self.segments.append(seg)
        if self._writer is None:
            self._writer = open(seg.path, "ab")
        return seg

    def _write(self, seg: _Segment, frames: list[bytes], size: int) -> None:
        if self._writer is None:
            self._writer = open(seg.path, "ab")
        self._writer.write(b"".join(frames))
        self._dirty = True
        seg.count += len(frames) // 2
        seg.size += size
        self._size += size

    def flush(self, fsync: bool = False) -> None:
        """Hand buffered frames to the OS (survives SIGKILL); ``fsync`` also survives power loss."""
        if self._writer is not None and self._dirty:
            self._writer.flush()
            if fsync:
                os.fsync(self._writer.fileno())
            self._dirty = False

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            os.fsync(self._writer.fileno())
            self._writer.close()
            self._writer = None

    # ------------------------------------------------------------------ ack / read

    def ack_to(self, index: int) -> None:
        """Every record below ``index`` is delivered: persist that, delete wholly delivered segments."""
        if index <= self.acked:
            return
        self.acked = index
        tmp = self.dir / "ack.tmp"
        tmp.write_text(str(index))
        os.replace(tmp, self.dir / "ack")
        # Wholly delivered segments go; the one being written is closed first (the next append starts
        # a fresh one), so the spool does not grow while Kafka keeps up.
        while self.segments and self.segments[0].end <= index:
            seg = self.segments.pop(0)
            self._size -= seg.size
            if not self.segments:
                self._close_writer()
            seg.path.unlink(missing_ok=True)

    def read_from(self, index: int, limit: int) -> list[tuple[int, bytes, bytes]]:
        """Up to ``limit`` records with index >= ``index``, in order (flushes the writer first).

        Sequential reads resume from a cached file position, so draining a large backlog is linear.
        """
        self.flush()
        out: list[tuple[int, bytes, bytes]] = []
        for seg in self.segments:
            if seg.end <= index:
                continue
            start_pos, i = 0, seg.base
            if self._cursor is not None and self._cursor[1] == seg.base and self._cursor[0] <= index:
                i, _, start_pos = self._cursor
            for pos, key, value in _read_frames(seg.path, start_pos):
                if i >= index:
                    out.append((i, key, value))
                i += 1
                self._cursor = (i, seg.base, pos)
                if len(out) >= limit:
                    return out
        return out

    def close(self) -> None:
        self._close_writer()
        try:
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
        finally:
            self._lock_fh.close()


def open_spool(root: Path, name: str = "agent", max_bytes: int = 1 << 30, slots: int = 64) -> Spool:
    """The first spool slot under ``root`` that no live process holds: ``root/name-0``, ``name-1``, ...

    A process that died leaves its slot unlocked, so the next process to start adopts it and replays it.
    """
    for i in range(slots):
        try:
            return Spool(Path(root) / f"{name}-{i}", max_bytes=max_bytes)
        except SpoolLocked:
            continue
    raise SpoolLocked(f"all {slots} spool slots under {root} are held by live processes")
