"""TLS for the HTTP services, in one place: ``--tls-cert`` / ``--tls-key`` (``ROLLOUTBUS_TLS_CERT`` /
``ROLLOUTBUS_TLS_KEY``): a PEM certificate (chain) and its private key. Both given: the service serves
HTTPS only; neither: plain HTTP (behind your TLS termination, or on loopback).

A command calls :func:`add_arguments` on its parser and :func:`server_context` with what
:func:`settings_from_args` reads; the result goes to its server (aiohttp's ``ssl_context``, or
:func:`wrap` per connection for the standard library's servers). Every mistake — one file without the
other, a file that cannot be read, a key that is not the certificate's — is a :class:`ConfigError` in one
line naming the files, never their content.
"""

from __future__ import annotations

import argparse
import socket
import ssl
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from foundation.errors import ConfigError

__all__ = ["TLSSettings", "add_arguments", "server_context", "from_args", "scheme", "wrap", "FLAGS"]

FLAGS = {"tls_cert": "tls_cert", "tls_key": "tls_key"}  # argparse destination → settings field


class TLSSettings(BaseSettings):
    """``ROLLOUTBUS_TLS_CERT`` and ``ROLLOUTBUS_TLS_KEY``."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUTBUS_", extra="ignore")

    tls_cert: Path | None = Field(default=None, description="PEM certificate (chain) to serve HTTPS with.")
    tls_key: Path | None = Field(default=None, description="PEM private key of that certificate.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-cert", default=None, metavar="PEM",
                        help="serve HTTPS with this certificate (chain); with --tls-key (env ROLLOUTBUS_TLS_CERT)")
    parser.add_argument("--tls-key", default=None, metavar="PEM",
                        help="the certificate's private key (env ROLLOUTBUS_TLS_KEY)")


def server_context(cert: Path | str | None, key: Path | str | None) -> ssl.SSLContext | None:
    """The server side's TLS context (TLS 1.2 or later), or None when neither file is given."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key (ROLLOUTBUS_TLS_KEY)") if cert else ("--tls-key", "--tls-cert (ROLLOUTBUS_TLS_CERT)")
        raise ConfigError(f"{given} was given without {missing}: HTTPS needs both the certificate and its key")
    cert, key = Path(cert), Path(key)
    for what, path in (("certificate", cert), ("key", key)):
        if not path.is_file():
            raise ConfigError(f"the TLS {what} {path} is not a readable file (--tls-{'cert' if what == 'certificate' else 'key'})")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ConfigError(f"cannot serve HTTPS with the certificate {cert} and the key {key}: "
                          f"{exc.reason or 'not a PEM certificate and its matching key'}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the TLS certificate {cert} or key {key}: {exc.strerror or exc}") from None
    return ctx


def from_args(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The context from ``--tls-cert``/``--tls-key`` over ``ROLLOUTBUS_TLS_*`` (None: plain HTTP)."""
    from foundation.entry import settings_from_args

    s = settings_from_args(TLSSettings, args, FLAGS)
    return server_context(s.tls_cert, s.tls_key)


def scheme(ctx: ssl.SSLContext | None) -> str:
    return "https" if ctx is not None else "http"


def wrap(ctx: ssl.SSLContext, sock: socket.socket, handshake_timeout_s: float = 10.0) -> ssl.SSLSocket:
    """One accepted connection, after its TLS handshake (for a threaded standard-library server: call it in
    the connection's own thread, so that a slow or plain-HTTP client holds up no other). Raises OSError
    (``ssl.SSLError`` included) when the handshake fails."""
    sock.settimeout(handshake_timeout_s)
    tls = ctx.wrap_socket(sock, server_side=True)
    tls.settimeout(None)
    return tls
