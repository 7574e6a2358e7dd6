"""Pure mapping of an OpenTelemetry span (plain Python values) onto our Avro ``Span`` dict.

Shared by the in-process OTel exporter and the OTLP gateway. Understands the GenAI semantic
conventions (``gen_ai.*``) and Agent Lightning's attribute names unchanged
(``agentlightning.rollout_id``, ``agentlightning.reward.{i}.name/.value``, ``prompt_token_ids``, ...).
No I/O, no Kafka, no OTel SDK import.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.codec import pack_array, pack_floats, pack_tokens

ROLLOUT_KEYS = ("agentlightning.rollout_id", "rolloutbus.rollout_id")
ATTEMPT_KEYS = ("agentlightning.attempt_id", "rolloutbus.attempt_id")
SEQUENCE_KEYS = ("agentlightning.span_sequence_id", "rolloutbus.sequence_id")
AGENT_KEYS = ("rolloutbus.agent_name", "agentlightning.agent_name", "gen_ai.agent.name", "agent.name")
AGL_ANNOTATION = "agentlightning.annotation"
AGENTOPS_OUTPUT_KEYS = ("agentops.task.output", "agentops.entity.output")
# Token ids and response id as Agent Lightning's adapter reads them; the plain keys first (they win),
# then the Weave tracer's (``agentlightning.operation.output.*``).
PROMPT_IDS_KEYS = ("prompt_token_ids", "gen_ai.prompt.token_ids", "agentlightning.operation.output.prompt_token_ids")
RESPONSE_IDS_KEYS = (
    "response_token_ids",
    "gen_ai.response.token_ids",
    "agentlightning.operation.output.response_token_ids.0",
    "agentlightning.operation.output.choices.0.token_ids",
    "agentlightning.operation.output.choices.0.provider_specific_fields.token_ids",
)
RESPONSE_ID_KEYS = ("gen_ai.response.id", "agentlightning.operation.output.id")
_REWARD_RE = re.compile(r"^agentlightning\.reward\.(\d+)\.(name|value)$")
# First-class on the Span; not repeated in the attribute map.
_TOKEN_KEYS = frozenset(PROMPT_IDS_KEYS + RESPONSE_IDS_KEYS + ("response_logprobs",))
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR", "STATUS_CODE_UNSET": "UNSET", "STATUS_CODE_OK": "OK", "STATUS_CODE_ERROR": "ERROR"}


class MappingError(ValueError):
    """The span cannot become one of ours (no rollout attribution, bad token ids, ...)."""


@dataclass
class Attribution:
    """Where a span belongs when its attributes do not say (the current rollout)."""

    rollout_id: str | None = None
    attempt_id: str | None = None
    sequence_id: int | None = None
    agent_name: str | None = None
    resource_version: int | None = None
    resource: dict[str, str] = field(default_factory=dict)


def attr_str(value: Any) -> str:
    t = type(value)
    if t is str:
        return value  # type: ignore[no-any-return]
    if t is int:
        return str(value)  # what json.dumps writes for an int, at a tenth of its cost
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value, default=str, ensure_ascii=False)


def _first(attrs: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for k in keys:
        v = attrs.get(k)
        if v is not None and v != "":
            return v
    return None


def _int_list(value: Any, what: str) -> list[int]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise MappingError(f"{what} is not a list of token ids: {value[:60]!r}") from exc
    try:
        out = [int(v) for v in value]
    except (TypeError, ValueError) as exc:
        raise MappingError(f"{what} is not a list of token ids") from exc
    if out and (min(out) < 0 or max(out) > 0xFFFFFFFF):
        raise MappingError(f"{what} holds token ids outside 0..2**32-1")
    return out


def _packed(code: str, value: Any, what: str) -> bytes:
    """A list of token ids (``I``) or numbers (``f``) packed; one C call for a list of plain ints or
    floats (``array`` checks the range), :func:`_int_list` / :func:`_float_list` for anything else."""
    if type(value) is list:
        try:
            return pack_array(code, value)
        except (TypeError, OverflowError):
            pass  # a string, a float among token ids, an id out of range: the general path says which
    return pack_tokens(_int_list(value, what)) if code == "I" else pack_floats(_float_list(value, what))


def _float_list(value: Any, what: str) -> list[float]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise MappingError(f"{what} is not a list of numbers") from exc
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError) as exc:
        raise MappingError(f"{what} is not a list of numbers") from exc


_NOT_AGENTOPS = object()


def _agentops_reward(attrs: Mapping[str, Any]) -> Any:
    """AgentOps' reward operation output ``{"type": "reward", "value": x}`` (as Agent Lightning's
    ``get_reward_value`` reads it): the value, ``None`` for a null value, or ``_NOT_AGENTOPS``."""
    for key in AGENTOPS_OUTPUT_KEYS:
        out = attrs.get(key)
        if isinstance(out, str):
            try:
                out = json.loads(out)
            except ValueError:
                out = None
        if isinstance(out, Mapping) and out.get("type") == "reward":
            value = out.get("value")
            if value is None:
                return None
            try:
                return float(value)
            except (TypeError, ValueError) as exc:
                raise MappingError(f"{key} reward value {value!r} is not a number") from exc
    return _NOT_AGENTOPS


def _rewards(attrs: Mapping[str, Any], name: str | None = None) -> dict[str, Any] | None:
    """The reward a span carries, in any encoding Agent Lightning's ``get_reward_value`` accepts:
    ``agentlightning.reward.{i}.name/value`` (index 0 primary), AgentOps' ``agentops.task.output`` /
    ``agentops.entity.output`` JSON, the 0.2 ``reward`` attribute on an annotation span; and ours."""
    slots: dict[int, dict[str, Any]] = {}
    for k, v in attrs.items():
        m = _REWARD_RE.match(k)
        if m:
            slots.setdefault(int(m.group(1)), {})[m.group(2)] = v
    dims: dict[str, float] = {}
    primary = None
    for i in sorted(slots):
        dim = str(slots[i].get("name") or ("reward" if i == 0 else f"reward_{i}"))
        try:
            value = float(slots[i]["value"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MappingError(f"agentlightning.reward.{i}.value is missing or not a number") from exc
        dims[dim] = value
        primary = primary or dim
    if not dims:
        agentops = _agentops_reward(attrs)
        if agentops is not _NOT_AGENTOPS:
            if agentops is None:
                return None  # {"type": "reward", "value": null}: a reward operation that gave no reward
            dims, primary = {"reward": agentops}, "reward"
    if not dims:
        # The bare ``reward`` attribute is Agent Lightning 0.2's, and only on its annotation spans.
        keys = ("rolloutbus.reward", "agentlightning.reward", "reward") if name in (None, AGL_ANNOTATION) else (
            "rolloutbus.reward", "agentlightning.reward")
        raw = _first(attrs, keys)
        if raw is None:
            return None
        try:
            value = float(raw)
        except (TypeError, ValueError):
            # Agent Lightning also writes a JSON object {"name": value, ...}.
            try:
                obj = json.loads(raw) if isinstance(raw, str) else raw
                dims = {str(k): float(v) for k, v in dict(obj).items()}
            except (TypeError, ValueError) as exc:
                raise MappingError(f"reward attribute {raw!r} is not a number") from exc
            primary = str(attrs.get("rolloutbus.reward.primary") or next(iter(dims), "reward"))
        else:
            primary = "reward"
            dims = {primary: value}
    if any(not math.isfinite(v) for v in dims.values()):
        raise MappingError(f"non-finite reward in {dims}")
    primary = str(attrs.get("rolloutbus.reward.primary") or primary)
    if primary not in dims:
        raise MappingError(f"primary reward {primary!r} is not one of {sorted(dims)}")
    return {"value": dims[primary], "primary": primary, "dimensions": dims}


def agent_name_of(name: str, attrs: Mapping[str, Any]) -> str | None:
    """The agent a span stands for, by the rules of Agent Lightning's ``TraceTree.agent_name``
    (OpenAI Agents SDK, AgentOps ``@agent``, AutoGen, LangGraph, agent-framework, Weave)."""
    candidates = (
        attrs.get("agent.name"),
        attrs.get("operation.name") if attrs.get("agentops.span.kind") == "agent" else None,
        attrs.get("recipient_agent_type"),
        attrs.get("langchain.chain.type"),
        attrs.get("executor.id"),
        attrs.get("agentlightning.operation.input.name") if attrs.get("type") == "agent" else None,
        attrs.get("lc_name") if name.startswith("langchain.Chain.") else None,
    )
    return next((str(c) for c in candidates if c is not None), None)


def span_ids(attributes: Mapping[str, Any], resource: Mapping[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """(rollout id, attempt id, sequence id) named by a span, each ``None`` when absent.

    Each is read from the span's attributes first, then from its OTel Resource: Agent Lightning's
    ``LightningStoreOTLPExporter`` puts them on the Resource (``LightningResourceAttributes``), and its
    store lets a span's own value win, as we do.
    """
    res = resource or {}
    out = []
    for keys in (ROLLOUT_KEYS, ATTEMPT_KEYS, SEQUENCE_KEYS):
        v = _first(attributes, keys)
        out.append(v if v is not None else _first(res, keys))
    return out[0], out[1], out[2]


def otel_to_span(
    *,
    name: str,
    span_id: str,
    trace_id: str,
    parent_id: str | None,
    start_ns: int,
    end_ns: int,
    status_code: Any = "UNSET",
    status_message: str | None = None,
    attributes: Mapping[str, Any],
    events: Sequence[tuple[str, int, Mapping[str, Any]]] = (),
    resource: Mapping[str, Any] | None = None,
    attribution: Attribution | None = None,
    resource_strs: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One OTel span → our Avro ``Span`` dict. Raises :class:`MappingError` when it cannot be ours.

    ``resource_strs``: ``resource`` (or, without one, the attribution's) with its values through
    :func:`attr_str`, from a caller that maps many spans of one resource; each span gets a copy."""
    att = attribution or _NO_ATTRIBUTION
    attrs = attributes
    res_attrs = resource if resource is not None else att.resource
    if _PLAIN.isdisjoint(attrs) and not name.startswith(_LLM_NAMES):
        # The common span (ids and plain attributes, no GenAI, reward, tool, agent or message keys):
        # what the general path below would give, without its key-by-key look-ups.
        plain = _plain_span(name, span_id, trace_id, parent_id, start_ns, end_ns, status_code, status_message,
                            attrs, events, resource, att, resource_strs)
        if plain is not None:
            return plain
    rollout_id, attempt_id, seq_raw = span_ids(attrs, res_attrs)
    rollout_id = rollout_id or att.rollout_id
    attempt_id = attempt_id or att.attempt_id
    if not rollout_id or not attempt_id:
        raise MappingError(
            f"span {name!r} names no rollout/attempt (agentlightning.rollout_id / attempt_id on the span or its "
            "resource) and none is open"
        )
    try:
        sequence_id = int(seq_raw) if seq_raw is not None else att.sequence_id
    except (TypeError, ValueError) as exc:
        raise MappingError(f"span sequence id {seq_raw!r} is not an integer") from exc
    if sequence_id is None or sequence_id < 0:
        raise MappingError(f"span {name!r} has no usable sequence id (agentlightning.span_sequence_id)")

    status = _STATUS.get(status_code, str(status_code).upper() if status_code else "UNSET")
    out_events = [{"name": en, "time_ns": int(et), "attributes": {k: attr_str(v) for k, v in ea.items()}} for en, et, ea in events]
    out_attrs = {k: attr_str(v) for k, v in attrs.items() if k not in _TOKEN_KEYS}

    # Agent Lightning's message/object spans: keep the body where our views look for it.
    if "agentlightning.message.body" in attrs:
        out_attrs["message.body"] = attr_str(attrs["agentlightning.message.body"])

    llm = None
    prompt = _first(attrs, PROMPT_IDS_KEYS)
    response = _first(attrs, RESPONSE_IDS_KEYS)
    model = _first(attrs, ("gen_ai.response.model", "gen_ai.request.model", "agentlightning.operation.output.model"))
    if prompt is not None or response is not None or name.startswith(_LLM_NAMES) or (
        model is not None and "gen_ai.tool.name" not in attrs
    ):
        logprobs = attrs.get("response_logprobs")
        finish = attrs.get("gen_ai.response.finish_reasons")
        if isinstance(finish, (list, tuple)):
            finish = finish[0] if finish else None
        response_id = _first(attrs, RESPONSE_ID_KEYS)
        rv = _first(attrs, ("rolloutbus.resource_version",))
        try:
            resource_version = int(rv) if rv is not None else att.resource_version
        except (TypeError, ValueError):
            resource_version = att.resource_version
        llm = {
            "model": None if model is None else str(model),
            "prompt_token_ids": b"" if prompt is None else _packed("I", prompt, "prompt_token_ids"),
            "response_token_ids": b"" if response is None else _packed("I", response, "response_token_ids"),
            "response_logprobs": b"" if logprobs is None else _packed("f", logprobs, "response_logprobs"),
            "response_mask": b"",
            "resource_version": resource_version,
            "request_id": None if response_id is None else str(response_id),
            "finish_reason": None if finish is None else str(finish),
        }

    reward = _rewards(attrs, name)
    tool = None
    tool_name = _first(attrs, ("gen_ai.tool.name", "tool.name"))
    if tool_name is not None:
        args = _first(attrs, ("gen_ai.tool.call.arguments", "tool.arguments"))
        result = _first(attrs, ("gen_ai.tool.call.result", "tool.result"))
        tool = {
            "name": str(tool_name),
            "arguments": "" if args is None else attr_str(args),
            "result": None if result is None else attr_str(result),
            "ok": status != "ERROR",
            "error": status_message if status == "ERROR" else None,
        }
    has_exception = "exception.type" in attrs or any(e[0] == "exception" for e in events)

    kind = attrs.get("rolloutbus.kind")
    if not kind:
        if reward is not None:
            kind = "reward"
        elif llm is not None:
            kind = "llm"
        elif tool is not None:
            kind = "tool"
        elif has_exception:
            kind = "exception"
        elif "message.body" in out_attrs:
            kind = "message"
        elif any(k.startswith("agentlightning.object.") for k in attrs):
            kind = "object"
        else:
            kind = "span"
    agent = _first(attrs, AGENT_KEYS) or agent_name_of(name, attrs) or att.agent_name
    res = dict(resource_strs) if resource_strs is not None else {k: attr_str(v) for k, v in (resource or att.resource).items()}
    return {
        "span_id": span_id,
        "trace_id": trace_id,
        "parent_id": parent_id or None,
        "rollout_id": str(rollout_id),
        "attempt_id": str(attempt_id),
        "sequence_id": sequence_id,
        "name": name,
        "kind": str(kind),
        "start_time_ns": int(start_ns),
        "end_time_ns": int(end_ns),
        "status_code": status,
        "status_message": status_message or None,
        "attributes": out_attrs,
        "events": out_events,
        "resource": res,
        "llm": llm,
        "reward": reward,
        "tool": tool,
        "agent_name": None if agent is None else str(agent),
    }


