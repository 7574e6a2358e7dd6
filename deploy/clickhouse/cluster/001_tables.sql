-- Cluster variant of ../migrations/001_tables.sql, for a ClickHouse cluster with Keeper (or ZooKeeper).
-- Selected with ROLLOUTBUS_CLICKHOUSE_CLUSTER=<cluster name>; the same `rolloutbus migrate` applies it.
--
-- Each table of the single-node schema becomes two:
--   {db}.<name>_local  ReplicatedReplacingMergeTree on every replica of every shard (same columns, same
--                      ORDER BY, same version column), so a record delivered twice is one row after FINAL;
--   {db}.<name>        a Distributed table over the local tables, with the name the views and the sink use.
-- The sharding key is always built from the ORDER BY key, so every copy of one record lands on the same
-- shard and FINAL (which merges within a shard) still collapses duplicates.
-- '{cluster}', '{shard}', '{replica}' and '{database}' are server macros (<macros> in the server config,
-- which the ClickHouse operator writes); only {db} is replaced by the migration runner.
-- Inserts should run with distributed_foreground_insert = 1 (see deploy/README.md) so the sink's
-- deduplication tokens reach the replicated tables and a failed insert is retried by the sink.

CREATE DATABASE IF NOT EXISTS {db} ON CLUSTER '{cluster}';

CREATE TABLE IF NOT EXISTS {db}.spans_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/spans_local', '{replica}')
ORDER BY (rollout_id, attempt_id, span_id)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.spans ON CLUSTER '{cluster}'
AS {db}.spans_local
ENGINE = Distributed('{cluster}', '{db}', 'spans_local', cityHash64(rollout_id));

CREATE TABLE IF NOT EXISTS {db}.rollouts_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/rollouts_local', '{replica}', updated_ns)
ORDER BY (rollout_id, attempt_id)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.rollouts ON CLUSTER '{cluster}'
AS {db}.rollouts_local
ENGINE = Distributed('{cluster}', '{db}', 'rollouts_local', cityHash64(rollout_id));

CREATE TABLE IF NOT EXISTS {db}.transitions_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/transitions_local', '{replica}', updated_ns)
ORDER BY (rollout_id, attempt_id, turn)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.transitions ON CLUSTER '{cluster}'
AS {db}.transitions_local
ENGINE = Distributed('{cluster}', '{db}', 'transitions_local', cityHash64(rollout_id));

CREATE TABLE IF NOT EXISTS {db}.groups_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/groups_local', '{replica}')
ORDER BY group_id
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.groups ON CLUSTER '{cluster}'
AS {db}.groups_local
ENGINE = Distributed('{cluster}', '{db}', 'groups_local', cityHash64(group_id));

CREATE TABLE IF NOT EXISTS {db}.resource_versions_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/resource_versions_local', '{replica}')
ORDER BY (name, version)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.resource_versions ON CLUSTER '{cluster}'
AS {db}.resource_versions_local
ENGINE = Distributed('{cluster}', '{db}', 'resource_versions_local', cityHash64(name));

CREATE TABLE IF NOT EXISTS {db}.train_steps_local ON CLUSTER '{cluster}'
(
    run_id            String,
    step              Int64,
    time_ns           Int64,
    resource_version  Nullable(Int64),
    group_ids         Array(String),
    metrics           Map(String, Float64),
    time              DateTime64(9) ALIAS fromUnixTimestamp64Nano(time_ns)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/train_steps_local', '{replica}')
ORDER BY (run_id, step)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.train_steps ON CLUSTER '{cluster}'
AS {db}.train_steps_local
ENGINE = Distributed('{cluster}', '{db}', 'train_steps_local', cityHash64(run_id));

CREATE TABLE IF NOT EXISTS {db}.dead_letters_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/dead_letters_local', '{replica}')
ORDER BY (dlq_partition, dlq_offset)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.dead_letters ON CLUSTER '{cluster}'
AS {db}.dead_letters_local
ENGINE = Distributed('{cluster}', '{db}', 'dead_letters_local', cityHash64(dlq_partition, dlq_offset));
