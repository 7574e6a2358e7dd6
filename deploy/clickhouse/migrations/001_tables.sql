-- Core tables. Every table uses ReplacingMergeTree on the record's identity, so a record delivered
-- twice (a worker restarted before it committed its offsets) is one row to a reader using FINAL
-- (all views do). Inserts also carry deduplication tokens (non_replicated_deduplication_window).
-- Times are stored as nanosecond integers; the *_at columns are ALIASes for SQL convenience.

CREATE TABLE IF NOT EXISTS {db}.spans
(
    rollout_id         String,
    attempt_id         String,
    span_id            String,
    sequence_id        UInt64,
    trace_id           String,
    parent_id          Nullable(String),
    name               String,
    kind               LowCardinality(String),
    agent_name         Nullable(String),
    start_time_ns      Int64,
    end_time_ns        Int64,
    status_code        LowCardinality(String),
    status_message     Nullable(String),
    attributes         Map(String, String),
    events             Array(Tuple(name String, time_ns Int64, attributes Map(String, String))),
    resource           Map(String, String),
    model              Nullable(String),
    prompt_token_ids   Array(UInt32),
    response_token_ids Array(UInt32),
    response_logprobs  Array(Float32),
    resource_version   Nullable(Int64),
    reward             Nullable(Float64),
    reward_dimensions  Map(String, Float64),
    tool_name          Nullable(String),
    tool_ok            Nullable(Bool),
    tool_arguments     Nullable(String),
    tool_result        Nullable(String),
    tool_error         Nullable(String),
    late               Bool DEFAULT false,
    kafka_partition    Int32,
    kafka_offset       Int64,
    ingested_ns        Int64,
    start_time         DateTime64(9) ALIAS fromUnixTimestamp64Nano(start_time_ns),
    end_time           DateTime64(9) ALIAS fromUnixTimestamp64Nano(end_time_ns),
    duration_ms        Float64 ALIAS (end_time_ns - start_time_ns) / 1e6
)
ENGINE = ReplacingMergeTree
ORDER BY (rollout_id, attempt_id, span_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.rollouts
(
    rollout_id        String,
    attempt_id        String,
    task_id           String,
    mode              LowCardinality(String),
    attempt           UInt32,
    resource_version  Nullable(Int64),
    status            LowCardinality(String),
    final_reward      Nullable(Float64),
    started_ns        Int64,
    finished_ns       Int64,
    span_count        UInt64,
    spans_seen        UInt64,
    missing_sequence_ids Array(UInt64),
    transition_count  UInt32,
    group_id          String,
    error             Nullable(String),
    metadata          Map(String, String),
    updated_ns        Int64,
    started_at        DateTime64(9) ALIAS fromUnixTimestamp64Nano(started_ns),
    finished_at       DateTime64(9) ALIAS fromUnixTimestamp64Nano(finished_ns),
    duration_s        Float64 ALIAS (finished_ns - started_ns) / 1e9
)
ENGINE = ReplacingMergeTree(updated_ns)
ORDER BY (rollout_id, attempt_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.transitions
(
    rollout_id         String,
    attempt_id         String,
    turn               UInt32,
    task_id            String,
    span_id            String,
    agent_name         Nullable(String),
    resource_version   Nullable(Int64),
    prompt_token_ids   Array(UInt32),
    response_token_ids Array(UInt32),
    response_logprobs  Array(Float32),
    response_mask      Array(UInt8),
    reward             Float64,
    return_            Float64,
    advantage          Float64,
    trained            Bool,
    group_id           String,
    credit             LowCardinality(String),
    updated_ns         Int64
)
ENGINE = ReplacingMergeTree(updated_ns)
ORDER BY (rollout_id, attempt_id, turn)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.groups
(
    group_id          String,
    task_id           String,
    resource_version  Nullable(Int64),
    group_size        UInt32,
    rollouts          UInt32,
    complete          Bool,
    zero_variance     Bool,
    credit            LowCardinality(String),
    rollout_ids       Array(String),
    rewards           Array(Float64),
    advantages        Array(Float64),
    reward_mean       Float64,
    reward_std        Float64,
    created_ns        Int64,
    created_at        DateTime64(9) ALIAS fromUnixTimestamp64Nano(created_ns)
)
ENGINE = ReplacingMergeTree
ORDER BY group_id
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.resource_versions
(
    name        String,
    version     Int64,
    kind        LowCardinality(String),
    uri         String,
    base_model  String,
    step        Int64,
    created_ns  Int64,
    metrics     Map(String, Float64),
    config      Map(String, String),
    created_at  DateTime64(9) ALIAS fromUnixTimestamp64Nano(created_ns)
)
ENGINE = ReplacingMergeTree
ORDER BY (name, version)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.train_steps
(
    run_id            String,
    step              Int64,
    time_ns           Int64,
    resource_version  Nullable(Int64),
    group_ids         Array(String),
    metrics           Map(String, Float64),
    time              DateTime64(9) ALIAS fromUnixTimestamp64Nano(time_ns)
)
ENGINE = ReplacingMergeTree
ORDER BY (run_id, step)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.dead_letters
(
    source_topic  String,
    partition     Int32,
    offset        Int64,
    reason        LowCardinality(String),
    detail        String,
    stage         LowCardinality(String),
    key           Nullable(String),
    value         Nullable(String),
    time_ns       Int64,
    dlq_partition Int32,
    dlq_offset    Int64,
    time          DateTime64(9) ALIAS fromUnixTimestamp64Nano(time_ns)
)
ENGINE = ReplacingMergeTree
ORDER BY (dlq_partition, dlq_offset)
SETTINGS non_replicated_deduplication_window = 10000;
