-- The prompt optimizer's record (`rolloutbus optimize-prompt`): every candidate prompt of every run,
-- where it came from (the incumbent version, a user's list, or the optimizer LLM's critique and rewrite),
-- its validation score, and the version it was published as, if it was. A candidate's rollouts are in
-- `rollouts` with metadata['apo.candidate'] = candidate_id (and metadata['resource.<name>'] the same).

CREATE TABLE IF NOT EXISTS {db}.prompt_candidates
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
ENGINE = ReplacingMergeTree(updated_ns)
ORDER BY (run_id, candidate_id)
SETTINGS non_replicated_deduplication_window = 10000;

-- The versions each rollout used: the weights (resource_version) and every resource the runner handed
-- the agent (metadata['resource.<name>']: a version number, or a candidate's id while it was scored).
CREATE OR REPLACE VIEW {db}.v_rollout_resources AS
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
