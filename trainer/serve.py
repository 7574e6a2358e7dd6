"""A small OpenAI-compatible inference server over the torch policy, with hot reload.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /healthz``.
vLLM-compatible extras the LLM proxy relies on:

* ``"return_token_ids": true`` → ``prompt_token_ids`` (top level for chat, per choice for completions)
  and ``choices[i].token_ids``;
* ``"logprobs": true`` → chat ``choices[i].logprobs.content = [{"token", "logprob", "bytes", "top_logprobs": []}]``, completions
  ``choices[i].logprobs = {"tokens", "token_logprobs"}`` — the behaviour log-probs GRPO needs;
* every response carries the header ``x-rolloutbus-resource-version`` and ``"resource_version"``.

Concurrent requests are batched continuously (:class:`trainer.model.ContinuousBatch`): up to
``max_batch`` requests are in flight, each decode step is one forward pass for all of them, a request
that finishes answers at once and a newcomer joins at the next step (per-request temperature and
length). A :class:`ResourceFollower` watches ``rb.resources``; when a newer version of the resource
appears, its weights are loaded in the background; newcomers then wait while the requests in flight
finish, and the new weights are swapped in with nothing in flight, so a response never mixes versions.
With ``lora_rank`` R (``rolloutbus serve --lora-rank R``), a LoRA trainer's version (``train --lora-rank``, rank up to
R) whose adapters sit on the weights the server holds is served by reading its ``adapter/`` alone: the adapters'
``scaling · B A`` is added to the base weights the server kept of each adapted module (:class:`_Held`), in place with
nothing in flight; the base is loaded first when it is another checkpoint (:func:`trainer.lora.reload_plan`).
``stream=true`` answers with server-sent events (a chunk per token, sent when the request has been
sampled); ``stop`` strings are ignored.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from foundation.errors import RolloutbusError
from trainer.model import ContextTooLong, ContinuousBatch
from trainer.serve_http import VERSION_HEADER, openai_app
from trainer.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt: list[int]
    max_tokens: int
    temperature: float
    future: asyncio.Future[Any] = field(repr=False)


@dataclass
class Policy:
    model: Any
    tok: Tokenizer
    version: int
    uri: str
    patch: Callable[[], None] | None = field(default=None, repr=False)  # run with nothing in flight, before it serves


@dataclass
class _Held:
    """The weights of checkpoint ``uri``, loaded once into ``model``, and what adapters did to them: ``saved`` keeps
    each adapted weight's own values, so every version's adapters go on the base, not on the previous version's."""
    uri: str
    model: Any
    tok: Tokenizer
    saved: dict[str, Any] = field(default_factory=dict)

    def problem(self, deltas: dict[str, Any]) -> str | None:
        """Why ``deltas`` cannot go on this model (a weight it lacks, another shape), or None. Reads shapes only."""
        params = dict(self.model.named_parameters())
        for name, delta in deltas.items():
            if name not in params:
                return f"the model has no {name}"
            if tuple(params[name].shape) != tuple(delta.shape):
                return f"{name} is {tuple(params[name].shape)}, its adapters {tuple(delta.shape)}"
        return None

    def apply(self, deltas: dict[str, Any]) -> None:
        """The model's weights become the base's plus ``deltas``: the weights adapted before and not now go back to
        the base's. In place: call it with nothing in flight."""
        import torch

        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, base in self.saved.items():
                if name not in deltas:
                    params[name].copy_(base)
            for name, delta in deltas.items():
                w = params[name]
                base = self.saved.setdefault(name, w.detach().clone())
                w.copy_((base.float() + delta).to(w.dtype))


class BadRequest(RolloutbusError):
    """A request the server cannot answer (400)."""


