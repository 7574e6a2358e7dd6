"""``rolloutbus dashboard``: a live web page over the ClickHouse store. Flags fall back to ``ROLLOUTBUS_DASHBOARD_*``."""

from __future__ import annotations

import argparse

from foundation import tls

# Imported here (cheap) so the settings class is known to whoever walks the CLI's flags.
from rolloutbus.dashboard.settings import DashboardSettings  # noqa: F401


# flag dest → settings field (DashboardSettings: each default written there)
_FLAGS = {"host": "dashboard_host", "port": "dashboard_port", "refresh": "dashboard_refresh_s",
          "analyst_user": "dashboard_analyst_user", "scrape": "dashboard_scrape", "insecure": "insecure"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from foundation.flags import describe_flags

    parser.add_argument("--host", default=None, help="listen address")
    parser.add_argument("--port", type=int, default=None, help="listen port")
    parser.add_argument("--refresh", type=float, default=None, help="seconds between the page's refreshes")
    parser.add_argument("--analyst-user", default=None,
                        help="store user the SQL box runs as (its password: ROLLOUTBUS_DASHBOARD_ANALYST_PASSWORD); unset: "
                        "the DSN's user with readonly=1")
    parser.add_argument("--scrape", default=None, help="comma-separated Prometheus /metrics URLs of gateways and producers "
                        "to show")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="listen on a non-loopback address without ROLLOUTBUS_DASHBOARD_TOKEN (logged loudly)")
    parser.add_argument("--no-kafka-lag", action="store_true",
                        help="do not ask Kafka for consumer-group lag (env ROLLOUTBUS_DASHBOARD_KAFKA_LAG=false)")
    tls.add_arguments(parser)
    describe_flags(parser, "rolloutbus.dashboard.settings:DashboardSettings", _FLAGS)  # each flag's variable and default


def run(args: argparse.Namespace) -> int:
    import logging

    from aiohttp import web

    from foundation.config import load_settings
    from foundation.exposure import check_listen
    from rolloutbus.dashboard.app import Dashboard, assets_missing

    names = {field: "--" + dest.replace("_", "-") for dest, field in _FLAGS.items()}
    values = {"data_dir": getattr(args, "data_dir", None), **{field: getattr(args, dest, None) for dest, field in _FLAGS.items()},
              "dashboard_kafka_lag": False if args.no_kafka_lag else None}
    s = load_settings(DashboardSettings, {k: v for k, v in values.items() if v is not None}, names)
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
