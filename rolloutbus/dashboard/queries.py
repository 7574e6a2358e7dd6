"""What the dashboard asks ClickHouse, and how rows become the JSON the page draws. Pure: no client here.

Every query reads through ``FINAL`` (a record delivered twice counts once), as the analyst views do.
Times leave as Unix seconds (floats), the unit the page's charts use.
"""

from __future__ import annotations

import math
from typing import Any

# ----------------------------------------------------------------------------------------- learning

TIME_RANGE = "SELECT min(finished_ns), max(finished_ns), count() FROM rollouts FINAL WHERE finished_ns > 0"

REWARD_BY_VERSION = """
SELECT ifNull(resource_version, -1) AS version, mode, count() AS rollouts, avg(final_reward) AS mean_reward,
       avg(status = 'succeeded' AND final_reward > 0) AS success_rate
FROM rollouts FINAL
GROUP BY version, mode
ORDER BY version, mode
"""

# {bucket:UInt32} seconds per point; chosen from the run's length (:func:`bucket_seconds`).
REWARD_OVER_TIME = """
SELECT intDiv(finished_ns, {bucket:UInt32} * 1000000000) * {bucket:UInt32} AS t, mode, count() AS rollouts,
       avg(final_reward) AS mean_reward, avg(status = 'succeeded' AND final_reward > 0) AS success_rate
FROM rollouts FINAL
WHERE finished_ns > 0
GROUP BY t, mode
ORDER BY t, mode
"""

def _metric(name: str) -> str:
    return f"if(mapContains(metrics, '{name}'), metrics['{name}'], NULL) AS {name}"


TRAIN_STEPS = f"""
SELECT run_id, step, time_ns / 1e9 AS t, ifNull(resource_version, -1) AS version, length(group_ids) AS groups,
       {', '.join(_metric(m) for m in ('loss', 'kl', 'clip_fraction', 'reward_mean', 'tokens_per_s'))}
FROM train_steps FINAL
ORDER BY time_ns, run_id, step
LIMIT 20000
"""

# The versions runners use now: the newest that the rollouts of the last minute (of the run) were sampled with.
VERSIONS_NOW = """
SELECT ifNull(resource_version, -1) AS version, mode, count() AS rollouts
FROM rollouts FINAL
WHERE finished_ns >= (SELECT max(finished_ns) FROM rollouts FINAL) - 60000000000
GROUP BY version, mode
ORDER BY version DESC, mode
LIMIT 8
"""

LATEST_VERSION = "SELECT name, max(version), argMax(created_ns, version) / 1e9 FROM resource_versions FINAL GROUP BY name ORDER BY name"

# ----------------------------------------------------------------------------------------- pipeline

ROLLOUTS_PER_BUCKET = """
SELECT intDiv(finished_ns, {bucket:UInt32} * 1000000000) * {bucket:UInt32} AS t, status, count() AS rollouts,
       quantile(0.5)(greatest(updated_ns - finished_ns, 0) / 1e9) AS p50_latency_s,
       max(greatest(updated_ns - finished_ns, 0) / 1e9) AS max_latency_s
FROM rollouts FINAL
WHERE finished_ns > 0
GROUP BY t, status
ORDER BY t, status
"""

SPANS_PER_BUCKET = """
SELECT intDiv(ingested_ns, {bucket:UInt32} * 1000000000) * {bucket:UInt32} AS t, count() AS spans
FROM spans
WHERE ingested_ns >= {since_ns:Int64}
GROUP BY t
ORDER BY t
"""

DLQ_BY_REASON = "SELECT source_topic, stage, reason, records, toUnixTimestamp64Nano(last_seen) / 1e9 FROM v_dead_letters_by_reason"

DLQ_PER_BUCKET = """
SELECT intDiv(time_ns, {bucket:UInt32} * 1000000000) * {bucket:UInt32} AS t, reason, count() AS records
FROM dead_letters FINAL
GROUP BY t, reason
ORDER BY t, reason
"""

# ----------------------------------------------------------------------------------------- trajectories

ROLLOUT_COLUMNS = ["rollout_id", "attempt_id", "task_id", "mode", "version", "status", "final_reward", "spans",
                   "llm_turns", "group_id", "finished", "duration_s", "agents"]

