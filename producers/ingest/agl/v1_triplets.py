"""Agent Lightning 1.0.2's events query (``GET /api/rollouts/{id}/events``): its ``format=triplet`` trimming and
its dedupe of model requests by prompt, as its server does them (``agentlightning/server/routes/events.py``). Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def _choice_logprobs(choice: Mapping[str, Any]) -> list[float] | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping):
        return None
    if isinstance(lp.get("content"), list):
        raw = []
        for item in lp["content"]:
            if not isinstance(item, Mapping) or "logprob" not in item:
                return None
            raw.append(item["logprob"])
    elif isinstance(lp.get("token_logprobs"), list):
        raw = list(lp["token_logprobs"])
    else:
        return None
    out = []
    for v in raw:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(f):
            return None
        out.append(f)
    return out


def trim_model_request(data: Mapping[str, Any]) -> dict[str, Any]:
    """A model_request event's data → its prompt and response token ids, logprobs, server, status."""
    resp = data.get("response")
    prompt: Any = []
    response: Any = []
    logprobs = None
    if isinstance(resp, Mapping):
        prompt = resp.get("prompt_token_ids", [])
        choices = resp.get("choices", [])
        if choices and isinstance(choices, list) and isinstance(choices[0], Mapping):
            if not prompt:
                prompt = choices[0].get("prompt_token_ids", [])
            response = choices[0].get("token_ids", [])
            logprobs = _choice_logprobs(choices[0])
    elif isinstance(resp, list):
        response = []
        for chunk in resp:
            if not isinstance(chunk, Mapping):
                continue
            if not prompt and chunk.get("prompt_token_ids"):
                prompt = chunk["prompt_token_ids"]
            choices = chunk.get("choices", [])
            if choices and isinstance(choices, list) and isinstance(choices[0], Mapping) and choices[0].get("token_ids"):
                response.extend(choices[0]["token_ids"])
    srv = data.get("server", {})
    srv = srv if isinstance(srv, Mapping) else {}
    out: dict[str, Any] = {"prompt_token_ids": prompt, "response_token_ids": response, "response_log_probs": logprobs,
                           "server": {"model": srv.get("model"), "version": srv.get("version")}}
    if data.get("routed_experts") is not None:
        out["routed_experts"] = data["routed_experts"]
    for key in ("http_status", "status"):
        if key in data:
            out[key] = data[key]
    if isinstance(resp, Mapping) and "error" in resp:
        out["error"] = resp["error"]
    return out


def trim(event: Mapping[str, Any]) -> dict[str, Any]:
    """One event in the triplet format: model requests trimmed, rewards to their value (and source, reason)."""
    data = event.get("data") or {}
    if event["event_type"] == "model_request":
        data = trim_model_request(data)
    elif event["event_type"] == "reward":
        data = {"value": data.get("value"), **{k: data[k] for k in ("source", "reason") if k in data}}
    return {**event, "data": data}


def dedupe_by_prompt(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The last model request of each valid (a non-empty list of ints) prompt; the others all kept."""
    last: dict[tuple[int, ...], int] = {}
    kept: set[int] = set()
    for i, e in enumerate(events):
        if e["event_type"] != "model_request":
            continue
        ids = e["data"].get("prompt_token_ids", [])
        if not isinstance(ids, list) or not ids or any(type(t) is not int for t in ids):
            kept.add(i)
            continue
        last[tuple(ids)] = i
    kept.update(last.values())
    return [dict(e) for i, e in enumerate(events) if e["event_type"] != "model_request" or i in kept]


def events_reply(events: Sequence[Mapping[str, Any]], *, triplet: bool, routed_experts: bool = True) -> list[dict[str, Any]]:
    """Its events query's answer for the stored events."""
    out = [dict(e) for e in events]
    if triplet:
        out = dedupe_by_prompt([trim(e) for e in out])
    if not routed_experts:
        out = [{**e, "data": {k: v for k, v in e["data"].items() if k != "routed_experts"}}
               if e["event_type"] == "model_request" else e for e in out]
    return out


__all__ = ["trim", "trim_model_request", "dedupe_by_prompt", "events_reply"]