class PolicyServer:
    """Holds the current policy, batches generation, swaps weights between batches."""

    def __init__(self, policy: Policy | None, model_name: str = "policy", max_batch: int = 16, default_max_tokens: int = 64,
                 token: str | None = None, lora_rank: int = 0) -> None:
        self.policy = policy
        self.lora_rank = lora_rank  # versions with adapters up to this rank on the weights held: the adapters alone
        self._held = _Held(policy.uri, policy.model, policy.tok) if policy is not None and Path(policy.uri).is_dir() else None
        self.token = token  # with one, every route but /healthz needs ``Authorization: Bearer <token>``
        self.model_name = model_name
        self.max_batch = max_batch
        self.default_max_tokens = default_max_tokens
        self._next: Policy | None = None
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.requests_served = 0
        self.steps_run = 0  # forward passes (each serves every request in flight)

    # ------------------------------------------------------------------ weights

    def offer(self, policy: Policy) -> None:
        """Stage a newer policy (thread-safe: a reference assignment); the worker swaps it in."""
        if self.policy is None or policy.version > self.policy.version:
            self._next = policy

    def load_version(self, uri: str, version: int) -> None:
        """Load a checkpoint directory and stage it (called from the follower thread): its adapters alone when it is a
        LoRA version on the weights held (``lora_rank``), else its full weights."""
        from trainer.lora import read_adapter, reload_plan
        from trainer.model import load_policy

        plan, adapter, base = reload_plan(uri, self._held.uri if self._held else None, self.lora_rank)
        if adapter is not None:  # "adapter": on the weights held; "base": on another checkpoint, loaded first
            held = self._held if plan == "adapter" and self._held is not None else _Held(str(base), *load_policy(base))
            try:
                deltas, _config = read_adapter(adapter)
                problem = held.problem(deltas)
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                problem = f"cannot read them: {exc}"
            if problem is None:
                self._held = held
                self.offer(Policy(held.model, held.tok, version, uri, patch=lambda: held.apply(deltas)))
                log.info("loaded version %d's adapters (%d weights) from %s onto %s; serving it from the next batch",
                         version, len(deltas), adapter, held.uri)
                return
            log.warning("version %d's adapters do not fit the weights of %s (%s): loading its merged weights", version,
                        held.uri, problem)
        model, tok = load_policy(uri)
        self._held = _Held(uri, model, tok)
        self.offer(Policy(model, tok, version, uri))
        log.info("loaded version %d from %s; serving it from the next batch", version, uri)

    def _swap(self) -> None:
        nxt, self._next = self._next, None
        if nxt is not None and (self.policy is None or nxt.version > self.policy.version):
            if nxt.patch is not None:
                try:
                    nxt.patch()
                except Exception:  # checked when staged (shapes, names); the weights held are unknown now: keep serving
                    log.exception("version %d's adapters failed to apply; the next version loads its merged weights", nxt.version)
                    self._held = None
            self.policy = nxt

    # ------------------------------------------------------------------ batching

    async def start(self, app: web.Application | None = None) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run())

    async def stop(self, app: web.Application | None = None) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        """Continuous batching: newcomers join the rows in flight between decode steps, finished rows answer at once."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        pending: list[_Request] = []
        inflight: dict[int, _Request] = {}
        batch: ContinuousBatch | None = None
        policy: Policy | None = None
        keys = itertools.count()
        while True:
            if not inflight and not pending:
                pending.append(await self._queue.get())
                await asyncio.sleep(0.002)  # let concurrent requests arrive and start together
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
            if not inflight:  # weights change only with nothing in flight: a response never mixes versions
                self._swap()
                if self.policy is None:
                    for r in pending:
                        if not r.future.done():
                            r.future.set_exception(BadRequest("no model loaded yet"))
                    pending = []
                    continue
                if batch is None or policy is not self.policy:
                    policy = self.policy
                    batch = ContinuousBatch(policy.model, policy.tok.stop_ids, policy.tok.pad_id)
            assert batch is not None and policy is not None
            admit: list[tuple[int, _Request]] = []
            if self._next is None:  # a newer version is staged: let the rows in flight finish first
                room = self.max_batch - len(inflight)
                admit = [(next(keys), r) for r in pending[:room]]
                pending = pending[room:]
                inflight.update(admit)
            try:
                finished = await loop.run_in_executor(None, self._advance, batch, admit)
            except Exception as exc:  # one bad step must not stop the worker
                for r in inflight.values():
                    if not r.future.done():
                        r.future.set_exception(exc)
                inflight, batch = {}, None
                continue
            self.steps_run += 1
            for key, result in finished:
                r = inflight.pop(key)
                if r.future.done():
                    continue
                if isinstance(result, Exception):
                    r.future.set_exception(result)
                else:
                    r.future.set_result((result, policy))

    @staticmethod
    def _advance(batch: ContinuousBatch, admit: list[tuple[int, _Request]]) -> list[tuple[int, Any]]:
        """Admit newcomers (prefill, first token), then one decode step for every row in flight."""
        done = batch.admit([(k, r.prompt, r.max_tokens, r.temperature) for k, r in admit]) if admit else []
        return done + batch.step()

    async def sample(self, prompt: list[int], max_tokens: int, temperature: float, n: int = 1) -> list[tuple[Any, Policy]]:
        """Queue ``n`` samples of ``prompt``; they share a batch with whatever else is queued."""
        if self._queue is None:
            raise BadRequest("server not started")
        loop = asyncio.get_running_loop()
        futs = []
        for _ in range(n):
            fut: asyncio.Future[Any] = loop.create_future()
            await self._queue.put(_Request(prompt, max_tokens, temperature, fut))
            futs.append(fut)
        return list(await asyncio.gather(*futs))

    # ------------------------------------------------------------------ HTTP

    def app(self) -> web.Application:
        return openai_app(self)

    def _version(self) -> int | None:
        return None if self.policy is None else self.policy.version

    async def healthz(self, request: web.Request) -> web.Response:
        if self._queue is not None and self._queue.empty():
            self._swap()  # idle server: report the version the next request will get
        v = self._version()
        status = 200 if v is not None else 503
        return web.json_response({"status": "ok" if v is not None else "loading", "resource_version": v}, status=status)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "rolloutbus", "resource_version": self._version()}
        ]})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"request body is not JSON: {exc}") from exc
        except LookupError as exc:  # Content-Type: application/json; charset=<one Python does not know>
            raise BadRequest(f"cannot read the request body in its charset: {exc}") from exc
        except web.RequestPayloadError as exc:  # a body its Content-Encoding cannot decode, cut short, ...
            raise BadRequest(f"cannot read the request body: {exc}") from exc
        except RecursionError as exc:  # '[' * 100000: not a ValueError
            raise BadRequest("request body is not JSON: nested too deeply") from exc
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    def _params(self, body: dict[str, Any]) -> tuple[int, float, int]:
        try:
            max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or self.default_max_tokens)
            temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
            n = int(body.get("n") or 1)
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(Infinity)
            raise BadRequest(f"bad sampling parameter: {exc}") from exc
        if max_tokens < 1 or n < 1 or n > 64 or not 0 <= temperature < float("inf"):
            raise BadRequest("need max_tokens >= 1, 1 <= n <= 64, 0 <= temperature (finite)")
        return max_tokens, temperature, n

    def _respond(self, payload: dict[str, Any], version: int) -> web.Response:
        payload["resource_version"] = version
        return web.json_response(payload, headers={VERSION_HEADER: str(version)})

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)

    async def chat(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise BadRequest("messages must be a non-empty list of objects")
            max_tokens, temperature, n = self._params(body)
            policy = self.policy or self._next
            if policy is None:
                raise BadRequest("no model loaded yet")
            try:
                prompt = policy.tok.apply_chat_template(messages)
            except Exception as exc:  # noqa: BLE001 - the client's messages: a HF chat template raises anything
                raise BadRequest(f"messages cannot be rendered by the chat template: {exc}") from exc
            results = await self.sample(prompt, max_tokens, temperature, n)
        except (BadRequest, ContextTooLong) as exc:
            return self._error(400, str(exc))
        version = min(pol.version for _, pol in results)
        if body.get("stream"):
            self.requests_served += 1
            return await self._stream(request, body, prompt, results, version, chat=True)
        choices = []
        for i, (g, pol) in enumerate(results):
            choice: dict[str, Any] = {
                "index": i,
                "message": {"role": "assistant", "content": pol.tok.decode(g.token_ids)},
                "finish_reason": g.finish_reason,
            }
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [
                    chat_logprob(pol.tok.token_str(t), lp) for t, lp in zip(g.token_ids, g.logprobs)
                ]}
            if body.get("return_token_ids"):
                choice["token_ids"] = g.token_ids
            choices.append(choice)
        payload: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name, "choices": choices,
            "usage": _usage(len(prompt), sum(len(g.token_ids) for g, _ in results)),
        }
        if body.get("return_token_ids"):
            payload["prompt_token_ids"] = prompt
        self.requests_served += 1
        return self._respond(payload, version)

    async def completions(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            max_tokens, temperature, n = self._params(body)
            policy = self.policy or self._next
            if policy is None:
                raise BadRequest("no model loaded yet")
            raw = body.get("prompt")
            if isinstance(raw, str):
                prompt = policy.tok.encode(raw, add_bos=policy.tok.bos_id is not None)
            elif isinstance(raw, list) and raw and all(isinstance(t, int) and 0 <= t < len(policy.tok) for t in raw):
                prompt = list(raw)
            else:
                raise BadRequest("prompt must be a string or a non-empty list of token ids in the vocabulary")
            results = await self.sample(prompt, max_tokens, temperature, n)
        except (BadRequest, ContextTooLong) as exc:
            return self._error(400, str(exc))
        version = min(pol.version for _, pol in results)
        if body.get("stream"):
            self.requests_served += 1
            return await self._stream(request, body, prompt, results, version, chat=False)
        choices = []
        for i, (g, pol) in enumerate(results):
            choice: dict[str, Any] = {"index": i, "text": pol.tok.decode(g.token_ids), "finish_reason": g.finish_reason}
            if body.get("logprobs"):
                choice["logprobs"] = {"tokens": [pol.tok.token_str(t) for t in g.token_ids], "token_logprobs": g.logprobs}
            else:
                choice["logprobs"] = None
            if body.get("return_token_ids"):
                choice["prompt_token_ids"] = prompt
                choice["token_ids"] = g.token_ids
            choices.append(choice)
        payload = {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": choices,
            "usage": _usage(len(prompt), sum(len(g.token_ids) for g, _ in results)),
        }
        self.requests_served += 1
        return self._respond(payload, version)


    async def _stream(self, request: web.Request, body: dict[str, Any], prompt: list[int], results: list[tuple[Any, Policy]],
                      version: int, chat: bool) -> web.StreamResponse:
        """Server-sent events as vLLM sends them: one chunk per token (text delta, its id and log-prob), then
        the finish reason, optional usage, ``[DONE]``. The deltas concatenate to exactly the decoded ids.

        Tokens are sent once the request has been sampled (each decode step is one forward pass for all
        requests in flight)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", VERSION_HEADER: str(version)})
        await resp.prepare(request)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_name, "resource_version": version}
        want_ids, want_lp = bool(body.get("return_token_ids")), bool(body.get("logprobs"))

        async def send(payload: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps({**base, **payload}).encode() + b"\n\n")

        first: dict[str, Any] = {"prompt_token_ids": prompt} if want_ids else {}
        for i, (g, pol) in enumerate(results):
            if chat:
                await send({**first, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
                first = {}
            for k, (token, text) in enumerate(zip(g.token_ids, _deltas(pol.tok, g.token_ids))):
                choice: dict[str, Any] = {"index": i, "finish_reason": None}
                if chat:
                    choice["delta"] = {"content": text}
                    if want_lp:
                        choice["logprobs"] = {"content": [chat_logprob(pol.tok.token_str(token), g.logprobs[k])]}
                else:
                    choice["text"] = text
                    if want_lp:
                        choice["logprobs"] = {"tokens": [pol.tok.token_str(token)], "token_logprobs": [g.logprobs[k]]}
                if want_ids:
                    choice["token_ids"] = [token]
                await send({**first, "choices": [choice]})
                first = {}
            end: dict[str, Any] = {"index": i, "finish_reason": g.finish_reason}
            end["delta" if chat else "text"] = {} if chat else ""
            await send({"choices": [end]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({"choices": [], "usage": _usage(len(prompt), sum(len(g.token_ids) for g, _ in results))})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _deltas(tok: Tokenizer, ids: list[int]) -> list[str]:
    """Per-token text pieces whose concatenation is ``tok.decode(ids)``; a piece waits while a multi-byte
    character is incomplete (BPE splits UTF-8), so no chunk carries a replacement character."""
    out, sent = [], ""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k])
        if text.endswith("\ufffd") and k < len(ids) or not text.startswith(sent):
            out.append("")
            continue
        out.append(text[len(sent):])
        sent = text
    full = tok.decode(ids)
    if out and sent != full:  # whatever decoding settled on at the end
        out[-1] += full[len(sent):] if full.startswith(sent) else full
    return out


def chat_logprob(token: str, logprob: float) -> dict[str, Any]:
    """One entry of a chat choice's ``logprobs.content`` in OpenAI's shape (vLLM's too): ``bytes`` and
    ``top_logprobs`` are required fields there, and clients iterate them (the OpenAI Agents SDK does)."""
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def initial_policy(model: str | None, seed: int = 0) -> Policy | None:
    """The policy to serve before any version arrives: a path, 'tiny', or None (wait for rb.resources)."""
    if not model:
        return None
    from trainer.model import build_tiny, load_policy

    if model == "tiny":
        m, tok = build_tiny(seed=seed)
        return Policy(m, tok, 0, "tiny")
    path = Path(model)
    m, tok = load_policy(path)
    version = 0
    manifest = path / "manifest.json"
    if manifest.exists():  # a trainer checkpoint knows which version it is
        try:
            version = int(json.loads(manifest.read_text()).get("version", 0))
        except (ValueError, TypeError):
            version = 0
    return Policy(m, tok, version, str(path))


__all__ = ["BadRequest", "Policy", "PolicyServer", "VERSION_HEADER", "initial_policy"]
