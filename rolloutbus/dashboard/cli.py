"""``rolloutbus dashboard``: a live web page over the ClickHouse store. Flags fall back to ``ROLLOUTBUS_DASHBOARD_*``."""

from __future__ import annotations

import argparse

from foundation import tls

# Imported here (cheap) so the settings class is known to whoever walks the CLI's flags.
from rolloutbus.dashboard.settings import DashboardSettings  # noqa: F401


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="listen address (env ROLLOUTBUS_DASHBOARD_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="listen port (env ROLLOUTBUS_DASHBOARD_PORT, default 8050)")
    parser.add_argument("--refresh", type=float, default=None,
                        help="seconds between the page's refreshes (env ROLLOUTBUS_DASHBOARD_REFRESH_S, default 5)")
    parser.add_argument("--analyst-user", default=None,
                        help="store user the SQL box runs as (env ROLLOUTBUS_DASHBOARD_ANALYST_USER; its password: "
                        "ROLLOUTBUS_DASHBOARD_ANALYST_PASSWORD); unset: the DSN's user with readonly=1")
    parser.add_argument("--scrape", default=None, help="comma-separated Prometheus /metrics URLs of gateways and producers "
                        "to show (env ROLLOUTBUS_DASHBOARD_SCRAPE)")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="listen on a non-loopback address without ROLLOUTBUS_DASHBOARD_TOKEN (env ROLLOUTBUS_INSECURE; logged loudly)")
    parser.add_argument("--no-kafka-lag", action="store_true",
                        help="do not ask Kafka for consumer-group lag (env ROLLOUTBUS_DASHBOARD_KAFKA_LAG=false)")
    tls.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import logging

    from aiohttp import web

    from foundation.config import load_settings
    from foundation.exposure import check_listen
    from rolloutbus.dashboard.app import Dashboard, assets_missing

    flags = {"dashboard_host": "--host", "dashboard_port": "--port", "dashboard_refresh_s": "--refresh",
             "dashboard_analyst_user": "--analyst-user", "dashboard_scrape": "--scrape", "insecure": "--insecure"}
    values = {"data_dir": getattr(args, "data_dir", None), "dashboard_host": args.host, "dashboard_port": args.port,
              "dashboard_refresh_s": args.refresh, "dashboard_analyst_user": args.analyst_user,
              "dashboard_kafka_lag": False if args.no_kafka_lag else None, "dashboard_scrape": args.scrape,
              "insecure": getattr(args, "insecure", None)}
    s = load_settings(DashboardSettings, {k: v for k, v in values.items() if v is not None}, flags)
    log = logging.getLogger("rolloutbus.dashboard")
    check_listen(s.dashboard_host, s.dashboard_token is not None, s.insecure, "ROLLOUTBUS_DASHBOARD_TOKEN", "rolloutbus dashboard")
    ssl_context = tls.from_args(args)  # before anything starts: a bad certificate is one line
    dash = Dashboard.from_settings(s)
    missing = assets_missing()
    if missing:
        log.warning("%s", missing)
    url = f"{tls.scheme(ssl_context)}://{s.dashboard_host}:{s.dashboard_port}/"
    print(f"rolloutbus dashboard: {url} (ClickHouse {dash.dsn_shown}, "
          f"{'bearer token required' if s.dashboard_token else 'no token'})", flush=True)
    try:
        web.run_app(dash.app(), host=s.dashboard_host, port=s.dashboard_port, print=None, access_log=None,
                    ssl_context=ssl_context)
    except OSError as exc:
        from foundation.errors import ServiceError

        raise ServiceError(f"cannot serve on {s.dashboard_host}:{s.dashboard_port}: {exc.strerror or exc} "
                           "(something else there? set --port / ROLLOUTBUS_DASHBOARD_PORT)") from exc
    finally:
        dash.close()
    return 0
