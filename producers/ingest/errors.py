"""What the ingest service refuses a body for: the exceptions its routes answer with a status, and their words.

No HTTP server here (aiohttp is :mod:`producers.ingest.front_door`'s, which re-exports these), so what decodes
a body (:mod:`producers.ingest.otlp_decoding`) raises them without importing the server.
"""

from __future__ import annotations

TOO_DEEP = "body is nested too deeply: JSON arrays and objects may nest a few hundred levels at most"


class BadRequest(ValueError):
    """A body the routes cannot use (400); its message is the one line the client gets."""

    status = 400


class BodyTooLarge(BadRequest):
    """The body, as sent or decompressed, is over the limit."""

    status = 413


class UnsupportedEncoding(BadRequest):
    """A Content-Encoding the front door does not decode."""

    status = 415


class TooDeep(BadRequest):
    """JSON nested beyond Python's recursion limit: 400 :data:`TOO_DEEP` from whichever route meets it."""

    def __init__(self) -> None:
        super().__init__(TOO_DEEP)


def one_line(exc: BaseException, limit: int = 500) -> str:
    """An exception's message on one line, at most ``limit`` characters."""
    return " ".join(str(exc).split())[:limit]


__all__ = ["BadRequest", "BodyTooLarge", "UnsupportedEncoding", "TooDeep", "TOO_DEEP", "one_line"]
