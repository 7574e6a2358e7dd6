"""The store process: the embedded ClickHouse engine (chDB) behind ClickHouse's HTTP interface.

One process owns the engine's data directory; every other process (stream workers, trainer, an
analyst's notebook, ``curl``) talks to it over HTTP exactly as it would to a ClickHouse server.
Each request runs on its own engine session (a fresh chDB connection to the one engine), so its
database, settings and ``readonly`` cannot leak into another request, and requests run side by side
on a thread each (the engine releases the GIL while it works).

What is served: ``GET /ping``, ``GET /?query=``, ``POST /`` with the query in the URL, the body or a
form field; ``database``, ``default_format``, ``param_*``, settings as URL parameters; the
``X-ClickHouse-User/-Key/-Database/-Format/-Query-Id`` headers and basic auth; request and response
Content-Encoding (lz4, zstd, gzip, deflate); inserts whose data follows ``FORMAT <fmt>`` (any input
format the engine reads: Native, RowBinary, TSV, JSONEachRow, ...), chunked or not; ClickHouse's
error body, ``X-ClickHouse-Exception-Code`` and status codes; ``X-ClickHouse-Summary``.
Not served: sessions (``session_id``), ClickHouse's own block compression (``compress=1``/``decompress=1``),
progress headers, query cancellation, the Play UI and ``/dashboard``; results are sent whole, not streamed.
"""

from __future__ import annotations

import base64
import contextlib
import email.parser
import email.policy
import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from rolloutbus.store import protocol
from rolloutbus.store.access import DEFAULT_USERS, Limits, Refused, User, authenticate, check_sql, effective_settings

log = logging.getLogger("rolloutbus.store")

_IDENT_QUOTE = str.maketrans({"`": "\\`", "\\": "\\\\"})


def _quote_value(value: str) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


class EngineError(Exception):
    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(message)
        self.code, self.name = code, name


