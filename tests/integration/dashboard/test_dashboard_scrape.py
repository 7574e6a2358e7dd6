"""The dashboard's scrape of a producer's ``/metrics`` behind a token: the token rides as the target URL's
password, goes out as ``Authorization: Bearer``, and never shows on the page."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from rolloutbus.dashboard.app import scrape

pytestmark = pytest.mark.integration

TOKEN = "scrape-tok-7Qz"
METRICS = b'rolloutbus_gateway_requests_total{code="200"} 5.0\nrolloutbus_gateway_spool_pending 2.0\n'


@pytest.fixture
def metrics_server() -> Iterator[tuple[int, list[str]]]:
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            seen.append(self.headers.get("Authorization", ""))
            ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(METRICS if ok else b"needs the token")

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()


def test_a_token_given_as_the_urls_password_is_sent_as_bearer_and_never_shown(metrics_server: tuple[int, list[str]]) -> None:
    port, seen = metrics_server
    with_token, without = scrape([f"http://metrics:{TOKEN}@127.0.0.1:{port}/metrics", f"http://127.0.0.1:{port}/metrics"])
    assert seen == [f"Bearer {TOKEN}", ""]
    assert with_token["2xx"] == 5 and with_token["spool_pending"] == 2 and "error" not in with_token
    assert "401" in without["error"]
    assert TOKEN not in repr([with_token, without]) and with_token["target"] == f"http://metrics:***@127.0.0.1:{port}/metrics"
