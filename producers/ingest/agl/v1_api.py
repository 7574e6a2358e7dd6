"""Agent Lightning 1.x's server API (``/api/...``) on the bus: its controllers' queue on rb.tasks, rollouts ended,
models listed, its agents' LLM route. Pure.

What its callers send (its trainer's rollout manager, its controllers, its agents), mapped onto our records;
the routes are in :mod:`producers.ingest.agl.v1_api_http`:

* ``POST /api/rollouts`` (a list of its ``RolloutCreate``: ``input``, ``is_train``, ``config``, ``metadata``,
  an optional caller-chosen ``rollout_id``) → its ``Rollout`` per item, ``queuing``, the id the caller's
  or a new one (as its server does), and a task record per rollout on rb.tasks (:func:`task_from_create`):
  the task is the input's ``data_id`` (or ``instance_id``, as its terminal-rollout listing reads it), else
  a digest of the input, so the rollouts its trainer makes of one sample are one GRPO group, under the
  policy version of their creation. One attempt each, attempt ``"0"``: its controllers give every agent
  that attempt id (``DEFAULT_ATTEMPT_ID``) and its states are final, so a rollout is never retried.
* ``GET /api/rollouts?state_in=queuing&state_in=running`` (its controllers' poll) → the rollouts in those
  states, from the control records (:mod:`producers.ingest.agl.control`; :func:`check_list_query`).
* ``PATCH /api/rollouts/{rollout_id}`` (its ``RolloutPatch``, ``{"status": {"state": ...}}``): ``running`` is
  the claim (the queue's STARTED); a terminal state (``succeeded``, ``failed``) the FINISHED event
  (:func:`finished_from_patch`). Its patch carries no reward (its trainer takes the last ``reward``
  event): the attempt's last reward span is the reward; the stream worker waits its finish grace for
  events still on their way.
* ``GET /api/rollouts/{rollout_id}`` → its ``RolloutDetail``, from the control records.
* ``GET /api/models`` → the newest version of each model resource on ``rb.resources`` (latest first) as
  its ``Model`` records ``{"model", "endpoint", "version"}`` (:func:`models_reply`).
* its server's LLM route, which its controllers hand every agent as ``AGL_OPENAI_BASE_URL`` → ``rolloutbus
  proxy``'s route for the attempt, at the endpoint the policy's version names (:func:`llm_upstream`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from producers.ingest.agl.claims import AGL1_ROLLOUT, CONFIG, ROLLOUT_ID
from producers.mapping import MappingError, attr_str
from schemas.models import SPANS_UNKNOWN, ResourceVersion, RolloutEvent, Task

PREFIX = "/api"
DEFAULT_ATTEMPT_ID = "0"  # what its controllers hand every agent (agentlightning.schemas.DEFAULT_ATTEMPT_ID)
STATES = ("queuing", "running", "succeeded", "failed")
TERMINAL = ("succeeded", "failed")
MAX_DEPTH = 64  # JSON nesting a body may have; deeper is refused (400) before anything reads it
PATCH_FIELDS = ("state", "k8s_job_name", "last_attempt_id", "error_message")  # its RolloutStatusPatch (extra: forbid)
LIST_LIMIT = 500  # its list_rollouts' default limit
CLAIM_GRACE_S = 30  # a claim outlives its rollout's timeout_seconds by this: its controller's own FAILED patch comes first
LLM_PATHS = ("chat/completions", "completions")  # what its server's LLM proxy forwards


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """:class:`MappingError` when ``value`` (parsed JSON) nests deeper than ``limit``. Iterative."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                raise MappingError(f"JSON nested deeper than {limit} levels")
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))


