"""The dashboard's aiohttp application: one page, its static files, and JSON endpoints over ClickHouse.

::

    GET  /                     the page (refreshes itself)
    GET  /static/...           its script, styles, and the vendored uPlot (fetched at build time from npm)
    GET  /api/config           refresh interval, whether the charting library is there
    GET  /api/learning         reward and success by version and over time (train / test), trainer steps, versions now
    GET  /api/pipeline         rollouts completed and spans written per bucket, FINISHED → written latency,
                               dead letters by reason, consumer-group lag per partition (Kafka admin), and
                               the gateways' / producers' requests by status and spool depth (their /metrics)
    GET  /api/rollouts         a searchable list of rollouts (q, task, status, mode, version, agent, min/max reward)
    GET  /api/rollout/{id}     one rollout: attempts, its spans as a timeline with its steps, its GRPO group
    POST /api/sql              {"sql": ...} run read-only as the analyst user; the server's error when refused
    GET  /healthz

With a token configured, every ``/api/`` request needs ``Authorization: Bearer <token>`` (401 otherwise);
the page itself holds no data and asks for the token (``#token=...`` in the URL works too).
ClickHouse is reached with clickhouse-connect, blocking, on a worker thread per call.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from rolloutbus.dashboard import queries as Q

log = logging.getLogger("rolloutbus.dashboard")

STATIC_DIR = Path(__file__).resolve().parent / "static"
VENDOR_DIR = STATIC_DIR / "vendor"
VENDOR_FILES = ("uPlot.iife.min.js", "uPlot.min.css")
SQL_MAX_ROWS = 1000


def assets_missing(vendor_dir: Path = VENDOR_DIR) -> str | None:
    """None when the vendored charting library is there; else the line that says how to get it."""
    missing = [f for f in VENDOR_FILES if not (vendor_dir / f).is_file()]
    if not missing:
        return None
    return (f"the dashboard's charting library (uPlot, {', '.join(missing)}) is not in {vendor_dir}: "
            "run `make dashboard-assets` (it fetches the npm package at build time); tables work without it, charts do not")


class NotFound(Exception):
    """What was asked for is not in ClickHouse."""


class QueryFailed(Exception):
    """ClickHouse refused a statement or could not be reached; the message is the server's first line."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    line = line.split("(version")[0].strip()
    # clickhouse-connect wraps the server's message; the server's own words are what a user looks up.
    return line.split("server response: ", 1)[-1]


