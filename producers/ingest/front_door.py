"""The gateway's front door: what every HTTP route does before its own work, written once.

* **the token**: ``Authorization`` as Bearer, or as a Basic password (:func:`producers.ingest.auth.authorized`);
  without it 401 with the challenge naming both forms (:meth:`FrontDoor.refused`);
* **the body**: its Content-Encoding decoded strictly (:func:`inflate`: gzip, deflate; 415 for another) by
  :meth:`FrontDoor.middleware` before any route reads it, and only for a caller with the token; at most
  ``max_body_bytes`` (413 by its Content-Length, while it is read, and once inflated); a body the client
  breaks off is 400 with one line (:meth:`FrontDoor.body`);
* **JSON**: a body that is not JSON is 400 with one line, one nested beyond Python's recursion limit 400
  (:data:`TOO_DEEP`), never 500 (:func:`parse_json`, and the middleware for what a route parses itself);
* **the shape of a refusal**: Agent Lightning's routes answer ``{"detail": reason}`` as its FastAPI servers
  do, the OTLP route plain text (:meth:`FrontDoor.refuse`);
* **503 with Retry-After** when the span transport cannot keep what a route hands it (:meth:`FrontDoor.deliver`).

The refusals' exceptions and words are :mod:`producers.ingest.errors`' (re-exported here), so what decodes a
body raises them without importing the HTTP server.

The gateway (:mod:`producers.ingest.gateway`) and Agent Lightning's routes (:mod:`producers.ingest.agl`)
each hold one :class:`FrontDoor`. The LLM proxy keeps its own (:mod:`producers.ingest.llm_proxy`): it
takes Bearer only, answers in OpenAI's error shape and refuses a compressed body rather than inflating it.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from producers.ingest.auth import CHALLENGE, REFUSED, authorized
from producers.ingest.errors import TOO_DEEP, BadRequest, BodyTooLarge, TooDeep, UnsupportedEncoding, one_line
from producers.spool import FRAME_OVERHEAD
from producers.transport import SpanTransport

SPOOL_FULL = "Kafka is unreachable and the local spool is full; retry later"
QUEUE_FULL = "the local queue is full; retry later"
# Agent Lightning's routes: their refusals are FastAPI's {"detail": ...}.
DETAIL_PATHS = ("/v1/agl/", "/api/")

# The front door decodes Content-Encoding itself (:func:`inflate`): aiohttp's own decoding takes a truncated
# gzip body without a word, and spans cut off with it would be lost with a 200. Serve an application with
# the middleware with these options (``web.run_app(app, **SERVER_OPTIONS)``).
SERVER_OPTIONS: dict[str, Any] = {"auto_decompress": False}
ENCODINGS = ("gzip", "x-gzip", "deflate")


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A body as sent with ``Content-Encoding: encoding`` → its bytes, at most ``limit`` of them.

    Strict: a body that is not that encoding, is cut short or has bytes after its end raises
    :class:`BadRequest`; over ``limit`` :class:`BodyTooLarge`; an encoding other than gzip, deflate or
    identity :class:`UnsupportedEncoding`. Several gzip members are read one after another (RFC 1952)."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ENCODINGS:
        raise UnsupportedEncoding(f"unsupported Content-Encoding {encoding[:40]!r}: use gzip, deflate or none")
    if enc == "deflate":
        wbits = zlib.MAX_WBITS if body[:1] and body[0] & 0x0F == 8 else -zlib.MAX_WBITS  # zlib, or bare deflate as some send
    elif body[:2] != b"\x1f\x8b":
        raise BadRequest(f"Content-Encoding is {enc} but the body is not {enc}")
    else:
        wbits = 16 + zlib.MAX_WBITS
    out = bytearray()
    rest = body
    try:
        while rest:
            d = zlib.decompressobj(wbits)
            out += d.decompress(rest, limit + 1 - len(out))
            if len(out) > limit:
                raise BodyTooLarge(f"decompressed body is over the limit of {limit} bytes")
            if not d.eof:
                raise BadRequest(f"the {enc} body is cut short (its end is missing)")
            rest = d.unused_data
            if rest and enc == "deflate":
                raise BadRequest(f"{len(rest)} bytes after the end of the deflate body")
    except zlib.error as exc:
        raise BadRequest(f"body is not valid {enc}: {exc}") from exc
    return bytes(out)


def parse_json(raw: bytes, *, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``raw`` as JSON; :class:`BadRequest` with one line for bytes that are not JSON or nest too deeply."""
    try:
        return json.loads(raw, parse_constant=parse_constant)
    except RecursionError:
        raise TooDeep from None
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {one_line(exc)}") from exc


def not_a_json_constant(constant: str) -> Any:
    """``parse_constant`` that refuses NaN and Infinity: not JSON, no strict reader takes them back."""
    raise ValueError(f"{constant} is not a JSON value (use null or a number)")


def error_response(status: int, reason: str, headers: dict[str, str] | None = None, *, detail: bool) -> web.Response:
    """A refusal in a route's shape: ``{"detail": reason}`` (Agent Lightning's routes), else plain text."""
    if detail:
        return web.json_response({"detail": reason}, status=status, headers=headers)
    return web.Response(status=status, text=reason, headers=headers)


def _uncounted(_n: int) -> None:
    return None


@dataclass(frozen=True)
class Counts:
    """What the routes that take spans count (the gateway's Prometheus counters): answers by HTTP status,
    spans accepted onto rb.spans, spans rejected. Nothing by default."""

    answered: Callable[[int], None] = _uncounted
    accepted: Callable[[int], None] = _uncounted
    rejected: Callable[[int], None] = _uncounted