# Filters are bound as parameters; an empty one matches everything.
ROLLOUT_LIST = """
SELECT r.rollout_id, r.attempt_id, r.task_id, r.mode, r.resource_version, r.status, r.final_reward, r.spans_seen,
       r.transition_count, r.group_id, r.finished_ns / 1e9, (r.finished_ns - r.started_ns) / 1e9,
       arrayStringConcat(a.agents, ',') AS agents
FROM (SELECT * FROM rollouts FINAL
      WHERE ({q:String} = '' OR positionCaseInsensitive(rollout_id, {q:String}) > 0
                             OR positionCaseInsensitive(task_id, {q:String}) > 0)
        AND ({task:String} = '' OR task_id = {task:String})
        AND ({status:String} = '' OR status = {status:String})
        AND ({mode:String} = '' OR mode = {mode:String})
        AND ({version:Int64} < 0 OR resource_version = {version:Int64})
        AND (final_reward IS NULL AND {min_reward:Float64} < -1e299 AND {max_reward:Float64} > 1e299
             OR final_reward >= {min_reward:Float64} AND final_reward <= {max_reward:Float64})
      ORDER BY finished_ns DESC
      LIMIT {limit:UInt32}) AS r
LEFT JOIN (SELECT rollout_id, groupUniqArray(agent_name) AS agents FROM spans
           WHERE agent_name IS NOT NULL GROUP BY rollout_id) AS a ON a.rollout_id = r.rollout_id
WHERE {agent:String} = '' OR has(a.agents, {agent:String})
ORDER BY r.finished_ns DESC
"""

ROLLOUT_ATTEMPTS = """
SELECT rollout_id, attempt_id, task_id, mode, attempt, resource_version, status, final_reward, started_ns / 1e9,
       finished_ns / 1e9, span_count, spans_seen, missing_sequence_ids, transition_count, group_id, error, metadata
FROM rollouts FINAL WHERE rollout_id = {rid:String} ORDER BY attempt
"""
ATTEMPT_COLUMNS = ["rollout_id", "attempt_id", "task_id", "mode", "attempt", "version", "status", "final_reward",
                   "started", "finished", "span_count", "spans_seen", "missing_sequence_ids", "llm_turns", "group_id",
                   "error", "metadata"]

ROLLOUT_SPANS = """
SELECT attempt_id, sequence_id, span_id, parent_id, name, kind, agent_name, status_code, status_message,
       start_time_ns / 1e9, duration_ms, model, length(prompt_token_ids), length(response_token_ids),
       response_logprobs, resource_version, reward, reward_dimensions, tool_name, tool_ok, tool_arguments,
       tool_result, tool_error, attributes, late, arraySlice(response_token_ids, 1, 256)
FROM spans FINAL WHERE rollout_id = {rid:String} ORDER BY attempt_id, sequence_id
"""
SPAN_COLUMNS = ["attempt_id", "seq", "span_id", "parent_id", "name", "kind", "agent", "status", "status_message",
                "start", "duration_ms", "model", "prompt_tokens", "response_tokens", "logprobs", "version", "reward",
                "reward_dimensions", "tool", "tool_ok", "tool_arguments", "tool_result", "tool_error", "attributes", "late",
                "token_ids"]
TOKENS_SHOWN = 256  # per LLM turn: the first response tokens' ids and log-probabilities

ROLLOUT_TRANSITIONS = """
SELECT attempt_id, turn, span_id, reward, return_, advantage, trained, group_id, credit,
       length(prompt_token_ids), length(response_token_ids)
FROM transitions FINAL WHERE rollout_id = {rid:String} ORDER BY attempt_id, turn
"""
TRANSITION_COLUMNS = ["attempt_id", "turn", "span_id", "reward", "return", "advantage", "trained", "group_id", "credit",
                      "prompt_tokens", "response_tokens"]

GROUP = """
SELECT group_id, task_id, resource_version, group_size, rollouts, complete, zero_variance, credit, rollout_ids,
       rewards, advantages, reward_mean, reward_std
FROM groups FINAL WHERE group_id = {gid:String}
"""
GROUP_COLUMNS = ["group_id", "task_id", "version", "group_size", "rollouts", "complete", "zero_variance", "credit",
                 "rollout_ids", "rewards", "advantages", "reward_mean", "reward_std"]

# Span attributes that hold the text of an LLM turn (the proxy's, OTel GenAI's, Agent Lightning's).
TEXT_ATTRIBUTES = ("gen_ai.prompt", "gen_ai.input.messages", "gen_ai.system_instructions", "gen_ai.completion",
                   "gen_ai.output.messages", "message.body")
TEXT_PREFIXES = ("gen_ai.prompt.", "gen_ai.completion.")

# ----------------------------------------------------------------------------------------- shaping