def _opt_str(value: Any, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise MappingError(f"{what} must be a string or null, got {type(value).__name__}")
    return value


def _config(value: Any, i: int) -> dict[str, Any]:
    """Its ``RolloutConfig`` with defaults filled in (unknown keys dropped, as pydantic does)."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise MappingError(f"item {i}: config must be a JSON object")
    timeout = value.get("timeout_seconds", 3600)
    if isinstance(timeout, bool) or not isinstance(timeout, int):
        raise MappingError(f"item {i}: config.timeout_seconds must be an integer")
    local, k8s = value.get("local"), value.get("k8s")
    if local is not None:
        if not isinstance(local, Mapping):
            raise MappingError(f"item {i}: config.local must be a JSON object")
        env_map = local.get("env_map") or {}
        if not isinstance(env_map, Mapping) or not all(isinstance(v, str) for v in env_map.values()):
            raise MappingError(f"item {i}: config.local.env_map must map names to strings")
        local = {"agent_class": _opt_str(local.get("agent_class"), f"item {i}: config.local.agent_class"),
                 "env_map": dict(env_map)}
    if k8s is not None:
        if not isinstance(k8s, Mapping):
            raise MappingError(f"item {i}: config.k8s must be a JSON object")
        k8s = {"job_template": _opt_str(k8s.get("job_template"), f"item {i}: config.k8s.job_template")}
    return {"timeout_seconds": timeout, "local": local, "k8s": k8s}


def check_rollout_creates(body: Any) -> list[dict[str, Any]]:
    """The ``POST /api/rollouts`` body (a JSON list of ``RolloutCreate``), checked and with its defaults;
    :class:`MappingError` with the reason otherwise."""
    if not isinstance(body, list):
        raise MappingError("the body is a JSON list of rollouts to create ([{\"input\": ...}, ...])")
    out = []
    for i, item in enumerate(body):
        if not isinstance(item, Mapping):
            raise MappingError(f"item {i} is not a JSON object")
        if "input" not in item:
            raise MappingError(f"item {i} has no input")
        is_train = item.get("is_train", True)
        if not isinstance(is_train, bool):
            raise MappingError(f"item {i}: is_train must be true or false")
        metadata = item.get("metadata")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise MappingError(f"item {i}: metadata must be a JSON object")
        rollout_id = _opt_str(item.get("rollout_id"), f"item {i}: rollout_id")
        if rollout_id is not None and (not rollout_id or "/" in rollout_id):
            raise MappingError(f"item {i}: rollout_id must be a non-empty string without '/'")
        out.append({"input": item["input"], "is_train": is_train, "config": _config(item.get("config"), i),
                    "metadata": dict(metadata or {}), "rollout_id": rollout_id})
    return out


def new_rollout(req: Mapping[str, Any], rollout_id: str, *, now: float) -> dict[str, Any]:
    """Its ``Rollout`` (as JSON) for a checked create request: ``queuing``, version 1."""
    return {
        "rollout_id": rollout_id, "input": req["input"], "is_train": req["is_train"], "config": req["config"],
        "metadata": {"batch_idx": None, "sample_idx_in_batch": None, **req["metadata"]},
        "status": {"state": "queuing", "k8s_job_name": None, "last_attempt_id": None, "error_message": None,
                   "version": 1, "created_at": now, "updated_at": now},
    }


def task_id_of(task_input: Any) -> str:
    """The task of a rollout: its input's ``data_id`` / ``instance_id``, else a digest of the input (so the
    rollouts made of one sample are one task, one GRPO group)."""
    if isinstance(task_input, Mapping):
        for key in ("data_id", "instance_id"):
            v = task_input.get(key)
            if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v):
                return str(v)
    canonical = json.dumps(task_input, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "agl1-" + hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def check_rollout_patch(body: Any) -> dict[str, Any]:
    """The ``PATCH /api/rollouts/{id}`` body (its ``RolloutPatch``) → the status fields it sets;
    :class:`MappingError` with the reason otherwise."""
    if body is None:
        return {}
    if not isinstance(body, Mapping):
        raise MappingError('the body is a JSON object {"status": {"state": ...}}')
    status = body.get("status")
    if status is None:
        return {}
    if not isinstance(status, Mapping):
        raise MappingError("status must be a JSON object")
    unknown = sorted(set(status) - set(PATCH_FIELDS))
    if unknown:
        raise MappingError(f"status has fields it cannot patch: {unknown} (only {list(PATCH_FIELDS)})")
    state = status.get("state")
    if state is not None and state not in STATES:
        raise MappingError(f"status.state {state!r} is not one of {list(STATES)}")
    for key in PATCH_FIELDS[1:]:
        _opt_str(status.get(key), f"status.{key}")
    if status.get("last_attempt_id") == "" or "/" in (status.get("last_attempt_id") or ""):
        raise MappingError("status.last_attempt_id must be a non-empty string without '/'")
    return dict(status)


def finished_from_patch(rollout_id: str, status: Mapping[str, Any], *, now_ns: int) -> RolloutEvent | None:
    """A patch to ``succeeded`` or ``failed`` → the FINISHED event of its attempt (``last_attempt_id``, else
    ``"0"``); else None. No reward: the last reward span is the reward. Task, mode and attempt number
    are the STARTED's (the span stage fills them in)."""
    state = status.get("state")
    if state not in TERMINAL:
        return None
    attempt_id = status.get("last_attempt_id") or DEFAULT_ATTEMPT_ID
    metadata = {SPANS_UNKNOWN: "1"}
    if status.get("k8s_job_name"):
        metadata["agentlightning.k8s_job_name"] = str(status["k8s_job_name"])
    return RolloutEvent(rollout_id=rollout_id, attempt_id=attempt_id, event="FINISHED", time_ns=now_ns, task_id="",
                        status=state, final_reward=None, span_count=0, error=status.get("error_message"),
                        metadata=metadata)


