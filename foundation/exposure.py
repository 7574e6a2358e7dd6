"""Secure by default: a server asked to listen beyond this machine must have credentials, or be told ``--insecure``.

:func:`check_listen` is pure (address parsing only); every HTTP entry point calls it once, after its settings.
"""

from __future__ import annotations

import ipaddress
import logging

from foundation.errors import ConfigError

log = logging.getLogger("rolloutbus.exposure")

__all__ = ["check_listen", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` (and ``*.localhost``), 127.0.0.0/8 and ``::1``; False for anything else,
    the wildcards (``0.0.0.0``, ``::``, empty) and other host names included."""
    h = host.strip().strip("[]").lower().rstrip(".")
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def check_listen(host: str, credentials: bool, insecure: bool, variable: str, command: str) -> None:
    """Refuse (:class:`ConfigError`, one line) to listen on a non-loopback ``host`` without ``credentials``.

    ``variable`` is what to set to give credentials; with ``insecure`` the server starts anyway and a loud
    WARNING says so.
    """
    if credentials or is_loopback(host):
        return
    shown = host or "every interface"
    if insecure:
        log.warning("INSECURE: %s listens on %s with no credentials (--insecure): anyone who can reach it "
                    "may use it; set %s", command, shown, variable)
        return
    raise ConfigError(f"{command} will not listen on {shown} without credentials: set {variable}, "
                      "bind 127.0.0.1, or pass --insecure (ROLLOUTBUS_INSECURE=true) to run open on purpose")
