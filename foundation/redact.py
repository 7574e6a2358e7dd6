"""URLs as logs, error messages and health answers may show them: credentials replaced by ``***``.

Pure string work, no I/O: ``https://user:key@host/v1`` → ``https://user:***@host/v1``; a lone user part
(often a token: ``https://sk-abc@host``) → ``https://***@host``; the values of query parameters whose names
say secret (``?api_key=...``, ``token``, ``sig``, ...) → ``***``.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["redact_url", "url_secrets"]

MASK = "***"
_SECRET_PARAM = re.compile(r"key|token|secret|passw|pwd|sig|auth|credential", re.I)
_USERINFO = re.compile(r"(?<=//)[^@/\s?#]*@")


def _query(query: str) -> str:
    parts = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        parts.append(f"{name}={MASK}" if eq and value and _SECRET_PARAM.search(name) else part)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """``url`` with its password (or lone user part) and secret query values replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not parseable as a URL (a bad IPv6 host, ...): mask any user part all the same
        return _USERINFO.sub(MASK + "@", url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{hostport}" if colon else f"{MASK}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc, query=_query(parts.query) if parts.query else ""))


def url_secrets(url: str) -> list[str]:
    """The secret parts of ``url`` that :func:`redact_url` hides (raw and as decoded), for scrubbing
    them out of text that may quote them (an upstream's error message)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found: list[str] = []
    if "@" in parts.netloc:
        user, colon, password = parts.netloc.rpartition("@")[0].partition(":")
        found.append(password if colon else user)
    for part in parts.query.split("&"):
        name, eq, value = part.partition("=")
        if eq and value and _SECRET_PARAM.search(name):
            found.append(value)
    return sorted({s for raw in found if raw for s in (raw, unquote(raw))}, key=len, reverse=True)
