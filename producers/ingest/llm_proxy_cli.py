"""``rolloutbus proxy --upstream URL``: the LLM proxy. Flags fall back to ``ROLLOUTBUS_PROXY_*``."""

from __future__ import annotations

import argparse

from foundation import tls


# flag dest → settings field: what the flags set, and where their help's variable and default come from
_FLAGS = {"upstream": "proxy_upstream", "host": "proxy_host", "port": "proxy_port", "upstream_kind": "proxy_upstream_kind",
          "max_response_bytes": "proxy_max_response_bytes", "insecure": "insecure"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", default=None, help="upstream OpenAI-compatible base URL incl. /v1")
    parser.add_argument("--host", default=None, help="listen address")
    parser.add_argument("--port", type=int, default=None, help="listen port")
    parser.add_argument("--upstream-kind", choices=["vllm", "rolloutbus-serve", "openai"], default=None,
                        help="what the upstream accepts (env ROLLOUTBUS_PROXY_UPSTREAM_KIND, default vllm): vllm and "
                             "rolloutbus-serve are asked for token ids and logprobs; openai gets the request unchanged "
                             "and its spans carry text only")
    parser.add_argument("--max-response-bytes", type=int, default=None,
                        help="502 for a larger upstream answer")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="listen on a non-loopback address without ROLLOUTBUS_PROXY_TOKEN (logged loudly)")
    tls.add_arguments(parser)
    from foundation.flags import describe_flags

    describe_flags(parser, "producers.ingest.settings:ProxySettings", _FLAGS)  # each flag's variable and default, from the settings


def run(args: argparse.Namespace) -> int:
    import logging

    from aiohttp import web

    from producers.ingest.llm_proxy import LLMProxy
    from producers.ingest.settings import ProxySettings
    from producers.transport import SpanTransport
    from foundation.entry import settings_from_args
    from foundation.exposure import check_listen, is_loopback
    from foundation.errors import ConfigError

    s = settings_from_args(ProxySettings, args, _FLAGS)
    check_listen(s.proxy_host, s.proxy_token is not None, s.insecure, "ROLLOUTBUS_PROXY_TOKEN", "rolloutbus proxy")
    if not s.proxy_upstream:
        raise ConfigError("no upstream: pass --upstream http://host:port/v1 or set ROLLOUTBUS_PROXY_UPSTREAM")
    ssl_context = tls.from_args(args)  # before the spool opens: a bad certificate is one line
    transport = SpanTransport.from_settings(s, spool_name="proxy")
    proxy = LLMProxy(
        s.proxy_upstream, transport, timeout_s=s.proxy_timeout_s, kind=s.proxy_upstream_kind,
        max_response_bytes=s.proxy_max_response_bytes,
        token=s.proxy_token.get_secret_value() if s.proxy_token else None,
        api_key=s.proxy_upstream_api_key.get_secret_value() if s.proxy_upstream_api_key else None,
        # Beyond loopback /metrics needs the token too (Prometheus: authorization: {credentials: <token>}).
        metrics_token=None if is_loopback(s.proxy_host) or s.proxy_token is None else s.proxy_token.get_secret_value(),
    )
    logging.getLogger(__name__).info("proxy on %s://%s:%d → %s (%s)", tls.scheme(ssl_context), s.proxy_host, s.proxy_port,
                                     proxy.shown, s.proxy_upstream_kind)
    try:
        web.run_app(proxy.app(), host=s.proxy_host, port=s.proxy_port, print=None, access_log=None, ssl_context=ssl_context)
    finally:
        transport.close(30)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m producers.ingest.llm_proxy_cli``: the same as ``rolloutbus proxy``."""
    from foundation.entry import run_command

    return run_command("rolloutbus proxy", add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