def _summary(elapsed: float, result_bytes: int, read: tuple[int, int] = (0, 0), written: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """``X-ClickHouse-Summary`` of one statement: (rows, bytes) read or written."""
    return {"read_rows": str(read[0]), "read_bytes": str(read[1]), "written_rows": str(written[0]),
            "written_bytes": str(written[1]), "total_rows_to_read": "0", "result_rows": "0",
            "result_bytes": str(result_bytes), "elapsed_ns": str(int(elapsed * 1e9))}


class Engine:
    """The one chDB engine of this process, opened on ``path``. ``run`` gives each call its own session."""

    def __init__(self, path: Path) -> None:
        import chdb

        self._chdb = chdb
        self.path = str(path)
        path.mkdir(parents=True, exist_ok=True)
        try:
            self._root = chdb.connect(self.path)  # keeps the engine up between requests
        except Exception as exc:  # noqa: BLE001 - chDB raises RuntimeError
            from foundation.errors import StoreError

            raise StoreError(f"cannot open the ClickHouse engine at {path} (is another process using it with chdb://?): "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}") from exc
        self.version = self._root.query("SELECT version()", "TabSeparated").bytes().decode().strip()
        self.timezone = self._root.query("SELECT timezone()", "TabSeparated").bytes().decode().strip()

    def run(self, sql: str, fmt: str, database: str | None, settings: dict[str, str], params: dict[str, str],
            data: bytes | memoryview | None = None, insert: protocol.InsertWithData | None = None) -> tuple[bytes, dict[str, Any]]:
        """Run one statement; returns the body and the summary. ``insert``: an INSERT whose data follows it."""
        conn = self._chdb.connect(self.path)
        try:
            if database and database != "default":
                self._q(conn, f"USE `{database.translate(_IDENT_QUOTE)}`")
            for key, value in settings.items():
                if not key.replace("_", "").isalnum():
                    raise EngineError(115, "UNKNOWN_SETTING", f"Code: 115. DB::Exception: Setting name {key!r} is not an identifier. (UNKNOWN_SETTING)")
                self._q(conn, f"SET {key} = {_quote_value(value)}")
            if insert is not None:
                return b"", self._insert(conn, insert)
            result = self._q(conn, sql, fmt, params)
            body = result.bytes() or b""
            summary: dict[str, Any] = {}
            try:
                summary = _summary(result.elapsed(), len(body), read=(result.rows_read(), result.bytes_read()))
            except Exception:  # noqa: BLE001 - statistics are best effort
                pass
            return body, summary
        finally:
            conn.close()

    @staticmethod
    def _insert(conn: Any, insert: protocol.InsertWithData) -> dict[str, Any]:
        """The insert's data handed to the engine from memory (chDB's streaming insert): no temporary file
        to write, read and delete per insert, which cost the store more CPU than parsing the rows."""
        try:
            stream = conn.send_insert(insert.head, insert.fmt)
            try:
                if len(insert.data):
                    stream.append(insert.data)  # a memoryview is copied by chDB, as bytes are
                done = stream.finish()
            except BaseException:
                with contextlib.suppress(Exception):  # the engine's own error is the one to report
                    stream.cancel()
                raise
        except Exception as exc:  # noqa: BLE001 - the engine raises RuntimeError with ClickHouse's text
            code, name, message = protocol.parse_engine_error(str(exc))
            raise EngineError(code, name, message) from exc
        return _summary(done.elapsed, 0, written=(done.rows_written, done.bytes_written))

    @staticmethod
    def _q(conn: Any, sql: str, fmt: str = "TabSeparated", params: dict[str, str] | None = None) -> Any:
        try:
            return conn.query(sql, fmt, params=params or {})
        except Exception as exc:  # noqa: BLE001 - the engine raises RuntimeError with ClickHouse's text
            code, name, message = protocol.parse_engine_error(str(exc))
            raise EngineError(code, name, message) from exc

    def close(self) -> None:
        self._root.close()


class StoreServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], engine: Engine, users: tuple[User, ...] = DEFAULT_USERS,
                 limits: Limits = Limits(), display_name: str = "rolloutbus-store", ssl_context: Any = None) -> None:
        """``ssl_context`` (:func:`foundation.tls.server_context`): serve HTTPS, each connection's handshake in
        its own thread."""
        self.engine, self.users, self.limits, self.display_name = engine, users, limits, display_name
        self.ssl_context = ssl_context
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.ssl_context is None:
            super().finish_request(request, client_address)
            return
        from foundation.tls import wrap

        try:
            request = wrap(self.ssl_context, request)
        except OSError as exc:  # plain HTTP to the HTTPS port, a client that gave up: its doing, one line
            log.info("TLS handshake with %s failed: %s", client_address[0], getattr(exc, "reason", None) or exc)
            return
        try:
            super().finish_request(request, client_address)
        finally:
            request.close()

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall
    server: StoreServer
    server_version = "rolloutbus-store"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        log.debug("%s " + format, self.client_address[0], *args)

    def do_GET(self) -> None:  # noqa: N802
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_HEAD(self) -> None:  # noqa: N802
        self._reply(200, b"", {"Content-Type": "text/html; charset=UTF-8"})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # The stdlib answers a method with no do_X with 501; it is the client's method that is wrong: 405.
        if code == 501:
            code, explain = 405, "the store serves GET, POST, HEAD and OPTIONS"
        super().send_error(code, message, explain)

    def do_OPTIONS(self) -> None:  # noqa: N802
        self._reply(204, b"", {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                               "Access-Control-Allow-Headers": "origin, x-requested-with, x-clickhouse-format, x-clickhouse-user, x-clickhouse-key, Authorization"})

    # ------------------------------------------------------------------ plumbing

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Keep-Alive", "timeout=30")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline(3)
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _error(self, code: int, name: str, message: str, query_id: str, status: int | None = None) -> None:
        body = protocol.error_body(code, name, message, self.server.engine.version)
        self._reply(status or protocol.http_status(code), body, {
            "Content-Type": "text/plain; charset=UTF-8",
            "X-ClickHouse-Server-Display-Name": self.server.display_name,
            "X-ClickHouse-Exception-Code": str(code),
            "X-ClickHouse-Query-Id": query_id,
        })

    # ------------------------------------------------------------------ one request

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        if url.path in ("/ping", "/replicas_status"):
            self._reply(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
            return
        query_id = self.headers.get("X-ClickHouse-Query-Id") or ""
        try:
            body = self._read_body() if method == "POST" else b""
        except (ValueError, OSError) as exc:
            self._error(101, "UNEXPECTED_PACKET_FROM_CLIENT", f"cannot read the request body: {exc}", query_id)
            self.close_connection = True
            return
        if url.path not in ("/", "/query"):
            self._error(1, "UNSUPPORTED_METHOD", f"There is no handle {url.path}. Use / or /ping", query_id, status=404)
            return
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        query_id = params.get("query_id") or query_id or str(uuid.uuid4())
        try:
            body = protocol.decode_body(body, self.headers.get("Content-Encoding"))
        except Exception as exc:  # noqa: BLE001 - any codec error is the client's
            self._error(27, "CANNOT_PARSE_INPUT_ASSERTION_FAILED", f"cannot decode the request body: {exc}", query_id)
            return
        ctype = (self.headers.get("Content-Type") or "").lower()
        if method == "POST" and ctype.startswith("multipart/form-data"):
            params.update(_form_fields(self.headers.get("Content-Type") or "", body))
            body = b""
        elif method == "POST" and ctype.startswith("application/x-www-form-urlencoded"):
            params.update(parse_qsl(body.decode(errors="replace"), keep_blank_values=True))
            body = b""
        if params.get("compress") == "1" or params.get("decompress") == "1":
            self._error(48, "NOT_IMPLEMENTED", "ClickHouse block compression (compress=1, decompress=1) is not served: "
                        "use Content-Encoding/Accept-Encoding (lz4, zstd, gzip, deflate)", query_id)
            return
        try:
            user = self._user(params)
            self._execute(method, params, body, user, query_id)
        except Refused as exc:
            self._error(exc.code, exc.name, str(exc), query_id)
        except EngineError as exc:
            self._error(exc.code, exc.name, str(exc), query_id)
        except UnicodeDecodeError:
            self._error(27, "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "the query is not UTF-8 text (binary data goes after FORMAT <name>)", query_id)
        except Exception as exc:  # noqa: BLE001 - one bad request never stops the store
            log.exception("request %s failed", query_id)
            self._error(1001, "STD_EXCEPTION", f"{type(exc).__name__}: {exc}", query_id)

    def _user(self, params: dict[str, str]) -> User:
        name = self.headers.get("X-ClickHouse-User")
        password = self.headers.get("X-ClickHouse-Key")
        auth = self.headers.get("Authorization") or ""
        if name is None and auth.lower().startswith("basic "):
            try:
                name, _, password = base64.b64decode(auth[6:].strip()).decode().partition(":")
            except Exception:  # noqa: BLE001
                raise Refused("malformed basic auth header", 516, "AUTHENTICATION_FAILED") from None
        if name is None:
            name, password = params.get("user"), params.get("password")
        return authenticate(self.server.users, name, password)

    def _execute(self, method: str, params: dict[str, str], body: bytes, user: User, query_id: str) -> None:
        engine = self.server.engine
        url_query = params.get("query", "")
        insert = None
        if url_query and body:
            insert = protocol.split_insert(url_query.encode(), body)
            sql = url_query if insert else url_query + "\n" + body.decode(errors="strict")
        elif body:
            insert = protocol.split_insert(body)
            sql = insert.head if insert else body.decode(errors="strict")
        else:
            sql = url_query
        if insert is not None:
            sql = insert.head
        if not sql.strip():
            self._error(62, "SYNTAX_ERROR", "Empty query", query_id)
            return
        requested = {k: v for k, v in params.items() if k not in protocol.TRANSPORT_PARAMS and not k.startswith("param_")}
        settings = effective_settings(user, requested, self.server.limits, get_request=(method == "GET"))
        check_sql(sql, readonly=bool(int(settings.get("readonly", "0"))), user=user, limits=self.server.limits)
        binds = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
        database = self.headers.get("X-ClickHouse-Database") or params.get("database")
        default_format = self.headers.get("X-ClickHouse-Format") or params.get("default_format") or "TabSeparated"
        started = time.perf_counter()
        out, summary = engine.run(sql, default_format, database, settings, binds, insert=insert)
        log.debug("%s %s %.1f ms %s", user.name, query_id, (time.perf_counter() - started) * 1e3, sql[:120].replace("\n", " "))
        fmt = protocol.output_format(sql, default_format) if insert is None else None
        headers = {
            "X-ClickHouse-Server-Display-Name": self.server.display_name,
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": engine.timezone,
            "X-ClickHouse-Summary": json.dumps(summary),
            "Content-Type": protocol.content_type(fmt) if fmt else "text/plain; charset=UTF-8",
        }
        if fmt and (out or protocol.is_read(sql)):
            headers["X-ClickHouse-Format"] = fmt
        if out and params.get("enable_http_compression") in ("1", "true"):
            encoding = protocol.pick_encoding(self.headers.get("Accept-Encoding"))
            if encoding:
                out = protocol.encode_body(out, encoding)
                headers["Content-Encoding"] = encoding
        self._reply(200, out, headers)


def _form_fields(content_type: str, body: bytes) -> dict[str, str]:
    """The text fields of a multipart/form-data body (query, param_*)."""
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    fields = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name and not part.get_filename():
            payload = part.get_payload(decode=True) or b""
            fields[str(name)] = payload.decode()
    return fields


def serve(server: StoreServer, stop: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set (or forever)."""
    if stop is None:
        server.serve_forever(poll_interval=0.5)
        return
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    stop.wait()
    server.shutdown()
    thread.join()


__all__ = ["Engine", "EngineError", "StoreServer", "serve"]