class FrontDoor:
    """The checks of one family of routes: its token, body limit, Retry-After and refusal shape.

    ``detail``: refusals as ``{"detail": ...}``; ``counts``: every refusal this door answers is counted
    by its status."""

    def __init__(self, *, token: str | None, max_body_bytes: int, retry_after_s: int = 5, detail: bool = False,
                 counts: Counts = Counts()) -> None:
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.retry_after_s = retry_after_s
        self.detail = detail
        self.counts = counts

    def refuse(self, status: int, reason: str, headers: dict[str, str] | None = None, *,
               detail: bool | None = None) -> web.Response:
        """The refusal in this door's shape (or ``detail``'s), counted."""
        self.counts.answered(status)
        return error_response(status, reason, headers, detail=self.detail if detail is None else detail)

    def refused(self, request: web.Request) -> web.Response | None:
        """The 401 for a request without the token; None when it may go on (or no token is set)."""
        if self.token is not None and not authorized(request.headers.get("Authorization", ""), self.token):
            return self.refuse(401, REFUSED, CHALLENGE)
        return None

    def busy(self, reason: str = SPOOL_FULL, retry_after_s: int | None = None) -> web.Response:
        """503 with Retry-After: what cannot be kept now may be sent again later."""
        return self.refuse(503, reason, {"Retry-After": str(self.retry_after_s if retry_after_s is None else retry_after_s)})

    async def body(self, request: web.Request) -> bytes:
        """The body (decoded by :meth:`middleware`); :class:`BadRequest` (413 over the limit, 400 broken off).

        Over the limit by its Content-Length, or while a body sent without one (chunked) is read: then the
        :class:`BodyTooLarge`'s ``__cause__`` is aiohttp's own 413, which 0.3's routes let through as they
        always did."""
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise BodyTooLarge(f"body of {request.content_length} bytes is over the limit of {self.max_body_bytes}")
        return await self._read(request)

    async def _read(self, request: web.Request) -> bytes:
        """The body as read, at most aiohttp's ``client_max_size``; :class:`BadRequest` as :meth:`body`."""
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise BodyTooLarge(f"body is over the limit of {self.max_body_bytes} bytes") from exc
        except RequestPayloadError as exc:
            raise BadRequest(f"body cannot be read: {one_line(exc)}") from exc

    async def json(self, request: web.Request) -> Any:
        """The body as JSON, None for an empty one; :class:`BadRequest` as :meth:`body` and :func:`parse_json`."""
        raw = await self.body(request)
        return parse_json(raw) if raw else None

    def deliver(self, transport: SpanTransport, records: Sequence[tuple[bytes, bytes]]) -> web.Response | None:
        """Hand (key, value) records to the transport, all or none; the 503 answer when it cannot keep them."""
        if not transport.accepting(sum(len(k) + len(v) + FRAME_OVERHEAD for k, v in records)):
            return self.busy()
        for key, value in records:
            if not transport.emit_encoded(key, value):
                return self.busy(QUEUE_FULL)
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """For every route of the application: the body's Content-Encoding decoded (strictly, see
        :func:`inflate`) before the handler reads it, and only for a caller with the token; JSON nested beyond
        Python's recursion limit answered 400 with the reason, never 500. Refusals here take the shape of the
        path's family (``{"detail": ...}`` under :data:`DETAIL_PATHS`)."""
        def refuse(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
            return self.refuse(status, reason, headers, detail=request.path.startswith(DETAIL_PATHS))

        try:
            given = request.headers.get("Authorization", "").encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 (aiohttp keeps them as surrogates): no token of ours
            return refuse(401, REFUSED, CHALLENGE)
        encoding = request.headers.get("Content-Encoding", "")
        if encoding.strip().lower() not in ("", "identity") and request.body_exists:
            # Every route that takes a body needs the token: without it, nothing is decompressed for the caller.
            if self.token is not None and not authorized(given, self.token):
                return refuse(401, REFUSED, CHALLENGE)
            try:
                # What request.read() answers from now on: every handler reads the decoded body.
                # Read as sent, its length unasked: over the limit, it is refused in the words it always was.
                request._read_bytes = inflate(await self._read(request), encoding, self.max_body_bytes)
            except BadRequest as exc:
                return refuse(exc.status, str(exc))
        try:
            return await handler(request)
        except (RecursionError, TooDeep):  # a route that parses its own JSON, or lets :class:`TooDeep` through
            return refuse(400, TOO_DEEP)


def guarded(door: str = "door") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The one guard of every route handler (a method of an object whose attribute ``door`` is its
    :class:`FrontDoor`): a caller without the token is answered 401 before the handler runs, and a
    :class:`~foundation.errors.KafkaUnavailable` the handler lets out is 503 with Retry-After (``<why>; retry
    later``). What a handler answers in its own API's words (a 400 or 422) it still answers itself."""
    from foundation.errors import KafkaUnavailable

    def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(handler)
        async def route(self: Any, request: web.Request) -> web.StreamResponse:
            front: FrontDoor = getattr(self, door)
            if (refused := front.refused(request)) is not None:
                return refused
            try:
                return await handler(self, request)  # type: ignore[no-any-return]
            except KafkaUnavailable as exc:
                return front.busy(f"{exc}; retry later")

        return route

    return wrap


__all__ = ["FrontDoor", "guarded", "Counts", "BadRequest", "BodyTooLarge", "UnsupportedEncoding", "TooDeep", "inflate", "parse_json", "error_response",
           "one_line", "not_a_json_constant", "SERVER_OPTIONS", "TOO_DEEP", "SPOOL_FULL", "QUEUE_FULL"]