def models_reply(current: Mapping[str, ResourceVersion]) -> list[dict[str, Any]]:
    """The newest version of each model resource → its ``Model`` records, latest first. The endpoint is
    the version's ``config.endpoint`` (the URL its agents' calls go to), else its ``uri``."""
    models = [rv for rv in current.values() if rv.kind == "model"]
    models.sort(key=lambda rv: (rv.version, rv.created_ns), reverse=True)
    return [{"model": rv.config.get("model") or rv.base_model or rv.name,
             "endpoint": rv.config.get("endpoint") or rv.uri, "version": rv.version} for rv in models]


def policy_version(current: Mapping[str, ResourceVersion] | None, name: str = "policy") -> int | None:
    """The version a rollout created now runs under: the named resource's newest, else None."""
    rv = (current or {}).get(name)
    return None if rv is None else rv.version


# ---------------------------------------------------------------------------- its controllers' queue (rb.tasks)


def task_from_create(rollout: Mapping[str, Any], *, resource_version: int | None, now_ns: int) -> Task:
    """A created rollout (:func:`new_rollout`) → its task record on rb.tasks, keyed by its rollout id: the task
    is the sample's (:func:`task_id_of`, one GRPO group), the version the policy's newest at creation. One
    attempt, never retried (its states are final), claimed for its ``timeout_seconds`` (+ a grace)."""
    limits = {"max_attempts": 1, "timeout_seconds": rollout["config"]["timeout_seconds"] + CLAIM_GRACE_S,
              "retry_condition": []}
    kept = {"is_train": rollout["is_train"], "config": rollout["config"], "metadata": rollout["metadata"],
            "created_at": rollout["status"]["created_at"]}
    metadata = {f"agentlightning.metadata.{key}": attr_str(value) for key, value in rollout["metadata"].items()
                if value is not None}
    metadata.update({ROLLOUT_ID: rollout["rollout_id"], CONFIG: json.dumps(limits), AGL1_ROLLOUT: json.dumps(kept)})
    return Task(task_id=task_id_of(rollout["input"]), input=json.dumps(rollout["input"]),
                mode="train" if rollout["is_train"] else "val", group_size=1, created_ns=now_ns,
                resource_version=resource_version, metadata=metadata)


def check_list_query(states: Sequence[str], limit: str | None) -> tuple[tuple[str, ...], int]:
    """``GET /api/rollouts``'s ``state_in`` (repeated, at least one) and ``limit`` (its default 500), checked."""
    if not states:
        raise MappingError("state_in is required (?state_in=queuing&state_in=running)")
    bad = [s for s in states if s not in STATES]
    if bad:
        raise MappingError(f"state_in {bad[0]!r} is not one of {list(STATES)}")
    try:
        n = LIST_LIMIT if limit is None else int(limit)
    except ValueError:
        raise MappingError(f"limit {limit!r} is not an integer") from None
    return tuple(dict.fromkeys(states)), n


def llm_upstream(current: Mapping[str, ResourceVersion] | None, policy: str, rollout_id: str, attempt_id: str,
                 path: str) -> str | None:
    """Where its agent's LLM call goes (its controllers hand every agent the server's LLM proxy route): the
    per-attempt route of the endpoint the policy's newest version names (``config.endpoint``, the base URL of
    ``rolloutbus proxy``, as ``rolloutbus train --llm-endpoint`` publishes it), else of the newest model
    version that names one; None when none does."""
    versions = [rv for rv in (current or {}).values() if rv.kind == "model" and rv.config.get("endpoint")]
    versions.sort(key=lambda rv: (rv.name != policy, -rv.version, -rv.created_ns))
    if not versions:
        return None
    endpoint = str(versions[0].config["endpoint"]).rstrip("/").removesuffix("/v1")
    return f"{endpoint}/rollout/{rollout_id}/attempt/{attempt_id}/v1/{path}"


__all__ = ["PREFIX", "DEFAULT_ATTEMPT_ID", "STATES", "TERMINAL", "MAX_DEPTH", "check_depth", "check_rollout_creates",
           "new_rollout", "task_id_of", "check_rollout_patch", "finished_from_patch", "models_reply", "policy_version",
           "LIST_LIMIT", "LLM_PATHS", "task_from_create", "check_list_query", "llm_upstream"]
