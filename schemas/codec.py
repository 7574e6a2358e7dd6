"""Pure encode/decode of our records. No Kafka import here.

Two wire formats:

* **Avro single-object encoding** (the default): ``C3 01`` + the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema's parsing canonical form + the Avro binary body. The fingerprint
  names the writer schema, so one topic can carry several record types (rb.spans carries Span and
  RolloutEvent) and older writer versions stay readable.
* **Confluent wire format** (:func:`encode_confluent` / :func:`decode_confluent`, for a caller that
  keeps a schema registry): ``00`` + the 4-byte big-endian schema id + the body. The id → schema
  lookup is the caller's. No rolloutbus process reads or writes it: a record in it reaching
  :func:`decode_raw` is a DecodeError (to the DLQ) that says so.

Every failure is a :class:`~foundation.errors.DecodeError` (bytes are not ours) or a
:class:`~foundation.errors.ValidationError` (bytes are ours but the values cannot be right), each with
a message that names the problem.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from array import array
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import fastavro
import pydantic
from fastavro.schema import fingerprint as fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from foundation.errors import DecodeError, EncodeError, ValidationError
from schemas import span_avro
from schemas.models import RECORD_TYPES, Record

SCHEMA_DIR = Path(__file__).parent / "avro"
MAGIC_SINGLE_OBJECT = b"\xc3\x01"
MAGIC_CONFLUENT = b"\x00"
_LITTLE = sys.byteorder == "little"

# name → file, in dependency order (GroupBatch refers to Transition).
SCHEMA_FILES = {
    "rolloutbus.Span": "span.avsc",
    "rolloutbus.RolloutEvent": "rollout_event.avsc",
    "rolloutbus.Task": "task.avsc",
    "rolloutbus.Transition": "transition.avsc",
    "rolloutbus.GroupBatch": "group_batch.avsc",
    "rolloutbus.ResourceVersion": "resource_version.avsc",
    "rolloutbus.TrainStep": "train_step.avsc",
    "rolloutbus.DeadLetter": "dead_letter.avsc",
    "rolloutbus.Feedback": "feedback.avsc",
}
# Earlier writer versions that readers must still decode: file → record name.
HISTORY_FILES = {"span.v1.avsc": "rolloutbus.Span"}

_MODELS: dict[str, type[Record]] = {m.schema_name: m for m in RECORD_TYPES}

# Fields packed as bytes on the wire and lists in the models: (array typecode, Python type).
# Public: the stream worker's summaries and RowBinary rows pack the same fields the same way.
PACKED_FIELDS = _PACKED = {
    "prompt_token_ids": "I",
    "response_token_ids": "I",
    "response_logprobs": "f",
    "response_mask": "B",
}
assert array("I").itemsize == 4, "uint32 array typecode must be 4 bytes on this platform"


# --------------------------------------------------------------------------- CRC-64-AVRO


def crc64_avro(data: bytes) -> int:
    """The Rabin CRC-64 fingerprint the Avro spec defines for single-object encoding (fastavro's)."""
    return int.from_bytes(bytes.fromhex(fastavro_fingerprint(data.decode(), "CRC-64-AVRO")), "little")


def fingerprint(schema: Mapping[str, Any]) -> bytes:
    """The 8-byte little-endian fingerprint of a schema's parsing canonical form."""
    return bytes.fromhex(fastavro_fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


# --------------------------------------------------------------------------- schema registry (local)


def _expand(node: Any, named: dict[str, Any], seen: set[str]) -> Any:
    """Inline references to named types so every schema is self-contained (for its fingerprint)."""
    if isinstance(node, str):
        if node in named and node not in seen:
            seen.add(node)
            return _expand(named[node], named, seen)
        return node
    if isinstance(node, list):
        return [_expand(n, named, seen) for n in node]
    if isinstance(node, dict):
        out = dict(node)
        if out.get("type") in ("record", "enum", "fixed"):
            full = out["name"] if "." in out["name"] else f"{out.get('namespace', 'rolloutbus')}.{out['name']}"
            seen.add(full)
        for key in ("type", "items", "values", "fields"):
            if key in out:
                out[key] = _expand(out[key], named, seen)
        return out
    return node


class SchemaSet:
    """The parsed schemas, their fingerprints, and the older writer versions still readable."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR) -> None:
        raw: dict[str, Any] = {}
        self.schemas: dict[str, dict[str, Any]] = {}
        self.parsed: dict[str, Any] = {}
        self.write_parsed: dict[str, Any] = {}
        self.fingerprints: dict[str, bytes] = {}
        # fingerprint → (record name, parsed writer schema)
        self.writers: dict[bytes, tuple[str, Any]] = {}
        for name, file in SCHEMA_FILES.items():
            schema = json.loads((schema_dir / file).read_text())
            raw[name] = schema
            full = _expand(schema, raw, set())
            self._add_current(name, full)
        for file, name in HISTORY_FILES.items():
            path = schema_dir / "history" / file
            if path.exists():
                full = _expand(json.loads(path.read_text()), raw, set())
                self.writers[fingerprint(full)] = (name, fastavro.parse_schema(full))

    def _add_current(self, name: str, schema: dict[str, Any]) -> None:
        # Parsed with fastavro's hint: a schema parsed without it is parsed again on every read and
        # write (a small Span decodes in 8 µs with the hint, 35 µs without).
        parsed = fastavro.parse_schema(schema)
        fp = fingerprint(schema)
        self.schemas[name] = schema
        self.parsed[name] = parsed
        self.write_parsed[name] = parsed
        self.fingerprints[name] = fp
        self.writers[fp] = (name, parsed)

    def canonical(self, name: str) -> str:
        return to_parsing_canonical_form(self.schemas[name])


@lru_cache(maxsize=1)
def schema_set() -> SchemaSet:
    return SchemaSet()


# --------------------------------------------------------------------------- model ⇄ Avro dict


def _pack(code: str, values: Any) -> bytes:
    if _LITTLE and isinstance(values, array) and values.typecode == code:
        return values.tobytes()  # already packed in memory: a copy, not a conversion per item
    if code == "B" and isinstance(values, (list, bytes, bytearray)):
        return bytes(values)  # the same bytes as array("B", ...), a third of the time for a list
    arr = array(code, values)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def _unpack(code: str, data: bytes) -> list[Any]:
    return unpack_array(code, data).tolist()


def pack_array(code: str, values: Any) -> bytes:
    """A sequence (list or ``array``) → its packed little-endian items (the wire form)."""
    return _pack(code, values)


def pack_tokens(ids: list[int]) -> bytes:
    """Token ids → little-endian uint32 bytes (the wire form)."""
    return _pack("I", ids)


def unpack_array(code: str, data: bytes | memoryview) -> array:  # type: ignore[type-arg]
    """Packed little-endian items → an ``array`` over them (a copy, no Python object per item)."""
    arr = array(code)
    if len(data) % arr.itemsize:
        raise ValueError(f"packed field of {len(data)} bytes is not a whole number of {arr.itemsize}-byte items")
    arr.frombytes(data)
    if not _LITTLE:
        arr.byteswap()
    return arr


def unpack_tokens(data: bytes) -> list[int]:
    return _unpack("I", data)


def pack_floats(values: list[float]) -> bytes:
    return _pack("f", values)


def unpack_floats(data: bytes) -> list[float]:
    return _unpack("f", data)


def _packed_to_wire(d: dict[str, Any]) -> None:
    for key, code in _PACKED.items():
        if key in d and isinstance(d[key], (list, array)):
            d[key] = _pack(code, d[key])


def _wire_to_packed(d: dict[str, Any]) -> None:
    for key, code in _PACKED.items():
        if key in d and isinstance(d[key], (bytes, bytearray)):
            d[key] = _unpack(code, d[key])


def to_avro(record: Record) -> dict[str, Any]:
    """A model → the dict fastavro writes (lists of token ids packed to bytes)."""
    name = record.schema_name
    if name in ("rolloutbus.Transition", "rolloutbus.GroupBatch"):
        # Flat models of plain values (GroupBatch nests only Transitions): a shallow dict, no
        # model_dump copy of every token id; token sequences may be lists or arrays.
        d = dict(record)
        if name == "rolloutbus.GroupBatch":
            d["transitions"] = [dict(t) for t in d["transitions"]]
            for t in d["transitions"]:
                _packed_to_wire(t)
        else:
            _packed_to_wire(d)
        return d
    d = record.model_dump(mode="python")
    if name == "rolloutbus.Span" and d.get("llm"):
        _packed_to_wire(d["llm"])
    elif name == "rolloutbus.RolloutEvent":
        d["event"] = d["event"].value if hasattr(d["event"], "value") else d["event"]
    return d


def from_avro(name: str, d: dict[str, Any]) -> Record:
    """A dict fastavro read → the model, validated. Raises ValidationError with the field named."""
    try:
        if name == "rolloutbus.Span" and d.get("llm"):
            _wire_to_packed(d["llm"])
        elif name == "rolloutbus.Transition":
            _wire_to_packed(d)
        elif name == "rolloutbus.GroupBatch":
            for t in d["transitions"]:
                _wire_to_packed(t)
        return _MODELS[name].model_validate(d)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValidationError(f"{name.split('.')[-1]}.{where}: {first['msg']}") from exc
    except ValueError as exc:
        raise ValidationError(f"{name.split('.')[-1]}: {exc}") from exc


# --------------------------------------------------------------------------- bodies


def encode_body(name: str, avro_dict: Mapping[str, Any]) -> bytes:
    """Avro binary body of ``avro_dict`` with the current schema ``name`` (no header).

    A Span or a RolloutEvent is written by :mod:`schemas.span_avro` (fastavro's bytes, generated for
    its schema); fastavro writes every other record and any of those two that code finds unusual."""
    fast = span_avro.WRITERS.get(name)
    if fast is not None:
        try:
            return fast(avro_dict)  # type: ignore[arg-type]
        except span_avro.Unusual:
            pass
    buf = io.BytesIO()
    try:
        fastavro.schemaless_writer(buf, schema_set().write_parsed[name], avro_dict)
    except KeyError as exc:
        raise EncodeError(f"unknown record type {name!r}; known: {sorted(SCHEMA_FILES)}") from exc
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:  # an int over 64 bits: OverflowError
        raise EncodeError(f"{name} does not fit its schema: {type(exc).__name__}: {exc}") from exc
    return buf.getvalue()


def _read_body(data: bytes, offset: int, writer: Any, reader: Any | None, name: str) -> dict[str, Any]:
    fast = span_avro.READERS.get(name) if reader is None else None
    if fast is not None and writer is schema_set().parsed[name]:
        try:
            return fast(data, offset)  # fastavro's dict, generated for the current schema
        except span_avro.Unusual:
            pass  # fastavro reads it, or says what is wrong with it
    buf = io.BytesIO(data)
    buf.seek(offset)
    try:
        out = fastavro.schemaless_reader(buf, writer, reader)
    except (EOFError, StopIteration, IndexError) as exc:
        raise DecodeError(f"truncated {name}: the body ends before the record does ({len(data)} bytes)") from exc
    except (ValueError, TypeError, UnicodeDecodeError, OverflowError, KeyError, MemoryError) as exc:
        raise DecodeError(f"body is not a valid {name}: {type(exc).__name__}: {exc}") from exc
    if buf.tell() != len(data):
        raise DecodeError(
            f"{len(data) - buf.tell()} trailing bytes after a {name}: wrong record type or corrupted data"
        )
    if not isinstance(out, dict):
        raise DecodeError(f"body is not a valid {name}")
    return out


# --------------------------------------------------------------------------- single-object encoding


def encode_raw(name: str, avro_dict: Mapping[str, Any]) -> bytes:
    """Single-object encoding of an Avro dict (the hot path: no pydantic)."""
    header = _HEADERS.get(name)
    if header is None:
        header = _HEADERS[name] = MAGIC_SINGLE_OBJECT + schema_set().fingerprints[name]
    return header + encode_body(name, avro_dict)


_HEADERS: dict[str, bytes] = {}


def encode(record: Record) -> bytes:
    """Single-object encoding of a model."""
    return encode_raw(record.schema_name, to_avro(record))


def decode_raw(data: bytes, expect: str | tuple[str, ...] | None = None) -> tuple[str, dict[str, Any]]:
    """Single-object bytes → (record name, Avro dict) in the current schema's shape, unvalidated."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < 10:
        raise DecodeError(f"{len(data)} bytes is too short for an Avro single-object record (header is 10 bytes)")
    if data[:2] != MAGIC_SINGLE_OBJECT:
        if data[:1] == MAGIC_CONFLUENT:
            raise DecodeError("record is in Confluent wire format (magic 0x00); rolloutbus reads Avro single-object encoding (C3 01)")
        raise DecodeError(f"bad marker {data[:2].hex()}: not Avro single-object encoding (expected c301)")
    fp = data[2:10]
    ss = schema_set()
    try:
        name, writer = ss.writers[fp]
    except KeyError:
        raise DecodeError(f"unknown schema fingerprint {fp.hex()}: written with a schema this reader does not know") from None
    if expect is not None and name not in ((expect,) if isinstance(expect, str) else expect):
        raise DecodeError(f"expected {expect}, got a {name}")
    reader = None if writer is ss.parsed[name] else ss.parsed[name]
    return name, _read_body(data, 10, writer, reader, name)


def decode(data: bytes, expect: str | tuple[str, ...] | None = None) -> Record:
    """Single-object bytes → validated model. DecodeError or ValidationError on bad input."""
    name, d = decode_raw(data, expect)
    return from_avro(name, d)


# --------------------------------------------------------------------------- Confluent wire format


def encode_confluent(record: Record, schema_id: int) -> bytes:
    """Confluent wire format: 0x00, the registry's schema id (big-endian int32), the body."""
    return MAGIC_CONFLUENT + struct.pack(">I", schema_id) + encode_body(record.schema_name, to_avro(record))


def decode_confluent(data: bytes, lookup: Callable[[int], str]) -> Record:
    """Confluent wire bytes → model. ``lookup`` maps a schema id to our record name."""
    data = bytes(data)
    if len(data) < 5 or data[:1] != MAGIC_CONFLUENT:
        raise DecodeError("not Confluent wire format: expected magic byte 0x00 and a 4-byte schema id")
    (schema_id,) = struct.unpack(">I", data[1:5])
    try:
        name = lookup(schema_id)
    except KeyError:
        raise DecodeError(f"unknown schema id {schema_id} in the schema registry") from None
    ss = schema_set()
    if name not in ss.parsed:
        raise DecodeError(f"schema id {schema_id} names {name!r}, not one of our records")
    return from_avro(name, _read_body(data, 5, ss.parsed[name], None, name))


__all__ = [
    "SchemaSet",
    "schema_set",
    "fingerprint",
    "crc64_avro",
    "encode",
    "decode",
    "encode_raw",
    "decode_raw",
    "encode_body",
    "encode_confluent",
    "decode_confluent",
    "to_avro",
    "from_avro",
    "pack_tokens",
    "unpack_array",
    "pack_array",
    "PACKED_FIELDS",
    "unpack_tokens",
    "pack_floats",
    "unpack_floats",
]
