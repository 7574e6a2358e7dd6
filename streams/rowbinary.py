"""ClickHouse RowBinary encoding of the two wide tables, ``spans`` and ``transitions``. Pure.

Token ids and log-probabilities travel packed (little-endian uint32 / float32) from the producer to
here (the stream worker holds them as ``array`` over the wire bytes), and RowBinary's
``Array(UInt32)`` / ``Array(Float32)`` is a length and exactly those bytes: a 1,000-token prompt
costs a copy instead of a thousand Python integers through the column encoder.
The other columns are encoded in the table's column order (``SPANS_COLUMNS``, ``TRANSITIONS_COLUMNS``);
tests check that what ClickHouse reads back equals the rows :mod:`streams.sink` builds.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

from schemas.codec import pack_array

try:  # native/: the common transitions row compiled (None where it declines a step)
    from rolloutbus_native import transition_row as _native_transition
except ImportError:
    _native_transition = None

_ITEMSIZE = {"I": 4, "f": 4, "B": 1}
_I32 = struct.Struct("<i").pack
_I64 = struct.Struct("<q").pack
_U32 = struct.Struct("<I").pack
_U64 = struct.Struct("<Q").pack
_F64 = struct.Struct("<d").pack
_NULL = b"\x01"
_SOME = b"\x00"
_FALSE = b"\x00"
_TRUE = b"\x01"
_EMPTY = b"\x00"  # an empty array or map: length 0
_I64_2 = struct.Struct("<qq").pack
_TAIL = struct.Struct("<?iqq").pack  # late, kafka_partition, kafka_offset, ingested_ns
# The last four columns of a ``spans`` row (late, kafka_partition, kafka_offset, ingested_ns): the
# compiled decoder (native/) builds the rest of the row, the stage appends these once it knows them.
span_tail = _TAIL
_NO_LLM = _NULL + _EMPTY * 3 + _NULL  # model, prompt/response ids, logprobs, resource_version
_NO_REWARD = _NULL + _EMPTY  # reward, reward_dimensions
_NO_TOOL = _NULL * 5

SPANS_COLUMNS = [
    "rollout_id", "attempt_id", "span_id", "sequence_id", "trace_id", "parent_id", "name", "kind", "agent_name",
    "start_time_ns", "end_time_ns", "status_code", "status_message", "attributes", "events", "resource", "model",
    "prompt_token_ids", "response_token_ids", "response_logprobs", "resource_version", "reward", "reward_dimensions",
    "tool_name", "tool_ok", "tool_arguments", "tool_result", "tool_error", "late", "kafka_partition", "kafka_offset",
    "ingested_ns",
]
TRANSITIONS_COLUMNS = [
    "rollout_id", "attempt_id", "turn", "task_id", "span_id", "agent_name", "resource_version", "prompt_token_ids",
    "response_token_ids", "response_logprobs", "response_mask", "reward", "return_", "advantage", "trained",
    "group_id", "credit", "updated_ns",
]


def varint(n: int) -> bytes:
    """LEB128, as RowBinary writes lengths."""
    if n < _SHORT:
        return _LEB[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# LEB128 of every length below 16384 (one or two bytes), precomputed: most strings and maps are short.
_SHORT = 16384
_LEB = [bytes((n,)) if n < 0x80 else bytes(((n & 0x7F) | 0x80, n >> 7)) for n in range(_SHORT)]


def _str(s: str) -> bytes:
    b = s.encode()
    n = len(b)
    return (_LEB[n] if n < _SHORT else varint(n)) + b


def _nstr(s: str | None) -> bytes:
    if s is None:
        return _NULL
    b = s.encode()
    n = len(b)
    return _SOME + (_LEB[n] if n < _SHORT else varint(n)) + b


def _map_ss(m: Mapping[str, str]) -> bytes:
    if not m:
        return _EMPTY
    n = len(m)
    out = bytearray(_LEB[n] if n < _SHORT else varint(n))
    for k, v in m.items():
        b = k.encode()
        n = len(b)
        out += _LEB[n] if n < _SHORT else varint(n)
        out += b
        b = v.encode()
        n = len(b)
        out += _LEB[n] if n < _SHORT else varint(n)
        out += b
    return bytes(out)


def _map_sf(m: Mapping[str, float]) -> bytes:
    if not m:
        return _EMPTY
    return varint(len(m)) + b"".join(_str(k) + _F64(v) for k, v in m.items())


def _ints(values: Iterable[int], code: str) -> bytes:
    packed = pack_array(code, values)
    return varint(len(packed) // _ITEMSIZE[code]) + packed


def span(s: Any, partition: int, offset: int, late: bool, ingested_ns: int) -> bytes:
    """One ``spans`` row. ``s`` has the attribute shape of ``schemas.models.Span``; token ids and
    logprobs held as ``array`` (as the stream worker's span views do) are copied as one buffer."""
    llm, tool, reward = s.llm, s.tool, s.reward
    if llm is not None:
        tokens = _ints(llm.prompt_token_ids, "I") + _ints(llm.response_token_ids, "I") + _ints(llm.response_logprobs, "f")
        llm_cols = _nstr(llm.model) + tokens + (_NULL if llm.resource_version is None else _SOME + _I64(llm.resource_version))
    else:
        llm_cols = _NO_LLM
    if s.events:
        events = varint(len(s.events)) + b"".join(_str(e.name) + _I64(e.time_ns) + _map_ss(e.attributes) for e in s.events)
    else:
        events = _EMPTY
    if tool is None:
        tool_cols = _NO_TOOL
    else:
        tool_cols = b"".join((_SOME, _str(tool.name), _SOME, _TRUE if tool.ok else _FALSE, _SOME, _str(tool.arguments),
                              _nstr(tool.result), _nstr(tool.error)))
    # The leading strings inline (a call each costs as much as the encoding).
    out = bytearray()
    for v in (s.rollout_id, s.attempt_id, s.span_id):
        b = v.encode()
        n = len(b)
        out += _LEB[n] if n < _SHORT else varint(n)
        out += b
    return b"".join((
        out, _U64(s.sequence_id), _str(s.trace_id),
        _nstr(s.parent_id), _str(s.name), _str(s.kind), _nstr(s.agent_name), _I64_2(s.start_time_ns, s.end_time_ns),
        _str(s.status_code), _nstr(s.status_message), _map_ss(s.attributes), events, _map_ss(s.resource), llm_cols,
        _NO_REWARD if reward is None else _SOME + _F64(reward.value) + _map_sf(reward.dimensions),
        tool_cols, _TAIL(late, partition, offset, ingested_ns),
    ))


def transition(step: Any, group: str, credit: str, updated_ns: int) -> bytes:
    """One ``transitions`` row from a :class:`streams.transitions.Step`: compiled (``native/``) for the
    common shape when installed, :func:`transition_reference` otherwise (the same bytes; tests compare)."""
    if _native_transition is not None:
        row: bytes | None = _native_transition(step, group, credit, updated_ns)
        if row is not None:
            return row
    return transition_reference(step, group, credit, updated_ns)


def transition_reference(step: Any, group: str, credit: str, updated_ns: int) -> bytes:
    """One ``transitions`` row, in Python: the reference, and the path without ``native/``."""
    return b"".join((
        _str(step.rollout_id), _str(step.attempt_id), _U32(step.turn), _str(step.task_id), _str(step.span_id),
        _nstr(step.agent_name), _NULL if step.resource_version is None else _SOME + _I64(step.resource_version),
        _ints(step.prompt_token_ids, "I"), _ints(step.response_token_ids, "I"), _ints(step.response_logprobs, "f"),
        _ints(step.response_mask, "B"), _F64(step.reward), _F64(step.return_), _F64(step.advantage),
        _TRUE if step.trained else _FALSE, _str(group), _str(credit), _I64(updated_ns),
    ))


__all__ = ["SPANS_COLUMNS", "TRANSITIONS_COLUMNS", "span", "span_tail", "transition", "transition_reference", "varint"]
