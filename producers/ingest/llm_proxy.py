"""OpenAI-compatible LLM proxy that records token ids: one LLM span per call, per rollout and attempt.

Routes: ``/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions`` and ``.../v1/completions``.
The request goes to the upstream; a ``vllm`` or ``rolloutbus-serve`` upstream is asked for
``return_token_ids`` and ``logprobs``, an ``openai`` one gets the request as the client wrote it (its
spans keep the text and say ``rolloutbus.token_ids_missing``). The response — JSON or SSE stream, at
most ``max_response_bytes`` — is passed back as it comes, hop-by-hop headers dropped, and the token ids,
logprobs, model and serving resource version (``x-rolloutbus-resource-version`` upstream header) are
recorded. The sequence id is the agent's (``x-rolloutbus-sequence-id`` request header); without one the
span goes on unnumbered and the span stage numbers it in arrival order (a counter here would give two
proxy replicas' calls of one attempt the same ids). Upstream errors are passed back faithfully and
recorded with status ERROR. An agent builds its URL and headers with :mod:`producers.proxy` (the agent side).

Credentials: the client's ``Authorization`` is for the proxy and never goes upstream; the upstream gets
the configured API key (``Bearer``), else the upstream URL's ``user:password`` (``Basic``), else none.
Neither ever shows in a log line, an error, a header passed back (a redirect's ``Location`` is shown
redacted) or ``/healthz`` (which answers with counters only).

Telemetry never costs the agent its completion: when the span transport has stopped (a fatal Kafka error:
ACL refusal, refused login), the call is answered all the same, one log line names the rollout and
attempt whose span was not recorded, ``rolloutbus_proxy_spans_unrecorded_total`` counts it, and
``/healthz`` and ``/readyz`` answer 503 (``/livez`` stays 200: the process is alive, restarting it
loses nothing).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import re
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from aiohttp import BasicAuth, ClientError, ClientResponse, ClientSession, ClientTimeout, web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from foundation.errors import ConfigError, ServiceError
from foundation.redact import redact_url, scrub, url_secrets

from producers.context import new_span_id, new_trace_id
from producers.emit import llm_record
from producers.proxy import AGENT_HEADER, SEQUENCE_HEADER, VERSION_HEADER
from producers.transport import SPAN, SpanTransport
from schemas.models import UNNUMBERED

log = logging.getLogger(__name__)

# RFC 9110 7.6.1: meaningful for one connection only, never passed on (nor any header Connection names).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade"})
_REFRAMED = frozenset({"content-length", "content-encoding"})  # the body is decoded and re-framed here
_URL_HEADERS = frozenset({"location", "content-location"})  # URLs an upstream may hand back: shown redacted
UPSTREAM_KINDS = ("vllm", "rolloutbus-serve", "openai")
TOKEN_ID_KINDS = frozenset({"vllm", "rolloutbus-serve"})  # accept return_token_ids / logprobs
MAX_RESPONSE_BYTES = 16 << 20
MISSING_IDS = "rolloutbus.token_ids_missing"  # span attribute: "prompt", "response" or "prompt,response"
_INT = re.compile(r"[0-9]{1,18}")  # ASCII digits that fit an Avro long
_MIN_SCRUBBED = 4  # shorter secrets are not searched for in upstream text (it would garble every match)
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


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_request(raw: bytes, chat: bool) -> dict[str, Any]:
    """The client's body as a JSON object fit to forward; ValueError with a one-line reason otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"request body must be UTF-8 JSON (byte {exc.start} is not UTF-8)") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("request body is nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of message objects")
    elif not isinstance(body.get("prompt"), (str, list, type(None))):
        raise ValueError("prompt must be a string or a list")
    if not isinstance(body.get("model"), (str, type(None))):
        raise ValueError("model must be a string")
    return body


