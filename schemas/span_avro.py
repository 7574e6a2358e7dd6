"""The Avro bodies of rb.spans's two records, ``rolloutbus.Span`` and ``rolloutbus.RolloutEvent``,
written and read by straight-line code generated from their schemas.

fastavro interprets the parsed schema for every field of every record (dict lookups per field and
per union branch): about 12 µs to write or read one small span on this project's machines. These
two records are on every hot path (the SDK's transport, the gateway, the span stage), so this module
turns ``schemas/avro/span.avsc`` and ``rollout_event.avsc`` into plain Python functions at import,
one statement per field with the common case inline (a string shorter than 64 bytes is one byte of
length), at a fraction of that cost.

They cover well-formed values only. A value of an unexpected type, a missing field, malformed or
unusual bytes (a negative block count, a varint longer than it needs) raise :class:`Unusual`, and
the caller (:mod:`schemas.codec`) does the record again with fastavro, whose result or error is the
answer. So the bytes, the dicts and the errors are fastavro's; ``tests/unit/schemas/test_span_avro.py``
compares the two on random and hostile input. A schema using a type this generator does not know
fails at import rather than being encoded wrongly.

Where the compiled extension (``native/``) is installed, a Span is written by its compiled twin of
``write_span`` (same bytes, ``Unusual`` in the same cases; ``tests/unit/schemas/test_span_avro.py``
compares the two); ``write_span`` stays the reference and the writer on machines without it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["READERS", "WRITERS", "Unusual", "read_span", "write_span", "write_span_compiled", "generated_source"]

SPAN_SCHEMA = Path(__file__).parent / "avro" / "span.avsc"
EVENT_SCHEMA = Path(__file__).parent / "avro" / "rollout_event.avsc"


class Unusual(Exception):
    """Not the common shape: let fastavro do this record (it gives the answer or the error)."""


# --------------------------------------------------------------------------- helpers the generated code calls

_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
# zig-zag varints of the non-negative lengths and counts below 8192 (one or two bytes), precomputed
_SMALL = [bytes((n << 1,)) if n < 64 else bytes((((n << 1) & 0x7F) | 0x80, (n << 1) >> 7)) for n in range(8192)]


# 14 bits → their two varint bytes, both with the continuation bit; one byte → itself
_PAIR = [bytes(((c & 0x7F) | 0x80, ((c >> 7) & 0x7F) | 0x80)) for c in range(16384)]
_BYTE = [bytes((c,)) for c in range(256)]


def _long(n: int) -> bytes:
    """The zig-zag varint of ``n`` (an int64), 14 bits per table look-up."""
    if 0 <= n < 8192:
        return _SMALL[n]
    if n < _LONG_MIN or n > _LONG_MAX:
        raise Unusual
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    p = _PAIR
    if (1 << 56) <= z < (1 << 63):  # nine bytes: a nanosecond timestamp
        return p[z & 0x3FFF] + p[z >> 14 & 0x3FFF] + p[z >> 28 & 0x3FFF] + p[z >> 42 & 0x3FFF] + _BYTE[z >> 56]
    out = b""
    while z >= 0x4000:
        out += p[z & 0x3FFF]
        z >>= 14
    if z >= 0x80:
        return out + _BYTE[(z & 0x7F) | 0x80] + _BYTE[z >> 7]
    return out + _BYTE[z]


_NINE = struct.Struct("<HHHHB").unpack_from
# two varint bytes that both continue → their 14 bits; -1 when either ends (about 1 MB)
_BITS14 = [((h & 0x7F) | ((h >> 8 & 0x7F) << 7)) if h & 0x8080 == 0x8080 else -1 for h in range(65536)]


def _long_at(data: bytes, pos: int) -> tuple[int, int]:
    """(the varint at ``pos``, the position after it); only the shortest form, at most 10 bytes."""
    if pos + 9 <= len(data):  # nine bytes, the last not zero: a nanosecond timestamp, two bytes per look-up
        a, b, c, d, e = _NINE(data, pos)
        if 0 < e < 0x80:
            t = _BITS14
            a, b, c, d = t[a], t[b], t[c], t[d]
            if a >= 0 and b >= 0 and c >= 0 and d >= 0:
                z = a | b << 14 | c << 28 | d << 42 | e << 56
                return (z >> 1) ^ -(z & 1), pos + 9
    z = shift = 0
    while True:
        b = data[pos]  # IndexError past the end: the caller turns it into Unusual
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise Unusual
    if z > 0xFFFFFFFFFFFFFFFF or (b == 0 and shift):
        raise Unusual  # over 64 bits, or padded with a zero byte (fastavro decides those)
    return (z >> 1) ^ -(z & 1), pos


_D_PACK = struct.Struct("<d").pack
_D_UNPACK = struct.Struct("<d").unpack_from


# --------------------------------------------------------------------------- the generator


class _Gen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0

    def var(self, stem: str) -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def emit(self, depth: int, *lines: str) -> None:
        self.lines.extend("    " * depth + ln for ln in lines)


def _shape(t: Any) -> str:
    """What the generator makes of a schema type; anything else is refused."""
    if t in ("string", "long", "int", "bytes", "double", "boolean"):
        return t
    if isinstance(t, list):
        if len(t) == 2 and t[0] == "null" and t[1] != "null":
            return "nullable"
    elif isinstance(t, dict):
        if t.get("type") == "map":
            return "map"
        if t.get("type") == "array":
            return "array"
        if t.get("type") == "record":
            return "record"
        if t.get("type") == "enum":
            return "enum"
    raise RuntimeError(f"schemas/span_avro.py cannot generate code for the Avro type {json.dumps(t)[:200]}")


def _read(g: _Gen, t: Any, out: str, d: int) -> None:
    """Statements reading one value of type ``t`` at ``pos`` into the variable ``out``."""
    shape = _shape(t)
    if shape == "long":
        g.emit(d, "b = data[pos]", "if b < 0x80:", f"    {out} = (b >> 1) ^ -(b & 1); pos += 1",
               "else:", f"    {out}, pos = _long_at(data, pos)")
    elif shape in ("string", "bytes"):
        g.emit(d, "b = data[pos]", "if b < 0x80 and not b & 1:", "    e = pos + 1 + (b >> 1); pos += 1", "else:",
               "    n, pos = _long_at(data, pos)", "    if n < 0:", "        raise Unusual", "    e = pos + n",
               "if e > end:", "    raise Unusual",
               f"{out} = data[pos:e].decode(); pos = e" if shape == "string" else f"{out} = data[pos:e]; pos = e")
    elif shape == "int":
        _read(g, "long", out, d)
        g.emit(d, f"if not -2147483648 <= {out} <= 2147483647:", "    raise Unusual")
    elif shape == "enum":
        idx = g.var("i")
        _read(g, "long", idx, d)
        g.emit(d, f"if not 0 <= {idx} < {len(t['symbols'])}:", "    raise Unusual", f"{out} = {tuple(t['symbols'])!r}[{idx}]")
    elif shape == "double":
        g.emit(d, f"{out} = _D_UNPACK(data, pos)[0]; pos += 8")
    elif shape == "boolean":
        g.emit(d, "b = data[pos]", "if b > 1:", "    raise Unusual", f"{out} = b == 1; pos += 1")
    elif shape == "nullable":
        g.emit(d, "b = data[pos]; pos += 1", "if b == 0:", f"    {out} = None", "elif b == 2:")
        _read(g, t[1], out, d + 1)
        g.emit(d, "else:", "    raise Unusual")
    elif shape in ("map", "array"):
        count, key, item = g.var("c"), g.var("k"), g.var("v")
        g.emit(d, f"{out} = {{}}" if shape == "map" else f"{out} = []")
        _read(g, "long", count, d)
        g.emit(d, f"while {count}:", f"    if {count} < 0:", "        raise Unusual", f"    for _ in range({count}):")
        if shape == "map":
            _read(g, "string", key, d + 2)
        _read(g, t["values"] if shape == "map" else t["items"], item, d + 2)
        g.emit(d + 2, f"{out}[{key}] = {item}" if shape == "map" else f"{out}.append({item})")
        _read(g, "long", count, d + 1)
    else:  # record
        names = []
        for f in t["fields"]:
            v = g.var("f")
            _read(g, f["type"], v, d)
            names.append(f"{json.dumps(f['name'])}: {v}")
        g.emit(d, f"{out} = {{{', '.join(names)}}}")


def _write(g: _Gen, t: Any, val: str, d: int) -> None:
    """Statements appending the encoding of the value ``val`` of type ``t`` to ``out``."""
    shape = _shape(t)
    if shape == "long":
        g.emit(d, f"if type({val}) is not int:", "    raise Unusual",
               f"out += _SMALL[{val}] if 0 <= {val} < 8192 else _long({val})")
    elif shape in ("string", "bytes"):
        b = g.var("b")
        if shape == "string":
            g.emit(d, f"if type({val}) is not str:", "    raise Unusual", f"{b} = {val}.encode()")
        else:
            g.emit(d, f"if type({val}) is not bytes:", "    raise Unusual", f"{b} = {val}")
        g.emit(d, f"n = len({b})", "out += _SMALL[n] if n < 8192 else _long(n)", f"out += {b}")
    elif shape == "int":
        g.emit(d, f"if type({val}) is not int or not -2147483648 <= {val} <= 2147483647:", "    raise Unusual",
               f"out += _SMALL[{val}] if 0 <= {val} < 8192 else _long({val})")
    elif shape == "enum":
        index = {sym: i for i, sym in enumerate(t["symbols"])}
        g.emit(d, f"if type({val}) is not str:", "    raise Unusual", f"out += _SMALL[{index!r}[{val}]]")
    elif shape == "double":
        g.emit(d, f"if type({val}) is not float:", "    raise Unusual", f"out += _D_PACK({val})")
    elif shape == "boolean":
        g.emit(d, f"if type({val}) is not bool:", "    raise Unusual", f"out.append({val})")
    elif shape == "nullable":
        g.emit(d, f"if {val} is None:", "    out.append(0)", "else:", "    out.append(2)")
        _write(g, t[1], val, d + 1)
    elif shape in ("map", "array"):
        key, item = g.var("k"), g.var("v")
        g.emit(d, f"if type({val}) is not {'dict' if shape == 'map' else 'list'}:", "    raise Unusual",
               f"if {val}:", f"    out += _long(len({val}))")
        if shape == "map":
            g.emit(d + 1, f"for {key}, {item} in {val}.items():")
            _write(g, "string", key, d + 2)
            _write(g, t["values"], item, d + 2)
        else:
            g.emit(d + 1, f"for {item} in {val}:")
            _write(g, t["items"], item, d + 2)
        g.emit(d, "out.append(0)")
    else:  # record
        g.emit(d, f"if type({val}) is not dict:", "    raise Unusual")
        for f in t["fields"]:
            v = g.var("f")
            g.emit(d, f"{v} = {val}[{json.dumps(f['name'])}]")
            _write(g, f["type"], v, d)


def generated_source(schema: dict[str, Any], stem: str = "span") -> str:
    """The Python source of ``read_<stem>`` and ``write_<stem>`` for ``schema`` (shown by the tests)."""
    g = _Gen()
    g.emit(0, f"def read_{stem}(data, pos):", "    end = len(data)", "    try:")
    _read(g, schema, "rec", 2)
    g.emit(0, "    except (IndexError, UnicodeDecodeError, struct.error, RecursionError) as exc:",
           "        raise Unusual from exc", "    if pos != end:", "        raise Unusual", "    return rec", "",
           f"def write_{stem}(rec):", "    out = bytearray()", "    try:")
    _write(g, schema, "rec", 2)
    g.emit(0, "    except (KeyError, TypeError, UnicodeEncodeError) as exc:", "        raise Unusual from exc",
           "    return bytes(out)")
    return "\n".join(g.lines) + "\n"


def _compile(path: Path, stem: str) -> tuple[Callable[[bytes, int], dict[str, Any]], Callable[[dict[str, Any]], bytes]]:
    # Named types are written inline in these two schemas (SpanEvent, LLMCall, ...), no references.
    source = generated_source(json.loads(path.read_text()), stem)
    scope: dict[str, Any] = {"Unusual": Unusual, "_SMALL": _SMALL, "_long": _long, "_long_at": _long_at,
                             "_D_PACK": _D_PACK, "_D_UNPACK": _D_UNPACK, "struct": struct}
    exec(compile(source, f"<schemas.span_avro: generated from {path.name}>", "exec"), scope)  # noqa: S102 - our own schema
    read, write = scope[f"read_{stem}"], scope[f"write_{stem}"]
    read.__doc__ = f"The dict of the {path.name} body at ``data[pos:]``, which it must fill exactly; :class:`Unusual` otherwise."
    write.__doc__ = f"The Avro body (no header) of one {path.name} dict; :class:`Unusual` for anything uncommon."
    return read, write


def _compiled_span_writer() -> Callable[[dict[str, Any]], bytes] | None:
    """``write_span`` compiled (``native/``, ``rolloutbus_native.write_span``): the same bytes, and
    :class:`Unusual` exactly where the generated writer raises it; ``None`` where it is not installed
    or was built for another ``span.avsc`` (then the generated writer writes)."""
    try:
        import rolloutbus_native
    except ImportError:
        return None
    from fastavro.schema import fingerprint, to_parsing_canonical_form

    schema = json.loads(SPAN_SCHEMA.read_text())  # named types inline: its canonical form is the codec's
    if rolloutbus_native.SPAN_FINGERPRINT != bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO")):
        return None
    native = rolloutbus_native.write_span

    def write_span_compiled(rec: dict[str, Any]) -> bytes:
        out: bytes | None = native(rec)
        if out is None:
            raise Unusual
        return out

    return write_span_compiled


read_span, write_span = _compile(SPAN_SCHEMA, "span")
read_event, write_event = _compile(EVENT_SCHEMA, "event")
write_span_compiled = _compiled_span_writer()
# record name → reader / writer (schemas.codec uses them for the current writer schema only); the
# compiled Span writer when installed, the generated one otherwise (and as the tests' reference)
READERS = {"rolloutbus.Span": read_span, "rolloutbus.RolloutEvent": read_event}
WRITERS = {"rolloutbus.Span": write_span_compiled or write_span, "rolloutbus.RolloutEvent": write_event}
