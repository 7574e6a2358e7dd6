"""URLs as logs, error messages and health answers may show them: credentials replaced by ``***``.

The one redactor of the project: upstream URLs, ClickHouse DSNs, scrape targets, redirect locations.

Pure string work, no I/O: ``https://user:key@host/v1`` → ``https://user:***@host/v1``; a lone user part
(often a token: ``https://sk-abc@host``) → ``https://***@host``; the values of query parameters whose names
say secret (``?api_key=...``, ``token``, ``sig``, ...) → ``***``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["redact_url", "url_secrets", "scrub"]

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
    netloc, query = parts.netloc, _query(parts.query)
    if "@" not in netloc and query == parts.query:
        return url  # nothing to hide: as given (``chdb:///path`` would lose a slash in a round trip)
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{hostport}" if colon else f"{MASK}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc, query=query))


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


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` (an error message, an upstream's answer) with each of ``secrets`` replaced by ``***``, the
    longest first (so that one secret inside another leaves no part of it behind)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