def end_to_end(headers: Iterable[tuple[str, str]], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """``headers`` (name, value pairs) less the hop-by-hop ones, those the Connection header names, and ``drop``."""
    pairs = list(headers)
    named = {t.strip().lower() for k, v in pairs if k.lower() == "connection" for t in v.split(",")}
    gone = HOP_BY_HOP | named | {d.lower() for d in drop}
    return CIMultiDict((k, v) for k, v in pairs if k.lower() not in gone)


def _ids(value: Any) -> list[int]:
    """Token ids as the upstream gave them, or [] when they are not a list of uint32."""
    if isinstance(value, list) and all(type(x) is int and 0 <= x < 1 << 32 for x in value):
        return value
    return []


def _logprob(value: Any) -> float:
    return float(value) if type(value) in (int, float) and math.isfinite(value) else 0.0


def _utf8(text: Any) -> Any:
    """``text`` encodable as UTF-8: lone surrogates (JSON ``\\ud800`` escapes, undecodable header or path
    bytes) become ``?``, so that the span fits its schema."""
    return text.encode("utf-8", "replace").decode("utf-8") if isinstance(text, str) else text


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class _Call:
    """What one upstream call produced, accumulated from a JSON body or SSE chunks (fields of the wrong
    type are left out, so that a strange upstream gives a span without them, not an unencodable one)."""

    def __init__(self) -> None:
        self.prompt_ids: list[int] = []
        self.choices: dict[int, dict[str, Any]] = {}
        self.model: str | None = None
        self.request_id: str | None = None

    def choice(self, i: int) -> dict[str, Any]:
        return self.choices.setdefault(i, {"ids": [], "logprobs": [], "text": [], "finish": None})

    def absorb(self, body: Any, chat: bool) -> None:
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        self.model = _text(body.get("model")) or self.model
        self.request_id = _text(body.get("id")) or self.request_id
        self.prompt_ids = _ids(body.get("prompt_token_ids")) or self.prompt_ids
        choices = body.get("choices")
        for ch in choices if isinstance(choices, list) else []:
            index = ch.get("index", 0) if isinstance(ch, dict) else None
            if type(index) is not int or index < 0:
                continue
            c = self.choice(index)
            self.prompt_ids = _ids(ch.get("prompt_token_ids")) or self.prompt_ids
            c["ids"].extend(_ids(ch.get("token_ids")))
            lp = ch.get("logprobs") if isinstance(ch.get("logprobs"), dict) else {}
            if chat:
                content = lp.get("content")
                c["logprobs"].extend(_logprob(x.get("logprob") if isinstance(x, dict) else None)
                                     for x in (content if isinstance(content, list) else []))
                msg = ch.get("message") or ch.get("delta")
                text = _text(msg.get("content")) if isinstance(msg, dict) else None
            else:
                token_logprobs = lp.get("token_logprobs")
                c["logprobs"].extend(_logprob(x) for x in (token_logprobs if isinstance(token_logprobs, list) else []))
                text = _text(ch.get("text"))
            if text:
                c["text"].append(text)
            c["finish"] = _text(ch.get("finish_reason")) or c["finish"]


class _TooLarge(Exception):
    """The upstream's answer passed the proxy's bound."""


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


def _events_end(data: bytearray, start: int = 0) -> int:
    """Where the last complete server-sent event in ``data`` ends (0: none is complete yet); the
    search begins at ``start`` (what was searched before need not be again)."""
    start = max(start, 0)
    return max((i + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := data.rfind(sep, start)) >= 0), default=0)


def _sse_error(message: str) -> bytes:
    return b"data: " + json.dumps({"error": {"message": message, "type": "upstream_error"}}).encode() + b"\n\n"


