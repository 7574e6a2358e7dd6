"""``rolloutbus gateway``: the OTLP/HTTP ingest gateway. Flags fall back to ``ROLLOUTBUS_GATEWAY_*``."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="listen address (env ROLLOUTBUS_GATEWAY_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="listen port (env ROLLOUTBUS_GATEWAY_PORT, default 4318)")
    parser.add_argument("--max-body-bytes", type=int, default=None, help="413 above this (env ROLLOUTBUS_GATEWAY_MAX_BODY_BYTES)")


def run(args: argparse.Namespace) -> int:
    import logging

    from aiohttp import web

    from producers.gateway import Gateway
    from producers.settings import GatewaySettings
    from rolloutbus.config import load_settings

    flags = {"gateway_host": "--host", "gateway_port": "--port", "gateway_max_body_bytes": "--max-body-bytes"}
    values = {"data_dir": getattr(args, "data_dir", None), "gateway_host": args.host, "gateway_port": args.port,
              "gateway_max_body_bytes": args.max_body_bytes}
    s = load_settings(GatewaySettings, {k: v for k, v in values.items() if v is not None}, flags)
    transport = s.transport(spool_name="gateway")
    gw = Gateway(
        transport,
        max_body_bytes=s.gateway_max_body_bytes,
        token=s.gateway_token.get_secret_value() if s.gateway_token else None,
        retry_after_s=s.gateway_retry_after_s,
    )
    logging.getLogger(__name__).info(
        "gateway on http://%s:%d/v1/traces → %s at %s", s.gateway_host, s.gateway_port, s.topics.spans, s.bootstrap
    )
    try:
        web.run_app(gw.app(), host=s.gateway_host, port=s.gateway_port, print=None, access_log=None)
    finally:
        transport.close(30)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m producers.gateway_cli``: the same as ``rolloutbus gateway``."""
    import logging

    parser = argparse.ArgumentParser(prog="rolloutbus gateway")
    parser.add_argument("--data-dir", default=None)
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
