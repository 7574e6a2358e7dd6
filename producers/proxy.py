"""OpenAI-compatible LLM proxy that records token ids: one LLM span per call, per rollout and attempt.

Routes: ``/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions`` and ``.../v1/completions``.
The request goes to the upstream (vLLM in production) with ``return_token_ids`` and ``logprobs`` turned
on; the response — JSON or SSE stream — is passed back as it comes, and the token ids, logprobs, model
and serving resource version (``x-rolloutbus-resource-version`` upstream header) are recorded. The
sequence id is the agent's (``x-rolloutbus-sequence-id`` request header); without one the span goes
on unnumbered and the span stage numbers it in arrival order (a counter here would give two proxy
replicas' calls of one attempt the same ids). Upstream errors are passed back faithfully and
recorded with status ERROR.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web

from producers.context import current_rollout, new_span_id, new_trace_id
from producers.emit import llm_record
from producers.transport import SPAN, SpanTransport
from schemas.models import UNNUMBERED

log = logging.getLogger(__name__)

SEQUENCE_HEADER = "x-rolloutbus-sequence-id"
AGENT_HEADER = "x-rolloutbus-agent-name"
VERSION_HEADER = "x-rolloutbus-resource-version"
_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}
PROMPT_TEXT_CHARS = 8000  # the prompt's text kept on the span (its end: the latest turns); the ids are kept whole


def prompt_text(body: dict[str, Any], chat: bool, limit: int = PROMPT_TEXT_CHARS) -> str:
    """The request's prompt as text for ``gen_ai.prompt``: chat messages as ``role: content`` lines (text
    parts of multi-part content), or the completion prompt; cut to its last ``limit`` characters."""
    if chat:
        lines = []
        for m in body.get("messages") or []:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            lines.append(f"{m.get('role', '?')}: {content if content is not None else ''}")
        text = "\n".join(lines)
    else:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def proxy_url(base: str) -> str:
    """The OpenAI base URL (``.../v1``) of the proxy at ``base`` for the current rollout attempt."""
    ctx = current_rollout()
    if ctx is None:
        from foundation.errors import RolloutContextError

        raise RolloutContextError("proxy_url() needs an open rollout: call it inside `with rollout(...)`")
    return f"{base.rstrip('/')}/rollout/{ctx.rollout_id}/attempt/{ctx.attempt_id}/v1"


def proxy_token() -> str | None:
    """The proxy's bearer token for agents (``ROLLOUTBUS_LLM_PROXY_TOKEN``; the proxy's ``ROLLOUTBUS_PROXY_TOKEN``)."""
    return os.environ.get("ROLLOUTBUS_LLM_PROXY_TOKEN") or None


def proxy_headers() -> dict[str, str]:
    """Headers that give the next LLM call the current attempt's next sequence id (and the proxy's token)."""
    ctx = current_rollout()
    token = proxy_token()
    if ctx is None:
        return {"Authorization": f"Bearer {token}"} if token else {}
    headers = {SEQUENCE_HEADER: str(ctx.next_sequence_id())}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if ctx.agent_name:
        # The proxy records the LLM span; the agent's name makes it selectable (agent_match).
        headers[AGENT_HEADER] = ctx.agent_name
    return headers


class _Call:
    """What one upstream call produced, accumulated from a JSON body or SSE chunks."""

    def __init__(self) -> None:
        self.prompt_ids: list[int] = []
        self.choices: dict[int, dict[str, Any]] = {}
        self.model: str | None = None
        self.request_id: str | None = None

    def choice(self, i: int) -> dict[str, Any]:
        return self.choices.setdefault(i, {"ids": [], "logprobs": [], "text": [], "finish": None})

    def absorb(self, body: dict[str, Any], chat: bool) -> None:
        self.model = body.get("model") or self.model
        self.request_id = body.get("id") or self.request_id
        if body.get("prompt_token_ids"):
            self.prompt_ids = list(body["prompt_token_ids"])
        for ch in body.get("choices") or []:
            c = self.choice(int(ch.get("index", 0)))
            if ch.get("prompt_token_ids"):
                self.prompt_ids = list(ch["prompt_token_ids"])
            c["ids"].extend(ch.get("token_ids") or [])
            lp = ch.get("logprobs") or {}
            if chat:
                c["logprobs"].extend(x.get("logprob", 0.0) for x in (lp.get("content") or []))
                msg = ch.get("message") or ch.get("delta") or {}
                if msg.get("content"):
                    c["text"].append(msg["content"])
            else:
                c["logprobs"].extend(x if x is not None else 0.0 for x in (lp.get("token_logprobs") or []))
                if ch.get("text"):
                    c["text"].append(ch["text"])
            if ch.get("finish_reason"):
                c["finish"] = ch["finish_reason"]


class LLMProxy:
    def __init__(self, upstream: str, transport: SpanTransport, *, api_key: str | None = None, timeout_s: float = 600.0,
                 token: str | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.token = token  # set: clients must send ``Authorization: Bearer <token>`` (not forwarded upstream)
        self.transport = transport
        self.api_key = api_key
        self.timeout = ClientTimeout(total=timeout_s)
        self._session: ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions", self.chat)
        app.router.add_post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/completions", self.completions)
        app.router.add_get("/healthz", self.healthz)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "upstream": self.upstream, **self.transport.stats()})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat/completions", chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completions", chat=False)

    async def _handle(self, request: web.Request, path: str, chat: bool) -> web.StreamResponse:
        if self.token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return web.json_response({"error": {"message": "missing or wrong bearer token", "type": "authentication_error"}},
                                         status=401, headers={"WWW-Authenticate": "Bearer"})
        rollout_id = request.match_info["rollout_id"]
        attempt_id = request.match_info["attempt_id"]
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            return web.json_response({"error": {"message": "request body must be a JSON object", "type": "invalid_request_error"}}, status=400)
        agent_name = request.headers.get(AGENT_HEADER) or None
        given = (request.headers.get(SEQUENCE_HEADER) or "").strip()
        if given and not given.isdigit():
            return web.json_response({"error": {"message": f"{SEQUENCE_HEADER} must be a non-negative integer",
                                                "type": "invalid_request_error"}}, status=400)
        seq = int(given) if given else UNNUMBERED
        # Ask for what the trainer needs (vLLM's API).
        body["return_token_ids"] = True
        if chat:
            body["logprobs"] = True
        else:
            body["logprobs"] = body.get("logprobs") or 1
        stream = bool(body.get("stream"))
        headers = {"Content-Type": "application/json"}
        # With our own token configured, the client's Authorization is for us, never for the upstream.
        client_auth = request.headers.get("Authorization") if self.token is None else None
        auth = client_auth or (f"Bearer {self.api_key}" if self.api_key else None)
        if auth:
            headers["Authorization"] = auth
        if self._session is None:
            self._session = ClientSession(timeout=self.timeout)
        start = time.time_ns()
        call = _Call()
        meta = {"rollout_id": rollout_id, "attempt_id": attempt_id, "seq": seq, "start": start, "chat": chat,
                "request_model": body.get("model"), "path": path, "agent_name": agent_name, "prompt": prompt_text(body, chat)}
        try:
            async with self._session.post(f"{self.upstream}/{path}", json=body, headers=headers) as up:
                version = up.headers.get(VERSION_HEADER)
                meta["version"] = int(version) if version and version.lstrip("-").isdigit() else None
                out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
                if up.status >= 400:
                    raw = await up.read()
                    self._record(call, meta, error=f"upstream HTTP {up.status}: {raw[:500].decode(errors='replace')}")
                    return web.Response(status=up.status, body=raw, headers=out_headers)
                if stream and up.content_type == "text/event-stream":
                    resp = web.StreamResponse(status=up.status, headers=out_headers)
                    await resp.prepare(request)
                    buf = b""
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                        buf += chunk
                        while b"\n" in buf:
                            line, buf = buf.split(b"\n", 1)
                            self._sse_line(line, call, chat)
                    if buf:
                        self._sse_line(buf, call, chat)
                    await resp.write_eof()
                    self._record(call, meta)
                    return resp
                raw = await up.read()
                try:
                    call.absorb(json.loads(raw), chat)
                    self._record(call, meta)
                except (ValueError, AttributeError, TypeError) as exc:
                    self._record(call, meta, error=f"upstream answered with a body that is not a completion: {exc}")
                return web.Response(status=up.status, body=raw, headers=out_headers)
        except (ClientError, TimeoutError) as exc:
            self._record(call, meta, error=f"upstream unreachable: {type(exc).__name__}: {exc}")
            return web.json_response(
                {"error": {"message": f"rolloutbus proxy: upstream {self.upstream} unreachable: {exc}", "type": "upstream_error"}},
                status=502,
            )

    @staticmethod
    def _sse_line(line: bytes, call: _Call, chat: bool) -> None:
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]" or not data:
            return
        try:
            call.absorb(json.loads(data), chat)
        except (ValueError, AttributeError, TypeError):
            log.debug("unparsable SSE chunk %r", data[:200])

    def _record(self, call: _Call, meta: dict[str, Any], error: str | None = None) -> None:
        """One span per choice (normally one): token ids, logprobs, model, version, sequence id."""
        end = time.time_ns()
        choices = call.choices or {0: {"ids": [], "logprobs": [], "text": [], "finish": None}}
        seq = meta["seq"]
        for i in sorted(choices):
            c = choices[i]
            attrs = {
                "gen_ai.operation.name": "chat" if meta["chat"] else "text_completion",
                "http.route": meta["path"],
                "gen_ai.prompt": meta["prompt"],
                "gen_ai.completion": "".join(c["text"]),
            }
            if meta.get("request_model"):
                attrs["gen_ai.request.model"] = str(meta["request_model"])
            if i:
                attrs["gen_ai.choice.index"] = str(i)
            logprobs = c["logprobs"] if len(c["logprobs"]) == len(c["ids"]) else []
            span = {
                "span_id": new_span_id(),
                "trace_id": new_trace_id(),
                "parent_id": None,
                "rollout_id": meta["rollout_id"],
                "attempt_id": meta["attempt_id"],
                # The agent's number is the first choice's; the others go unnumbered (numbered by the
                # span stage after it), never into numbers the agent may hand out next.
                "sequence_id": seq if i == 0 else UNNUMBERED,
                "name": "chat.completions" if meta["chat"] else "completions",
                "kind": "llm",
                "start_time_ns": meta["start"],
                "end_time_ns": end,
                "status_code": "ERROR" if error else "OK",
                "status_message": error,
                "attributes": attrs,
                "events": [],
                "resource": {"service.name": "rolloutbus-proxy"},
                "llm": llm_record(
                    call.prompt_ids, c["ids"], [min(0.0, float(x)) for x in logprobs],
                    model=call.model or meta.get("request_model"), resource_version=meta.get("version"),
                    request_id=call.request_id, finish_reason=c["finish"],
                ),
                "reward": None,
                "tool": None,
                "agent_name": meta.get("agent_name"),
            }
            self.transport.emit(meta["rollout_id"], SPAN, span)


__all__ = ["LLMProxy", "proxy_url", "proxy_headers", "proxy_token", "SEQUENCE_HEADER", "VERSION_HEADER"]