class LLMProxy:
    def __init__(self, upstream: str, transport: SpanTransport, *, api_key: str | None = None, timeout_s: float = 600.0,
                 token: str | None = None, kind: str = "vllm", max_response_bytes: int = MAX_RESPONSE_BYTES,
                 metrics_token: str | None = None) -> None:
        """``metrics_token``: the bearer token ``/metrics`` needs (the command passes the proxy's token when it
        listens beyond loopback); None: ``/metrics`` answers anyone who reaches it."""
        if kind not in UPSTREAM_KINDS:
            raise ConfigError(f"upstream kind must be one of {', '.join(UPSTREAM_KINDS)}, got {kind!r}")
        self.shown = redact_url(upstream.rstrip("/"))  # what logs and errors say
        parts = urlsplit(upstream.rstrip("/"))
        url_auth = None
        if "@" in parts.netloc:
            userinfo, _, hostport = parts.netloc.rpartition("@")
            user, _, password = userinfo.partition(":")
            url_auth = BasicAuth(unquote(user), unquote(password)).encode()
            parts = parts._replace(netloc=hostport)
            if api_key:
                log.warning("proxy: the upstream URL's credentials are not sent, the upstream API key is (%s)", self.shown)
        self.upstream = urlunsplit(parts)
        self.token = token  # set: clients must send ``Authorization: Bearer <token>`` (never forwarded upstream)
        self.transport = transport
        self.kind = kind
        self.max_response_bytes = max_response_bytes
        self._upstream_auth = f"Bearer {api_key}" if api_key else url_auth
        secrets = [api_key or "", *url_secrets(upstream), (self._upstream_auth or "").partition(" ")[2]]
        self._secrets = sorted({x for x in secrets if len(x) >= _MIN_SCRUBBED}, key=len, reverse=True)
        self.timeout = ClientTimeout(total=timeout_s)
        self._session: ClientSession | None = None
        self.metrics_token = metrics_token
        self.unrecorded = 0  # spans not handed to the transport, for /healthz (the metric says why)
        self.registry = CollectorRegistry()
        self.m_recorded = Counter("rolloutbus_proxy_spans_recorded", "LLM spans handed to the span transport",
                                  registry=self.registry)
        self.m_unrecorded = Counter("rolloutbus_proxy_spans_unrecorded", "LLM spans not recorded (transport_failed: a fatal "
                                    "Kafka error stopped the transport; queue_full: its queue dropped them)", ["reason"],
                                    registry=self.registry)
        Gauge("rolloutbus_proxy_ready", "1 while the span transport takes records", registry=self.registry).set_function(
            lambda: float(self.transport.accepting()))
        Gauge("rolloutbus_proxy_spool_pending", "Records in the spool not yet delivered", registry=self.registry).set_function(
            lambda: float(self.transport.stats()["spool_pending"]))

    def app(self) -> web.Application:
        # Request bodies are read as sent: a compressed one is refused (415), not inflated here.
        app = web.Application(client_max_size=64 << 20, handler_args={"auto_decompress": False})
        app.router.add_post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions", self.chat)
        app.router.add_post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/completions", self.completions)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.healthz)
        app.router.add_get("/livez", self.livez)
        app.router.add_get("/metrics", self.metrics)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def healthz(self, request: web.Request) -> web.Response:
        """Readiness and the spool's counters, no configuration (the upstream's address stays private): 503
        ``degraded`` once the span transport stopped (calls are still answered, their spans not recorded)."""
        ok = self.transport.accepting()
        return web.json_response({"status": "ok" if ok else "degraded", **self.transport.stats(), "unrecorded": self.unrecorded},
                                 status=200 if ok else 503)

    async def livez(self, request: web.Request) -> web.Response:
        """Liveness: 200 ``ok`` while the server answers (no token needed, nothing told)."""
        return web.Response(text="ok\n")

    async def metrics(self, request: web.Request) -> web.Response:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if self.metrics_token is not None and not hmac.compare_digest(given, f"Bearer {self.metrics_token}".encode()):
            return web.Response(status=401, text="/metrics needs Authorization: Bearer <the proxy token>",
                                headers={"WWW-Authenticate": "Bearer"})
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat/completions", chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completions", chat=False)

    def _scrub(self, text: str) -> str:
        """``text`` (an upstream's message, an exception's) with the upstream credentials masked."""
        return scrub(text, self._secrets)

    def _passed_back(self, headers: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
        """The upstream's headers as the client gets them: end to end only, a redirect's ``Location`` with its
        credentials hidden, no value quoting the upstream's credentials."""
        out = end_to_end(headers, drop=_REFRAMED)
        for name, value in list(out.items()):
            shown = self._scrub(redact_url(value) if name.lower() in _URL_HEADERS else value)
            if shown != value:
                out.popall(name)
                out.add(name, shown)
        return out

    def _too_large(self) -> str:
        return (f"rolloutbus proxy: the upstream's answer is larger than the bound of {self.max_response_bytes} bytes "
                "(--max-response-bytes, ROLLOUTBUS_PROXY_MAX_RESPONSE_BYTES)")

    async def _read_bounded(self, up: ClientResponse) -> bytes:
        if up.content_length is not None and up.content_length > self.max_response_bytes:
            raise _TooLarge
        buf = bytearray()
        async for chunk in up.content.iter_any():
            buf += chunk
            if len(buf) > self.max_response_bytes:
                raise _TooLarge
        return bytes(buf)

    async def _handle(self, request: web.Request, path: str, chat: bool) -> web.StreamResponse:
        if self.token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {self.token}".encode()):
                return web.json_response({"error": {"message": "missing or wrong bearer token", "type": "authentication_error"}},
                                         status=401, headers={"WWW-Authenticate": "Bearer"})
        rollout_id = _utf8(request.match_info["rollout_id"])
        attempt_id = _utf8(request.match_info["attempt_id"])
        if request.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
            return _error(415, "send the request body uncompressed (no Content-Encoding)", "invalid_request_error")
        try:
            body = parse_request(await request.read(), chat)
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request_error")
        agent_name = _utf8(request.headers.get(AGENT_HEADER)) or None
        given = (request.headers.get(SEQUENCE_HEADER) or "").strip()
        if given and not _INT.fullmatch(given):
            return _error(400, f"{SEQUENCE_HEADER} must be a non-negative integer below 10^18", "invalid_request_error")
        seq = int(given) if given else UNNUMBERED
        if self.kind in TOKEN_ID_KINDS:
            # Ask for what the trainer needs (vLLM's API; rolloutbus serve speaks it too).
            body["return_token_ids"] = True
            body["logprobs"] = True if chat else (body.get("logprobs") or 1)
        try:
            data = json.dumps(body).encode()
            prompt = prompt_text(body, chat)
        except RecursionError:
            return _error(400, "request body is nested too deeply", "invalid_request_error")
        stream = bool(body.get("stream"))
        # The client's own Authorization (ours, or one it meant for the upstream) never goes on.
        headers = {"Content-Type": "application/json"}
        if self._upstream_auth:
            headers["Authorization"] = self._upstream_auth
        if self._session is None:
            self._session = ClientSession(timeout=self.timeout)
        start = time.time_ns()
        call = _Call()
        meta = {"rollout_id": rollout_id, "attempt_id": attempt_id, "seq": seq, "start": start, "chat": chat,
                "request_model": body.get("model"), "path": path, "agent_name": agent_name, "prompt": prompt}
        try:
            # Redirects are not followed: the upstream's credential goes to the upstream only.
            async with self._session.post(f"{self.upstream}/{path}", data=data, headers=headers, allow_redirects=False) as up:
                version = up.headers.get(VERSION_HEADER)
                meta["version"] = int(version) if version and _INT.fullmatch(version.removeprefix("-")) else None
                out_headers = self._passed_back(up.headers.items())
                if stream and up.status < 300 and up.content_type == "text/event-stream":
                    return await self._relay_sse(request, up, out_headers, call, meta)
                raw = await self._read_bounded(up)
                if up.status >= 300:
                    text = self._scrub(raw.decode(errors="replace"))
                    self._record(call, meta, error=f"upstream HTTP {up.status}: {text[:500]}")
                    body_out = text.encode() if self._secrets and any(x.encode() in raw for x in self._secrets) else raw
                    return web.Response(status=up.status, body=body_out, headers=out_headers)
                try:
                    call.absorb(json.loads(raw), chat)
                    self._record(call, meta)
                except (ValueError, RecursionError) as exc:
                    self._record(call, meta, error=f"upstream answered with a body that is not a completion: {exc}")
                return web.Response(status=up.status, body=raw, headers=out_headers)
        except _TooLarge:
            self._record(call, meta, error=self._too_large())
            return _error(502, self._too_large(), "upstream_error")
        except (ClientError, TimeoutError) as exc:
            reason = self._scrub(f"{type(exc).__name__}: {exc}")
            self._record(call, meta, error=f"upstream unreachable: {reason}")
            return _error(502, f"rolloutbus proxy: upstream {self.shown} unreachable: {reason}", "upstream_error")

    async def _relay_sse(self, request: web.Request, up: ClientResponse, headers: CIMultiDict[str], call: _Call,
                         meta: dict[str, Any]) -> web.StreamResponse:
        """Pass the upstream's event stream on as it comes, reading it into ``call``; past the bound, or
        when the upstream breaks off, the stream ends with an error event and the span says why."""
        resp = web.StreamResponse(status=up.status, headers=headers)
        await resp.prepare(request)
        pending = bytearray()  # received, not passed on yet: its last event is not complete
        total = 0
        error: str | None = None
        try:
            try:
                async for chunk in up.content.iter_any():
                    total += len(chunk)
                    if total > self.max_response_bytes:
                        error = self._too_large()
                        break
                    pending += chunk
                    if cut := _events_end(pending, len(pending) - len(chunk) - 3):
                        await self._pass_on(resp, bytes(pending[:cut]), call, meta["chat"])
                        del pending[:cut]
            except ConnectionResetError:
                raise
            except (ClientError, TimeoutError) as exc:
                error = f"upstream stream broke off: {self._scrub(f'{type(exc).__name__}: {exc}')}"
            if error is None:
                await self._pass_on(resp, bytes(pending), call, meta["chat"])
            else:  # the client gets whole events, then one that says why the stream ends here
                await resp.write(_sse_error(error))
            await resp.write_eof()
        except ConnectionResetError:
            error = error or "the client went away before the end of the stream"
        self._record(call, meta, error=error)
        return resp

    async def _pass_on(self, resp: web.StreamResponse, events: bytes, call: _Call, chat: bool) -> None:
        if events:
            await resp.write(events)
            for line in events.splitlines():
                self._sse_line(line, call, chat)

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
        except (ValueError, RecursionError):
            log.debug("unparsable SSE chunk %r", data[:200])

    def _record(self, call: _Call, meta: dict[str, Any], error: str | None = None) -> None:
        """One span per choice (normally one): token ids, logprobs, model, version, sequence id."""
        end = time.time_ns()
        choices = call.choices or {0: {"ids": [], "logprobs": [], "text": [], "finish": None}}
        seq = meta["seq"]
        spans = []
        for i in sorted(choices):
            c = choices[i]
            attrs = {
                "gen_ai.operation.name": "chat" if meta["chat"] else "text_completion",
                "http.route": meta["path"],
                "gen_ai.prompt": _utf8(meta["prompt"]),
                "gen_ai.completion": _utf8("".join(c["text"])),
            }
            if meta.get("request_model"):
                attrs["gen_ai.request.model"] = _utf8(meta["request_model"])
            if i:
                attrs["gen_ai.choice.index"] = str(i)
            missing = [what for what, ids in (("prompt", call.prompt_ids), ("response", c["ids"])) if not ids]
            if missing and not error:
                # Text only (an openai upstream, or one that ignored the ask): not trainable as token ids.
                attrs[MISSING_IDS] = ",".join(missing)
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
                "status_message": _utf8(error) if error else None,
                "attributes": attrs,
                "events": [],
                "resource": {"service.name": "rolloutbus-proxy"},
                "llm": llm_record(
                    call.prompt_ids, c["ids"], [min(0.0, float(x)) for x in logprobs],
                    model=_utf8(call.model or meta.get("request_model")), resource_version=meta.get("version"),
                    request_id=_utf8(call.request_id), finish_reason=_utf8(c["finish"]),
                ),
                "reward": None,
                "tool": None,
                "agent_name": meta.get("agent_name"),
            }
            spans.append(span)
        self._emit(spans, meta)

    def _emit(self, spans: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        """Hand ``spans`` to the transport. A stopped transport costs the agent nothing: the call is answered,
        and the loss is one log line and a count (``/healthz`` and ``/readyz`` answer 503 meanwhile)."""
        for n, span in enumerate(spans):
            try:
                recorded = self.transport.emit(meta["rollout_id"], SPAN, span)
            except ServiceError as exc:
                self.unrecorded += len(spans) - n
                self.m_unrecorded.labels("transport_failed").inc(len(spans) - n)
                log.error("proxy: the LLM span of rollout %s attempt %s (sequence %s) was not recorded, the call was answered: %s",
                          meta["rollout_id"], meta["attempt_id"], meta["seq"], exc)
                return
            if recorded:
                self.m_recorded.inc()
            else:  # dropped by a full queue: the transport warns of it
                self.unrecorded += 1
                self.m_unrecorded.labels("queue_full").inc()


__all__ = ["LLMProxy", "parse_request", "end_to_end", "prompt_text", "UPSTREAM_KINDS", "MAX_RESPONSE_BYTES", "MISSING_IDS"]
