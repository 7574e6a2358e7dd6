"""What both policy servers (``rolloutbus serve``'s torch engine and its vLLM gate) answer alike over HTTP: the
version header, the bearer-token guard and the route table. Light: aiohttp only (the vLLM gate never imports torch)."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any, Protocol

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


class PolicyServer(Protocol):
    """What a policy server implements for :func:`openai_app`."""

    token: str | None

    async def start(self, app: web.Application) -> None: ...
    async def stop(self, app: web.Application) -> None: ...
    async def healthz(self, request: web.Request) -> web.StreamResponse: ...
    async def models(self, request: web.Request) -> web.StreamResponse: ...
    async def chat(self, request: web.Request) -> web.StreamResponse: ...
    async def completions(self, request: web.Request) -> web.StreamResponse: ...


MAX_BODY_BYTES = 16 * 1024 * 1024


def openai_app(server: PolicyServer) -> web.Application:
    """Both policy servers' one route table: ``/healthz`` (open), ``/v1/models``, ``/v1/chat/completions`` and
    ``/v1/completions`` behind the bearer token, bodies up to 16 MiB, the server started and stopped with the app."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[bearer_auth(lambda: server.token)])
    app.router.add_get("/healthz", server.healthz)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_post("/v1/completions", server.completions)
    app.on_startup.append(server.start)
    app.on_cleanup.append(server.stop)
    return app


__all__ = ["MAX_BODY_BYTES", "PolicyServer", "VERSION_HEADER", "bearer_auth", "openai_app"]
