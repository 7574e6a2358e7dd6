"""ClickHouse's HTTP interface, the parts that are plain functions: where an insert's data starts,
which HTTP status an error code gets, the error body, content codings. No socket and no engine here.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass

VERSION_SUFFIX = "(version {version})"

# Settings and parameters the HTTP layer consumes itself; they never reach the engine.
TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "user", "password", "quota_key", "query_id", "session_id",
    "session_timeout", "session_check", "compress", "decompress", "buffer_size", "wait_end_of_query",
    "client_protocol_version", "role", "enable_http_compression", "http_zlib_compression_level",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms", "cancel_http_readonly_queries_on_client_close",
    "http_native_compression_disable_checksumming_on_decompress", "add_http_cors_header", "output_format_enable_streaming",
    "http_response_buffer_size", "http_wait_end_of_query", "max_query_size_http",
})


@dataclass(frozen=True)
class InsertWithData:
    """An ``INSERT ... FORMAT f`` statement and the bytes that follow it."""

    head: str  # the statement up to (without) FORMAT
    fmt: str
    data: bytes | memoryview


_INSERT_HEAD = re.compile(rb"^\s*(?:--[^\n]*\n\s*|/\*.*?\*/\s*)*INSERT\s+INTO\b", re.IGNORECASE | re.DOTALL)
_FORMAT = re.compile(rb"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)[ \t]*(?:\r?\n)?", re.IGNORECASE)
_SELECT_INSERT = re.compile(rb"\b(SELECT|VALUES|WITH)\b", re.IGNORECASE)


def split_insert(statement: bytes, data: bytes | None = None) -> InsertWithData | None:
    """An INSERT whose data follows ``FORMAT <name>`` (in the same bytes, or ``data`` when the statement
    came as the ``query`` parameter), or None for every other statement (``INSERT ... VALUES`` and
    ``INSERT ... SELECT`` included, which run as plain SQL).

    As on a server, the data starts after the format name, the spaces after it and one line break.
    Only the first 64 KiB are searched for the statement, so binary data is never mistaken for SQL.
    """
    window = statement[:65536]
    if not _INSERT_HEAD.match(window):
        return None
    match = _FORMAT.search(window)
    if match is None:
        return None
    head = window[: match.start()]
    if _SELECT_INSERT.search(head):
        return None
    rest = memoryview(statement)[match.end():]
    if data is not None:
        rest = memoryview(bytes(rest) + data) if len(rest) else memoryview(data)
    return InsertWithData(head.decode().strip(), match.group(1).decode(), rest)


_TRAILING_FORMAT = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*;?\s*$", re.IGNORECASE)
_READS = re.compile(r"^\s*(?:\(\s*)*(SELECT|WITH|SHOW|DESC|DESCRIBE|EXISTS|EXPLAIN|CHECK)\b", re.IGNORECASE)


def output_format(sql: str, default: str) -> str:
    """The format the response body is in: an explicit ``FORMAT`` at the end, else the default."""
    match = _TRAILING_FORMAT.search(sql)
    return match.group(1) if match else default


def is_read(sql: str) -> bool:
    """Whether the statement produces a result set (so the response names its format)."""
    return bool(_READS.match(sql)) or bool(_TRAILING_FORMAT.search(sql))


# HTTP status per ClickHouse error code, as the server's HTTP handler maps them.
_STATUS = {
    194: 401,  # REQUIRED_PASSWORD
    516: 403, 192: 403, 193: 403, 497: 403, 164: 403, 495: 403,  # AUTHENTICATION_FAILED, UNKNOWN_USER, WRONG_PASSWORD, ACCESS_DENIED, READONLY
    62: 400, 27: 400, 26: 400, 6: 400, 38: 400, 69: 400, 72: 400, 41: 400, 457: 400, 456: 400, 33: 400,
    73: 400, 36: 400, 43: 400, 44: 400, 47: 400, 53: 400, 70: 400,  # syntax, parse, bad arguments, unknown format
    60: 404, 81: 404, 46: 404, 115: 404, 50: 404, 56: 404, 57: 404, 16: 404, 79: 404,  # UNKNOWN_TABLE/DATABASE/FUNCTION/SETTING, ...
    101: 400,  # UNEXPECTED_PACKET_FROM_CLIENT
    306: 400, 718: 400, 167: 400, 168: 400, 117: 400, 42: 400, 80: 400, 321: 400, 25: 400, 32: 400,  # too deep/big, bad data, arguments
    381: 411,  # HTTP_LENGTH_REQUIRED
    48: 501, 1: 501,  # NOT_IMPLEMENTED, UNSUPPORTED_METHOD
    209: 503, 210: 503, 76: 503,  # SOCKET_TIMEOUT, NETWORK_ERROR, CANNOT_OPEN_FILE
    202: 503,  # TOO_MANY_SIMULTANEOUS_QUERIES
}


def http_status(code: int) -> int:
    return _STATUS.get(code, 500)


_CODE = re.compile(r"Code:\s*(\d+)")
_NAME = re.compile(r"\(([A-Z][A-Z0-9_]+)\)\s*(?:\(version [^)]*\))?\s*\.?\s*$")


def parse_engine_error(message: str) -> tuple[int, str, str]:
    """(code, NAME, text) from an engine exception's message, ``Code: N. DB::Exception: ... (NAME)``."""
    message = message.strip()
    start = message.find("Code: ")
    if start > 0:
        message = message[start:]
    code_m = _CODE.search(message)
    code = int(code_m.group(1)) if code_m else 1001
    name_m = _NAME.search(message.splitlines()[0] if message else "")
    name = name_m.group(1) if name_m else ("STD_EXCEPTION" if code == 1001 else "")
    return code, name, message


