"""What both policy servers (``rolloutbus serve``'s torch engine and its vLLM gate) answer alike over HTTP: the
version header and the bearer-token guard. Light: aiohttp only (the vLLM gate never imports torch)."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from aiohttp import web

VERSION_HEADER = "x-rolloutbus-resource-version"


def bearer_auth(token: Callable[[], str | None]) -> Any:
    """A middleware: with a token, every route but ``/healthz`` needs ``Authorization: Bearer <token>`` (401 otherwise)."""

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        want = token()
        if want is not None and request.path != "/healthz":
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {want}".encode()):
                return web.json_response({"error": {"message": "missing or wrong bearer token", "type": "authentication_error"}},
                                         status=401, headers={"WWW-Authenticate": 'Bearer realm="rolloutbus serve"'})
        return await handler(request)

    return guard


__all__ = ["VERSION_HEADER", "bearer_auth"]
