-- Cluster variant of ../migrations/003_prompt_candidates.sql.

CREATE TABLE IF NOT EXISTS {db}.prompt_candidates_local ON CLUSTER '{cluster}'
(
    run_id             String,
    candidate_id       String,
    resource_name      String,
    round              UInt32,
    parent_id          String,
    source             LowCardinality(String),
    template           String,
    config             Map(String, String),
    critique           String,
    score              Nullable(Float64),
    score_se           Nullable(Float64),
    tasks              UInt32,
    finished           UInt32,
    published_version  Nullable(Int64),
    note               String,
    created_ns         Int64,
    updated_ns         Int64,
    created_at         DateTime64(9) ALIAS fromUnixTimestamp64Nano(created_ns)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/prompt_candidates_local', '{replica}', updated_ns)
ORDER BY (run_id, candidate_id)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.prompt_candidates ON CLUSTER '{cluster}'
AS {db}.prompt_candidates_local
ENGINE = Distributed('{cluster}', '{db}', 'prompt_candidates_local', cityHash64(run_id));

CREATE OR REPLACE VIEW {db}.v_rollout_resources ON CLUSTER '{cluster}' AS
SELECT
    rollout_id,
    attempt_id,
    task_id,
    mode,
    resource_version,
    mapFilter((k, v) -> startsWith(k, 'resource.'), metadata) AS resources,
    metadata['resource.prompt']               AS prompt_version,
    status,
    final_reward,
    finished_at
FROM {db}.rollouts FINAL;