class Reader:
    """One clickhouse-connect client, opened on first use and reopened after a failure; one query at a time."""

    def __init__(self, connect: Callable[[], Any], panels: bool = True) -> None:
        self._connect = connect
        self._panels = panels  # a missing table means "no data yet" to a panel, a typo to the SQL box
        self._client: Any = None
        import threading

        self._lock = threading.Lock()

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        from clickhouse_connect.driver.exceptions import ClickHouseError as CCError

        from foundation.errors import RolloutbusError

        with self._lock:
            try:
                if self._client is None:
                    self._client = self._connect()
                return self._client.query(sql, parameters=parameters or {})
            except (CCError, RolloutbusError) as exc:
                if not isinstance(exc, CCError) or "Code:" not in str(exc):  # a connection problem: reconnect next time
                    self.close_client()
                line = _first_line(exc)
                if self._panels and ("UNKNOWN_DATABASE" in line or "UNKNOWN_TABLE" in line):
                    line = f"no data yet: the tables are not there ({line.split('Exception:')[-1].strip()[:120]}); the stream processor creates them when it starts"
                raise QueryFailed(line) from exc

    def rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[Any]:
        return list(self.query(sql, parameters).result_rows)

    def close_client(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - closing a broken client
                pass
            self._client = None


@dataclass
class Cached:
    """Rows from outside ClickHouse (Kafka's lag, producers' metrics), asked at most every ``ttl_s``.

    ``{"rows": [...]}``, or ``{"error": ..., "rows": []}`` when asking failed or ``fetch`` is None (``off``)."""

    fetch: Callable[[], Any] | None
    off: str
    ttl_s: float = 10.0
    at: float = 0.0
    value: Any = None

    def get(self) -> Any:
        if self.fetch is None:
            return {"error": self.off, "rows": []}
        if self.value is None or time.monotonic() - self.at > self.ttl_s:
            try:
                self.value = {"rows": self.fetch()}
            except Exception as exc:  # noqa: BLE001 - Kafka down is something to show, not to crash on
                self.value = {"error": _first_line(exc), "rows": []}
            self.at = time.monotonic()
        return self.value


def _scrape_request(url: str) -> Any:
    """The request for one target: a token given as the URL's password (``http://metrics:<token>@host/metrics``)
    is sent as ``Authorization: Bearer <token>`` — what the gateway's, proxy's, worker's and trainer's
    ``/metrics`` take beyond loopback — and the URL goes without it."""
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return urllib.request.Request(url)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return urllib.request.Request(bare, headers={"Authorization": f"Bearer {urllib.parse.unquote(parts.password)}"})


def scrape(targets: list[str], timeout: float = 3.0) -> list[dict[str, Any]]:
    """Each target's ``/metrics`` as a row of :func:`queries.producer_health`, or a row with its error."""
    import urllib.request

    from foundation.redact import redact_url, scrub, url_secrets

    rows = []
    for url in targets:
        shown = redact_url(url)  # a target may carry a credential (user:key@, ?token=): the page never shows it
        try:
            with urllib.request.urlopen(_scrape_request(url), timeout=timeout) as resp:
                rows.append(Q.producer_health(shown, resp.read().decode("utf-8", "replace")))
        except Exception as exc:  # noqa: BLE001 - a producer that is down is something to show
            rows.append({"target": shown, "error": scrub(_first_line(exc), url_secrets(url))})
    return rows


class Dashboard:
    """The page and its endpoints, over a reader for the panels and one for the SQL box."""

    def __init__(self, panels: Reader, analyst: Reader, *, token: str | None = None, refresh_s: float = 5.0,
                 lag: Callable[[], Any] | None = None, dsn_shown: str = "", scrape_targets: list[str] | None = None) -> None:
        self.panels, self.analyst = panels, analyst
        self.token = token
        self.refresh_s = refresh_s
        self.lag = Cached(lag, "not asked (--no-kafka-lag)")
        targets = scrape_targets or []
        self.producers = Cached((lambda: scrape(targets)) if targets else None, ttl_s=2.0,
                                off="no gateway or producer to scrape: set ROLLOUTBUS_DASHBOARD_SCRAPE to their /metrics URLs")
        self.dsn_shown = dsn_shown

    @classmethod
    def from_settings(cls, s: Any) -> Dashboard:
        from foundation.clickhouse import connect
        from foundation.redact import redact_url

        def panels() -> Any:
            return connect(s.dsn, database=s.clickhouse_database, password=s.clickhouse_password, readonly=True,
                           create_database=False)

        def analyst() -> Any:
            if not s.dashboard_analyst_user:
                return panels()
            from urllib.parse import urlparse, urlunparse

            if s.dsn.startswith("chdb:"):
                return panels()
            parsed = urlparse(s.dsn)
            host = parsed.netloc.rsplit("@", 1)[-1]
            dsn = urlunparse(parsed._replace(netloc=f"{s.dashboard_analyst_user}@{host}"))
            return connect(dsn, database=s.clickhouse_database, password=s.dashboard_analyst_password, readonly=True,
                           create_database=False)

        lag = None
        if s.dashboard_kafka_lag:
            from foundation.kafka_admin import cluster_status

            conf, prefix = s.kafka_conf(), s.topic_prefix

            def lag() -> Any:
                _, _, groups = cluster_status(conf, prefix, timeout=3.0)
                return [{"group": g.group, "topic": t, "partition": part, "lag": n}
                        for g in groups for (t, part), n in sorted(g.partitions.items())]

        return cls(Reader(panels), Reader(analyst, panels=False), token=s.dashboard_token.get_secret_value() if s.dashboard_token else None,
                   refresh_s=s.dashboard_refresh_s, lag=lag, dsn_shown=redact_url(s.dsn), scrape_targets=s.scrape_targets())

    def close(self) -> None:
        self.panels.close_client()
        self.analyst.close_client()

    # ------------------------------------------------------------------------------------- the app

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/", self.index)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/api/config", self.config)
        app.router.add_get("/api/learning", self.learning)
        app.router.add_get("/api/pipeline", self.pipeline)
        app.router.add_get("/api/rollouts", self.rollouts)
        app.router.add_get("/api/rollout/{rollout_id}", self.rollout)
        app.router.add_post("/api/sql", self.sql)
        app.router.add_static("/static/", STATIC_DIR, show_index=False, follow_symlinks=False)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.token is not None and request.path.startswith("/api/"):
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {self.token}".encode()):
                return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                                         headers={"WWW-Authenticate": 'Bearer realm="rolloutbus dashboard"'})
        return await handler(request)

    async def index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def config(self, request: web.Request) -> web.Response:
        return web.json_response({"refresh_s": self.refresh_s, "assets_missing": assets_missing(), "clickhouse": self.dsn_shown})

    async def _panel(self, compute: Callable[[], dict[str, Any]]) -> web.Response:
        """Run ``compute`` on a worker thread; ClickHouse's refusal is the panel's error, not a 500."""
        try:
            body = await asyncio.to_thread(compute)
        except NotFound as exc:
            return web.json_response({"error": str(exc)}, status=404)
        except QueryFailed as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.json_response(body)

    async def learning(self, request: web.Request) -> web.Response:
        def compute() -> dict[str, Any]:
            first, last, n = self.panels.rows(Q.TIME_RANGE)[0]
            bucket = Q.bucket_seconds(first, last)
            over_time = self.panels.rows(Q.REWARD_OVER_TIME, {"bucket": bucket})
            return {
                "rollouts": n,
                "bucket_s": bucket,
                "by_version": Q.series_by(self.panels.rows(Q.REWARD_BY_VERSION), key=1, x=0,
                                          ys={"reward": 3, "success": 4, "rollouts": 2}),
                "over_time": Q.series_by(over_time, key=1, x=0, ys={"reward": 3, "success": 4, "rollouts": 2}),
                "steps": Q.records(["run_id", "step", "t", "version", "groups", "loss", "kl", "clip_fraction",
                                    "reward_mean", "tokens_per_s"], self.panels.rows(Q.TRAIN_STEPS)),
                "versions_now": Q.records(["version", "mode", "rollouts"], self.panels.rows(Q.VERSIONS_NOW)),
                "latest_versions": Q.records(["name", "version", "created"], self.panels.rows(Q.LATEST_VERSION)),
            }

        return await self._panel(compute)

    async def pipeline(self, request: web.Request) -> web.Response:
        def compute() -> dict[str, Any]:
            first, last, _ = self.panels.rows(Q.TIME_RANGE)[0]
            bucket = Q.bucket_seconds(first, last)
            done = self.panels.rows(Q.ROLLOUTS_PER_BUCKET, {"bucket": bucket})
            latency: dict[Any, list[float]] = {}
            for t, _status, _n, p50, mx in done:
                latency.setdefault(t, [p50, mx])
                latency[t] = [max(latency[t][0], p50), max(latency[t][1], mx)]
            since = int(first or time.time_ns() - 3600 * 10**9)
            spans = self.panels.rows(Q.SPANS_PER_BUCKET, {"bucket": bucket, "since_ns": since})
            return {
                "bucket_s": bucket,
                "rollouts": Q.series_by(done, key=1, x=0, ys={"per_bucket": 2}),
                "latency": {"x": sorted(latency), "p50_s": [latency[t][0] for t in sorted(latency)],
                            "max_s": [latency[t][1] for t in sorted(latency)]},
                "spans": {"x": [r[0] for r in spans], "per_bucket": [r[1] for r in spans]},
                "dlq_by_reason": Q.records(["source_topic", "stage", "reason", "records", "last_seen"], self.panels.rows(Q.DLQ_BY_REASON)),
                "dlq": Q.series_by(self.panels.rows(Q.DLQ_PER_BUCKET, {"bucket": bucket}), key=1, x=0, ys={"records": 2}),
                "lag": self.lag.get(),
                "producers": self.producers.get(),
            }

        return await self._panel(compute)

    async def rollouts(self, request: web.Request) -> web.Response:
        q = request.query
        try:
            params = {
                "q": q.get("q", "").strip(), "task": q.get("task", "").strip(), "status": q.get("status", "").strip(),
                "mode": q.get("mode", "").strip(), "agent": q.get("agent", "").strip(),
                "version": int(q["version"]) if q.get("version", "").strip() else -1,
                "min_reward": float(q["min_reward"]) if q.get("min_reward", "").strip() else -1e300,
                "max_reward": float(q["max_reward"]) if q.get("max_reward", "").strip() else 1e300,
                "limit": min(max(int(q.get("limit", "200")), 1), 5000),
            }
        except ValueError as exc:
            return web.json_response({"error": f"bad filter: {exc}"}, status=400)
        return await self._panel(lambda: {"rollouts": Q.records(Q.ROLLOUT_COLUMNS, self.panels.rows(Q.ROLLOUT_LIST, params))})

    async def rollout(self, request: web.Request) -> web.Response:
        rid = request.match_info["rollout_id"]

        def compute() -> dict[str, Any]:
            attempts = Q.records(Q.ATTEMPT_COLUMNS, self.panels.rows(Q.ROLLOUT_ATTEMPTS, {"rid": rid}))
            spans = Q.records(Q.SPAN_COLUMNS, self.panels.rows(Q.ROLLOUT_SPANS, {"rid": rid}))
            steps = Q.records(Q.TRANSITION_COLUMNS, self.panels.rows(Q.ROLLOUT_TRANSITIONS, {"rid": rid}))
            group_ids = sorted({a["group_id"] for a in attempts if a["group_id"]} | {t["group_id"] for t in steps if t["group_id"]})
            groups = [g for gid in group_ids for g in Q.records(Q.GROUP_COLUMNS, self.panels.rows(Q.GROUP, {"gid": gid}))]
            if not attempts and not spans:
                raise NotFound(f"no rollout {rid!r} in ClickHouse (yet)")
            return {"rollout_id": rid, "attempts": attempts, "timeline": Q.timeline(spans, steps), "steps": steps, "groups": groups}

        return await self._panel(compute)

    async def sql(self, request: web.Request) -> web.Response:
        try:
            payload = await request.json()
            sql = str(payload["sql"]).strip()
        except (ValueError, KeyError, TypeError, LookupError, RecursionError, web.RequestPayloadError):  # not JSON, an unknown
            # charset, nested too deep, unreadable
            return web.json_response({"error": 'send JSON {"sql": "SELECT ..."}'}, status=400)
        if not sql:
            return web.json_response({"error": "no SQL given"}, status=400)

        def compute() -> dict[str, Any]:
            t0 = time.monotonic()
            result = self.analyst.query(sql)
            types = [t.name for t in result.column_types]
            body = Q.sql_result(list(result.column_names), types, list(result.result_rows), SQL_MAX_ROWS)
            body["elapsed_s"] = round(time.monotonic() - t0, 3)
            return body

        try:
            body = await asyncio.to_thread(compute)
        except QueryFailed as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(body)
