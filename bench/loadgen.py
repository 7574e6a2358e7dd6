"""The benches' HTTP client side. Load from one queue over keep-alive connections, for the load generators
(bench_gateway's OTLP bodies; bench_e2e's bodies and the attempt updates after each): every connection
takes the next item as soon as it is free. And one JSON request, for the Agent Lightning stores.
Standard library only (Agent Lightning's interpreter imports it too); the OTLP reply is parsed only when asked."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlparse

T = TypeVar("T")
_DONE = object()


def fan_out(url: str, items: Iterable[T], connections: int, send: Callable[[http.client.HTTPConnection, T], None],
            timeout: float = 60) -> tuple[float, float]:
    """``send(conn, item)`` for every item, from ``connections`` threads, each with its own keep-alive
    connection to ``url``'s host; returns the wall-clock (start, end). ``send`` keeps its own counts
    (under its own lock: it runs on several threads at once)."""
    u = urlparse(url)
    lock = threading.Lock()
    it = iter(items)

    def worker() -> None:
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=timeout)
        try:
            while True:
                with lock:
                    item = next(it, _DONE)
                if item is _DONE:
                    break
                send(conn, item)  # type: ignore[arg-type]
        finally:
            conn.close()

    started = time.time()
    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return started, time.time()


def post(conn: http.client.HTTPConnection, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    """One POST on a kept-alive connection: (status, body of the reply)."""
    conn.request("POST", path, body=body, headers={"Content-Type": content_type})
    resp = conn.getresponse()
    return resp.status, resp.read()


def rejected_spans(reply: bytes) -> int:
    """The spans an OTLP/HTTP export reply says were rejected (``partial_success.rejected_spans``)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    r = ExportTraceServiceResponse()
    r.ParseFromString(reply)
    return int(r.partial_success.rejected_spans)


def http_json(method: str, url: str, body: Any = None, timeout: float = 30.0) -> Any:
    """One request with a JSON body (or none); the JSON reply, or None when it is empty."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


__all__ = ["fan_out", "http_json", "post", "rejected_spans"]