def bucket_seconds(first_ns: int | None, last_ns: int | None, points: int = 120) -> int:
    """Seconds per time bucket so the run's length is about ``points`` buckets (at least 5 s, round numbers)."""
    if not first_ns or not last_ns or last_ns <= first_ns:
        return 10
    raw = (last_ns - first_ns) / 1e9 / points
    for nice in (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if raw <= nice:
            return nice
    return 86400


def clean(v: Any) -> Any:
    """A value JSON can carry: NaN and infinities become None, tuples lists, bytes text."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return str(v)


def records(columns: list[str], rows: list[Any]) -> list[dict[str, Any]]:
    return [{c: clean(v) for c, v in zip(columns, row)} for row in rows]


def series_by(rows: list[Any], key: int, x: int, ys: dict[str, int]) -> dict[str, Any]:
    """Rows (x, key, y...) → ``{"x": [...], "<key>:<y>": [...]}`` aligned on the union of x (None where a key has no row).

    What a multi-series chart needs: one x axis, one array per series.
    """
    xs = sorted({r[x] for r in rows})
    index = {v: i for i, v in enumerate(xs)}
    keys = sorted({str(r[key]) for r in rows})
    out: dict[str, Any] = {"x": [clean(v) for v in xs]}
    for k in keys:
        for name in ys:
            out[f"{k}:{name}"] = [None] * len(xs)
    for r in rows:
        for name, col in ys.items():
            out[f"{r[key]}:{name}"][index[r[x]]] = clean(r[col])
    return out


def span_text(attributes: dict[str, str]) -> dict[str, str]:
    """The text an LLM or message span carries, by attribute name (prompt first, then completion)."""
    out = {k: attributes[k] for k in TEXT_ATTRIBUTES if attributes.get(k)}
    for k in sorted(attributes):
        if k.startswith(TEXT_PREFIXES) and attributes[k] and k not in out:
            out[k] = attributes[k]
    return out


def timeline(spans: list[dict[str, Any]], transitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One rollout's spans in sequence order, each LLM span with the step it became (return, advantage)."""
    steps = {(t["attempt_id"], t["span_id"]): t for t in transitions}
    out = []
    for s in spans:
        attrs = s.pop("attributes") or {}
        logprobs = s.pop("logprobs") or []
        item = dict(s)
        item["text"] = span_text(attrs)
        item["attributes"] = {k: v for k, v in attrs.items() if k not in item["text"]}
        finite = [x for x in logprobs if x is not None]
        item["logprob_mean"] = sum(finite) / len(finite) if finite else None
        item["logprob_min"] = min(finite) if finite else None
        item["logprobs"] = logprobs[:TOKENS_SHOWN]
        item["token_ids"] = list(s.get("token_ids") or [])[:TOKENS_SHOWN]
        step = steps.get((s["attempt_id"], s["span_id"]))
        item["step"] = None if step is None else {k: step[k] for k in ("turn", "reward", "return", "advantage", "trained")}
        out.append(item)
    return out


def producer_health(target: str, metrics_text: str) -> dict[str, Any]:
    """A gateway's or producer's Prometheus text → one row of the pipeline panel: requests by HTTP status
    class (2xx, 4xx, 503, other 5xx), spans accepted and rejected, spool depth, Kafka up. A metric the
    process does not export stays None."""
    from prometheus_client.parser import text_string_to_metric_families

    row: dict[str, Any] = {"target": target, "2xx": None, "4xx": None, "503": None, "5xx": None, "spans_accepted": None,
                           "spans_rejected": None, "spool_pending": None, "kafka_up": None}

    def add(key: str, value: float) -> None:
        row[key] = (row[key] or 0) + value

    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            name = sample.name
            if name.endswith("_requests_total") and "code" in sample.labels:
                code = sample.labels["code"]
                add("2xx" if code.startswith("2") else "4xx" if code.startswith("4") else "503" if code == "503" else "5xx", sample.value)
            elif name.endswith("_spans_accepted_total"):
                add("spans_accepted", sample.value)
            elif name.endswith("_spans_rejected_total"):
                add("spans_rejected", sample.value)
            elif name.endswith("_spool_pending"):
                add("spool_pending", sample.value)
            elif name.endswith("_kafka_up"):
                row["kafka_up"] = sample.value
        if family.name.endswith("_requests"):  # it counts requests: a status class never answered is 0, not unknown
            for key in ("2xx", "4xx", "503", "5xx"):
                row[key] = row[key] or 0
    return row


def sql_result(columns: list[str], types: list[str], rows: list[Any], max_rows: int) -> dict[str, Any]:
    """The SQL box's answer: columns, which of them are numbers or times (chartable), rows (at most ``max_rows``)."""
    numeric = [any(w in t for w in ("Int", "Float", "Decimal")) for t in types]
    temporal = [t.startswith(("DateTime", "Date", "Nullable(DateTime", "Nullable(Date")) for t in types]
    shown = [[clean(v) for v in r] for r in rows[:max_rows]]
    return {"columns": columns, "types": types, "numeric": numeric, "temporal": temporal, "rows": shown,
            "row_count": len(rows), "truncated": len(rows) > max_rows}