_NO_ATTRIBUTION = Attribution()
_LLM_NAMES = ("openai.chat", "chat ", "text_completion")
# Every attribute key (other than the rollout ids) that can change a span's mapping beyond copying
# it; prefixes are handled by _plain_span. A span with none of them takes the plain path.
_PLAIN = frozenset(
    tuple(_TOKEN_KEYS) + RESPONSE_ID_KEYS + AGENT_KEYS + AGENTOPS_OUTPUT_KEYS + (
        "gen_ai.response.model", "gen_ai.request.model", "agentlightning.operation.output.model",
        "gen_ai.response.finish_reasons", "rolloutbus.resource_version",
        "rolloutbus.reward", "agentlightning.reward", "reward", "rolloutbus.reward.primary",
        "gen_ai.tool.name", "tool.name", "gen_ai.tool.call.arguments", "tool.arguments", "gen_ai.tool.call.result",
        "tool.result", "exception.type", "rolloutbus.kind", "agentlightning.message.body", "message.body",
        # agent_name_of's keys
        "agent.name", "operation.name", "agentops.span.kind", "recipient_agent_type", "langchain.chain.type",
        "executor.id", "agentlightning.operation.input.name", "type", "lc_name",
    )
)


def _plain_span(
    name: str, span_id: str, trace_id: str, parent_id: str | None, start_ns: int, end_ns: int, status_code: Any,
    status_message: str | None, attrs: Mapping[str, Any], events: Sequence[tuple[str, int, Mapping[str, Any]]],
    resource: Mapping[str, Any] | None, att: Attribution, resource_strs: Mapping[str, str] | None,
) -> dict[str, Any] | None:
    """:func:`otel_to_span` of a span none of whose keys is in ``_PLAIN``; None: take the general path
    (an ``agentlightning.reward.*`` or ``agentlightning.object.*`` key, or anything it does not expect)."""
    out_attrs: dict[str, str] = {}
    for k, v in attrs.items():
        if k.startswith("agentlightning.") and k.startswith(("agentlightning.reward.", "agentlightning.object.")):
            return None
        out_attrs[k] = v if type(v) is str else attr_str(v)
    get = attrs.get
    rollout_id = get("agentlightning.rollout_id")
    if rollout_id is None or rollout_id == "":
        rollout_id = get("rolloutbus.rollout_id")
    attempt_id = get("agentlightning.attempt_id")
    if attempt_id is None or attempt_id == "":
        attempt_id = get("rolloutbus.attempt_id")
    seq_raw = get("agentlightning.span_sequence_id")
    if seq_raw is None or seq_raw == "":
        seq_raw = get("rolloutbus.sequence_id")
    if not rollout_id or not attempt_id or seq_raw is None or seq_raw == "":
        return None  # an id from the resource or the attribution, or an odd one: the general path
    if type(seq_raw) is not int or seq_raw < 0 or type(start_ns) is not int or type(end_ns) is not int:
        return None
    status = _STATUS.get(status_code, str(status_code).upper() if status_code else "UNSET")
    if events:
        out_events = [{"name": en, "time_ns": int(et), "attributes": {k: attr_str(v) for k, v in ea.items()}}
                      for en, et, ea in events]
        kind = "exception" if any(e[0] == "exception" for e in events) else "span"
    else:
        out_events, kind = [], "span"
    if resource_strs is not None:
        res = dict(resource_strs)
    else:
        res = {k: v if type(v) is str else attr_str(v) for k, v in (resource or att.resource).items()}
    return {
        "span_id": span_id, "trace_id": trace_id, "parent_id": parent_id or None, "rollout_id": str(rollout_id),
        "attempt_id": str(attempt_id), "sequence_id": seq_raw, "name": name, "kind": kind, "start_time_ns": start_ns,
        "end_time_ns": end_ns, "status_code": status, "status_message": status_message or None,
        "attributes": out_attrs, "events": out_events, "resource": res, "llm": None, "reward": None, "tool": None,
        "agent_name": None if att.agent_name is None else str(att.agent_name),
    }


__all__ = ["otel_to_span", "span_ids", "agent_name_of", "Attribution", "MappingError", "attr_str"]
