"""``rolloutbus gateway``: the OTLP/HTTP ingest gateway. Flags fall back to ``ROLLOUTBUS_GATEWAY_*``."""

from __future__ import annotations

import argparse
import logging

from foundation import tls


class ClientErrorsInOneLine(logging.Filter):
    """aiohttp logs a request it cannot parse (a header over 8 KiB, a broken chunk, a client gone mid-body)
    as an ERROR with a traceback: that is the client's doing, so one INFO line, without the bytes it sent."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError
        from aiohttp.web_protocol import RequestPayloadError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (HttpProcessingError, RequestPayloadError, ConnectionResetError)):
            what = " ".join(str(exc).split()).split(": b'", 1)[0].split(': b"', 1)[0][:200]
            record.msg, record.args = f"{record.getMessage()}: {type(exc).__name__}: {what}", ()
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True
from typing import Any


# flag dest → settings field: what the flags set, and where their help's variable and default come from
_FLAGS = {"host": "gateway_host", "port": "gateway_port", "max_body_bytes": "gateway_max_body_bytes", "insecure": "insecure"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="listen address")
    parser.add_argument("--port", type=int, default=None, help="listen port")
    parser.add_argument("--max-body-bytes", type=int, default=None, help="413 above this")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="listen on a non-loopback address without ROLLOUTBUS_GATEWAY_TOKEN (logged loudly)")
    tls.add_arguments(parser)
    from foundation.flags import describe_flags

    describe_flags(parser, "producers.ingest.settings:GatewaySettings", _FLAGS)  # each flag's variable and default, from the settings


def run(args: argparse.Namespace) -> int:
    from aiohttp import web

    from producers.ingest.agl.control_log import ControlLog, control_topic
    from producers.ingest.agl.queue import ClickHouseReader, TaskQueue, clickhouse_ended
    from producers.ingest.gateway import SERVER_OPTIONS, Gateway
    from producers.ingest.resources import FollowedResources
    from producers.ingest.settings import GatewaySettings
    from producers.transport import SpanTransport
    from foundation.entry import settings_from_args
    from foundation.exposure import check_listen, is_loopback

    s = settings_from_args(GatewaySettings, args, _FLAGS)
    check_listen(s.gateway_host, s.gateway_token is not None, s.insecure, "ROLLOUTBUS_GATEWAY_TOKEN", "rolloutbus gateway")
    ssl_context = tls.from_args(args)  # before anything starts: a bad certificate is one line, not a half-started gateway
    transport = SpanTransport.from_settings(s, spool_name="gateway")
    feedback = SpanTransport(s.kafka_conf(), s.topics.feedback, s.data_dir / "spool", spool_name="gateway-feedback",
                             spool_max_bytes=s.spool_max_bytes, on_full=s.spool_full_policy,
                             fsync_interval_s=s.spool_fsync_interval_s)
    resources = FollowedResources(s.kafka_conf(), s.topics.resources)
    gw = Gateway(
        transport,
        max_body_bytes=s.gateway_max_body_bytes,
        token=s.gateway_token.get_secret_value() if s.gateway_token else None,
        retry_after_s=s.gateway_retry_after_s,
        resources=resources,
        # Beyond loopback /metrics needs the token too (Prometheus: authorization: {credentials: <token>}).
        metrics_token=None if is_loopback(s.gateway_host) or s.gateway_token is None else s.gateway_token.get_secret_value(),
        feedback_transport=feedback,
    )
    # Agent Lightning's queue on rb.tasks: joins the replicas' consumer group on the first dequeue; reads
    # ClickHouse read-only (connected on first use) to learn of attempts that ended through another replica.
    def readonly_clickhouse() -> Any:
        from foundation.clickhouse import connect

        return connect(s.dsn, database=s.clickhouse_database, password=s.clickhouse_password, readonly=True,
                       create_database=False)

    # An embedded engine (chdb://) is the stream worker's own, one process per path: no reads from here then.
    clickhouse = None if s.dsn.startswith("chdb:") else ClickHouseReader(readonly_clickhouse)
    queue = TaskQueue(s.kafka_conf(), s.topics, transport, claim_timeout_s=s.gateway_agl_claim_timeout_s,
                      max_attempts=s.gateway_agl_max_attempts, resources=resources,
                      ended=clickhouse_ended(clickhouse) if clickhouse is not None else None)
    gw.agl_store.queue = queue
    gw.agl1_api.queue = queue  # Agent Lightning 1.x's controllers poll the same queue (its own rollouts only)
    gw.agl1_api.control = ControlLog(s.kafka_conf(), control_topic(s.topics.prefix))  # its store's read-your-writes records
    gw.agl1_api.llm_token = s.llm_proxy_token.get_secret_value() if s.llm_proxy_token else None
    gw.agl_store.clickhouse = clickhouse  # the reads (query_rollouts, get_rollout_by_id, ...) answer from ClickHouse
    gw.agl_store.publish = resources.publish  # add_resources / update_resources: versions on rb.resources
    logging.getLogger(__name__).info(
        "gateway on %s://%s:%d/v1/traces → %s at %s", tls.scheme(ssl_context), s.gateway_host, s.gateway_port, s.topics.spans,
        s.bootstrap
    )
    logging.getLogger("aiohttp.server").addFilter(ClientErrorsInOneLine())
    try:
        web.run_app(gw.app(), host=s.gateway_host, port=s.gateway_port, print=None, access_log=None,
                    ssl_context=ssl_context, **SERVER_OPTIONS)
    finally:
        queue.close()
        gw.agl1_api.control.close()
        resources.close()
        transport.close(30)
        feedback.close(30)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m producers.ingest.gateway_cli``: the same as ``rolloutbus gateway``."""
    from foundation.entry import run_command

    return run_command("rolloutbus gateway", add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
