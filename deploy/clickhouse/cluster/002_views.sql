-- Cluster variant of ../migrations/002_views.sql: the same views, created on every node. They read the
-- Distributed tables through FINAL; the sharding keys keep every copy of a record on one shard, so a
-- record delivered twice is counted once here too.

CREATE OR REPLACE VIEW {db}.v_reward_by_version ON CLUSTER '{cluster}' AS
SELECT
    resource_version,
    count()                                   AS rollouts,
    avg(final_reward)                         AS mean_reward,
    avg(status = 'succeeded' AND final_reward > 0) AS success_rate,
    countIf(status != 'succeeded')            AS failed,
    min(finished_at)                          AS first_finished,
    max(finished_at)                          AS last_finished
FROM {db}.rollouts FINAL
WHERE mode = 'train'
GROUP BY resource_version
ORDER BY resource_version;

CREATE OR REPLACE VIEW {db}.v_reward_over_time ON CLUSTER '{cluster}' AS
SELECT
    toStartOfMinute(finished_at)              AS minute,
    resource_version,
    mode,
    count()                                   AS rollouts,
    avg(final_reward)                         AS mean_reward,
    avg(status = 'succeeded' AND final_reward > 0) AS success_rate
FROM {db}.rollouts FINAL
GROUP BY minute, resource_version, mode
ORDER BY minute, resource_version, mode;

CREATE OR REPLACE VIEW {db}.v_agent_errors ON CLUSTER '{cluster}' AS
SELECT
    ifNull(agent_name, '(none)')              AS agent,
    count()                                   AS spans,
    countIf(status_code = 'ERROR' OR kind = 'exception' OR tool_ok = false) AS errors,
    errors / spans                            AS error_rate
FROM {db}.spans FINAL
GROUP BY agent
ORDER BY error_rate DESC, spans DESC;

CREATE OR REPLACE VIEW {db}.v_tool_errors ON CLUSTER '{cluster}' AS
SELECT
    tool_name                                 AS tool,
    count()                                   AS calls,
    countIf(NOT tool_ok)                      AS failures,
    failures / calls                          AS error_rate,
    any(tool_error)                           AS example_error
FROM {db}.spans FINAL
WHERE kind = 'tool' AND tool_name IS NOT NULL
GROUP BY tool
ORDER BY error_rate DESC, calls DESC;

CREATE OR REPLACE VIEW {db}.v_trajectory_length ON CLUSTER '{cluster}' AS
SELECT
    spans_seen                                AS spans,
    transition_count                          AS llm_turns,
    count()                                   AS rollouts,
    avg(final_reward)                         AS mean_reward
FROM {db}.rollouts FINAL
GROUP BY spans, llm_turns
ORDER BY spans, llm_turns;

CREATE OR REPLACE VIEW {db}.v_trajectory ON CLUSTER '{cluster}' AS
SELECT
    rollout_id,
    attempt_id,
    sequence_id,
    kind,
    name,
    agent_name,
    status_code,
    duration_ms,
    reward,
    tool_name,
    tool_ok,
    tool_arguments,
    tool_result,
    length(prompt_token_ids)                  AS prompt_tokens,
    length(response_token_ids)                AS response_tokens,
    resource_version,
    attributes['message.body']                AS message,
    late
FROM {db}.spans FINAL
ORDER BY rollout_id, attempt_id, sequence_id;

CREATE OR REPLACE VIEW {db}.v_train_steps ON CLUSTER '{cluster}' AS
SELECT
    run_id,
    step,
    time,
    resource_version,
    length(group_ids)                         AS groups,
    metrics['loss']                           AS loss,
    metrics['kl']                             AS kl,
    metrics['clip_fraction']                  AS clip_fraction,
    metrics['reward_mean']                    AS reward_mean,
    metrics['tokens_per_s']                   AS tokens_per_s,
    metrics
FROM {db}.train_steps FINAL
ORDER BY run_id, step;

CREATE OR REPLACE VIEW {db}.v_dead_letters_by_reason ON CLUSTER '{cluster}' AS
SELECT source_topic, stage, reason, count() AS records, max(time) AS last_seen
FROM {db}.dead_letters FINAL
GROUP BY source_topic, stage, reason
ORDER BY records DESC;