def error_body(code: int, name: str, message: str, version: str) -> bytes:
    """ClickHouse's error text: ``Code: N. DB::Exception: message. (NAME) (version V)``."""
    if message.startswith("Code: "):
        text = message
        if "(version " not in text.splitlines()[0]:
            text = f"{text.rstrip()} (version {version})"
    else:
        text = f"Code: {code}. DB::Exception: {message.rstrip('.')}. ({name}) (version {version})"
    return (text.rstrip() + "\n").encode()


# --------------------------------------------------------------------------- content codings

def _lz4():
    import lz4.frame

    return lz4.frame


def _zstd():
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14+
    except ImportError:
        from backports import zstd  # type: ignore[import-not-found,no-redef]
    return zstd


SUPPORTED_ENCODINGS = ("lz4", "zstd", "gzip", "deflate")


def decode_body(data: bytes, encoding: str | None) -> bytes:
    """Undo a request's Content-Encoding. Concatenated frames (one per chunk) decode to their concatenation."""
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return data
    if encoding == "lz4":
        frame = _lz4()
        out, view = [], memoryview(data)
        while len(view):
            dec = frame.LZ4FrameDecompressor()
            out.append(dec.decompress(view))
            if not dec.eof:
                raise ValueError("truncated lz4 frame")
            used = len(view) - len(dec.unused_data or b"")
            view = view[used:]
        return b"".join(out)
    if encoding == "zstd":
        return _zstd().decompress(data)
    if encoding in ("gzip", "x-gzip"):
        return gzip.decompress(data)
    if encoding == "deflate":
        return zlib.decompress(data)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}: use one of {', '.join(SUPPORTED_ENCODINGS)}")


def pick_encoding(accept: str | None) -> str | None:
    """The first coding of ``Accept-Encoding`` the store can write, in the client's order."""
    for part in (accept or "").split(","):
        name = part.split(";")[0].strip().lower()
        if name in SUPPORTED_ENCODINGS:
            return name
    return None


def encode_body(data: bytes, encoding: str) -> bytes:
    if encoding == "lz4":
        return _lz4().compress(data)
    if encoding == "zstd":
        return _zstd().compress(data)
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=3)
    if encoding == "deflate":
        return zlib.compress(data, 3)
    raise ValueError(encoding)


CONTENT_TYPES = {
    "TabSeparated": "text/tab-separated-values; charset=UTF-8",
    "TSV": "text/tab-separated-values; charset=UTF-8",
    "TabSeparatedWithNames": "text/tab-separated-values; charset=UTF-8",
    "TSVWithNames": "text/tab-separated-values; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8; header=absent",
    "CSVWithNames": "text/csv; charset=UTF-8; header=present",
    "JSON": "application/json; charset=UTF-8",
    "JSONCompact": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8",
    "Pretty": "text/plain; charset=UTF-8",
    "PrettyCompact": "text/plain; charset=UTF-8",
}


def content_type(fmt: str) -> str:
    return CONTENT_TYPES.get(fmt, "application/octet-stream" if fmt in ("Native", "RowBinary", "RowBinaryWithNamesAndTypes", "Parquet", "Arrow", "ArrowStream") else "text/plain; charset=UTF-8")


__all__ = ["InsertWithData", "split_insert", "output_format", "is_read", "http_status",
           "parse_engine_error", "error_body", "decode_body", "pick_encoding", "encode_body", "content_type",
           "TRANSPORT_PARAMS", "SUPPORTED_ENCODINGS"]
