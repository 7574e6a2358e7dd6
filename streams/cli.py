"""``rolloutbus process``: run the stream worker. Flags fall back to ``ROLLOUTBUS_*`` variables."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from foundation.kafka_admin import TopicSpec

log = logging.getLogger("rolloutbus.streams")

# flag → settings field. Every flag defaults to None so the environment / documented default applies.
_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--group-size", {"type": int, "dest": "group_size", "help": "rollouts per GRPO group"}),
    ("--group-min-rollouts", {"type": int, "dest": "group_min_rollouts", "help": "fewest rollouts a timed-out group emits with"}),
    ("--group-timeout", {"type": float, "dest": "group_timeout_s", "help": "seconds after a group's first rollout to emit it anyway"}),
    ("--no-std-scaling", {"action": "store_const", "const": False, "dest": "scale_by_std", "help": "advantages are R - mean, not divided by std"}),
    ("--credit", {"dest": "credit", "metavar": "MODE", "help": "credit assignment: a registered mode: identical, discounted, per-turn (ROLLOUTBUS_PLUGINS imports modules that register more)"}),
    ("--advantage-estimator", {"dest": "advantage_estimator", "metavar": "NAME",
                               "help": "how the group's step returns become advantages: grpo, rloo, verl:<name> (verl's), or a registered one"}),
    ("--gamma", {"type": float, "dest": "gamma", "help": "discount for --credit discounted"}),
    ("--agent-match", {"dest": "agent_match", "help": "regex of agent names to train; others are stored with trained=false"}),
    ("--llm-call-match", {"dest": "llm_call_match", "help": "regex of span names that are LLM calls (default: any span with an LLM record)"}),
    ("--include-llm-calls-in-reward", {"action": "store_const", "const": False, "dest": "exclude_llm_call_in_reward",
                                       "help": "count LLM calls made inside reward spans (an LLM judge) as steps"}),
    ("--reward-rules", {"dest": "reward_rules", "help": "TOML/JSON file of intermediate reward rules"}),
    ("--rollout-timeout", {"type": float, "dest": "rollout_timeout_s", "help": "seconds of silence before a rollout is timed out"}),
    ("--finish-grace", {"type": float, "dest": "finish_grace_s", "help": "seconds after FINISHED to wait for missing sequence ids"}),
    ("--completed-retention", {"type": float, "dest": "completed_retention_s", "help": "seconds a completed attempt is remembered, so later spans count as late"}),
    ("--sink-batch-size", {"type": int, "dest": "sink_batch_size", "help": "rows per ClickHouse insert"}),
    ("--sink-interval", {"type": float, "dest": "sink_interval_s", "help": "longest seconds rows wait for an insert"}),
    ("--sink-sync", {"action": "store_const", "const": False, "dest": "sink_pipelined",
                     "help": "wait for each insert instead of reading on while ClickHouse takes it (env ROLLOUTBUS_SINK_PIPELINED=false)"}),
    ("--metrics-port", {"type": int, "dest": "streams_metrics_port",
                        "help": "port of /metrics, /healthz and /readyz (0: off)"}),
    ("--metrics-host", {"dest": "streams_metrics_host",
                        "help": "address they bind (0.0.0.0 for probes from outside)"}),
    ("--shutdown-timeout", {"type": float, "dest": "shutdown_timeout_s", "help": "seconds SIGTERM may take, broker gone or not"}),
    ("--state-store", {"dest": "state_store", "help": "faust table store: memory:// or rocksdb://"}),
    ("--feedback-window", {"type": float, "dest": "feedback_window_s",
                           "help": "seconds after a rollout finished that its late feedback is applied"}),
    ("--report-to", {"dest": "streams_report_to", "metavar": "NAMES",
                     "help": "experiment trackers to report the emitted groups to, comma-separated: tensorboard, mlflow, wandb"}),
    ("--tracker-dir", {"dest": "tracker_dir", "help": "where the trackers write (default <data dir>/trackers)"}),
    ("--report-interval", {"type": float, "dest": "report_interval_s", "help": "seconds between two reports to the trackers"}),
    ("--feedback-baseline", {"dest": "feedback_baseline",
                             "help": "advantage of a task-less rollout trained on its feedback: loo (default: the agent's running "
                                     "leave-one-out mean), prompt (the same prompt's earlier feedback) or none"}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from foundation.errors import ConfigError
    from foundation.registry import load_plugins
    from streams.baselines import FEEDBACK_BASELINES
    from streams.credit import CREDIT
    from streams.grouping import ESTIMATORS

    try:
        load_plugins()  # the choices read the registries, the user's entries included
    except ConfigError:
        pass  # said in one line when the command runs
    registered = {"credit": CREDIT.names(), "advantage_estimator": ESTIMATORS.choices(),
                  "feedback_baseline": FEEDBACK_BASELINES.names()}
    for flag, kw in _FLAGS:
        extra = {"choices": registered[kw["dest"]]} if kw["dest"] in registered else {}
        parser.add_argument(flag, default=None, **kw, **extra)
    from foundation.flags import describe_flags

    describe_flags(parser, "streams.settings:StreamSettings", [kw["dest"] for _, kw in _FLAGS])  # each flag's variable and default


def settings_from_args(args: argparse.Namespace) -> Any:
    """Explicit flag beats environment variable beats documented default."""
    from foundation.config import load_settings
    from foundation.registry import load_plugins
    from streams.settings import StreamSettings

    load_plugins()  # the user's registered credit modes and estimators, before the settings name them
    # The flags' names are not their fields' (--group-timeout sets group_timeout_s): named one by one.
    overrides = {kw["dest"]: getattr(args, kw["dest"]) for _, kw in _FLAGS if getattr(args, kw["dest"], None) is not None}
    if getattr(args, "data_dir", None) is not None:
        overrides["data_dir"] = args.data_dir
    return load_settings(StreamSettings, overrides, {kw["dest"]: flag for flag, kw in _FLAGS})


def _span_partitions(conf: dict[str, Any], topic: str, wait_s: float = 30.0) -> int:
    """The partitions of ``topic``; a topic just created (or a broker just restarted) may show none in the metadata
    for a moment, so it is asked again until ``wait_s`` has passed (0: none there)."""
    import time

    from foundation.kafka_admin import admin

    client, deadline = admin(conf), time.monotonic() + wait_s
    while True:
        t = client.list_topics(timeout=30).topics.get(topic)
        if (t is not None and t.partitions) or time.monotonic() >= deadline:
            return len(t.partitions) if t is not None and t.partitions else 0
        time.sleep(0.5)


def worker_topics(prefix: str, app_id: str, partitions: int) -> list[TopicSpec]:
    """The topics the worker makes for itself: the rollouts' summaries re-keyed by group id (as many partitions as
    rb.spans, so the group table co-partitions with it; a summary carries every step's token ids, so it takes
    records as large as rb.spans does) and the span stage's changelog of completed attempts."""
    from foundation.kafka_admin import MAX_RECORD_BYTES, TopicSpec
    from streams.app import done_topic_name
    from streams.feedback_stage import feedback_topic_name
    from streams.spans_stage import state_topic_name

    return [
        TopicSpec(done_topic_name(prefix), partitions, {"max.message.bytes": MAX_RECORD_BYTES}),
        TopicSpec(state_topic_name(app_id), partitions, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}),
        # Late feedback, keyed by rollout id: co-partitioned with the feedback stage's table.
        TopicSpec(feedback_topic_name(prefix), partitions),
    ]


def run(args: argparse.Namespace) -> int:
    from foundation.clickhouse import open_store, redact_dsn
    from foundation.health import serve_health
    from foundation.errors import ConfigError, KafkaUnavailable
    from foundation.kafka_admin import MAX_RECORD_BYTES, TopicSpec, ensure_topics, topic_specs
    from streams.app import Config, Worker, faust_worker
    from streams.grouping import GroupPolicy
    from streams.health import StreamHealth
    from streams.rewards import RewardRules
    from streams.rollout import Settings
    from streams.sink import ClickHouseSink
    from streams.transitions import agent_matcher, llm_call_matcher

    s = settings_from_args(args)
    try:
        rules = RewardRules.load(s.reward_rules) if s.reward_rules else RewardRules()
        agent_matcher(s.agent_match)
        llm_call_matcher(s.llm_call_match)
        policy = GroupPolicy(group_size=s.group_size, min_rollouts=min(s.group_min_rollouts, s.group_size),
                             timeout_s=s.group_timeout_s, scale_by_std=s.scale_by_std, estimator=s.advantage_estimator)
        core = Settings(credit=s.credit, gamma=s.gamma, agent_match=s.agent_match, rules=rules,
                        llm_call_match=s.llm_call_match, exclude_llm_call_in_reward=s.exclude_llm_call_in_reward)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if s.state_store.startswith("rocksdb"):
        try:
            import rocksdict  # noqa: F401
        except ImportError as exc:
            from foundation.extras import install_hint

            raise ConfigError(f"state store rocksdb:// needs rocksdict: {install_hint('rocksdb')}") from exc

    # Probes answer from here on: /healthz at once, /readyz 503 until the span stage holds partitions.
    health = StreamHealth(stall_s=s.streams_stall_s)
    serve_health(health.verdict, s.streams_metrics_host, s.streams_metrics_port,
                 explicit="streams_metrics_port" in s.model_fields_set,
                 flag="--metrics-port", env="ROLLOUTBUS_STREAMS_METRICS_PORT")

    conf = s.kafka_conf()
    topics = s.topics
    ensure_topics(conf, topic_specs(topics))
    partitions = _span_partitions(conf, topics.spans)
    if partitions < 1:
        raise KafkaUnavailable(f"topic {topics.spans} has no partitions on {s.bootstrap}")
    ensure_topics(conf, worker_topics(topics.prefix, s.application_id, partitions))

    client = open_store(s.dsn, s.clickhouse_database, s.clickhouse_password)
    sink = ClickHouseSink(client, batch_size=s.sink_batch_size, interval_s=s.sink_interval_s)
    cfg = Config(
        app_id=s.application_id, broker=f"kafka://{s.bootstrap}", topic_prefix=topics.prefix, partitions=partitions,
        core=core, groups=policy, rollout_timeout_s=s.rollout_timeout_s, completed_retention_s=s.completed_retention_s,
        finish_grace_s=s.finish_grace_s, shutdown_timeout_s=s.shutdown_timeout_s, sink_pipelined=s.sink_pipelined,
        feedback_window_s=s.feedback_window_s, feedback_baseline=s.feedback_baseline,
        store=s.state_store, tick_s=min(0.5, s.sink_interval_s), credentials=s.kafka_security.faust(), kafka_conf=conf, datadir=str(s.data_dir / "faust" / s.application_id),
    )
    report = _start_report(s)
    worker = Worker(cfg, sink, health, on_group=report.add if report is not None else None)
    # faust creates its tables' changelogs as it starts, which can be after its consumer (or another
    # worker's) fetched metadata; a group leader that does not know a changelog leaves it out of the
    # assignment for up to aiokafka's metadata max age (5 min), and that table is not recovered after
    # a rebalance. Created before any worker's faust starts, every worker knows them.
    # A group-members entry is a whole rollout summary: as large as the done topic's records.
    ensure_topics(conf, [TopicSpec(name, partitions, {"cleanup.policy": "compact", "max.message.bytes": MAX_RECORD_BYTES})
                         for name in worker.table_changelogs()])
    print(
        f"rolloutbus process: {topics.spans} ({partitions} partitions) → {redact_dsn(s.dsn)}/{s.clickhouse_database}, "
        f"groups of {s.group_size} → {topics.batches}",
        flush=True,
    )
    level = "debug" if getattr(args, "verbose", False) else "warning"
    try:
        faust_worker(worker, level).execute_from_commandline()
    finally:
        if report is not None:
            report.close()
    return 0


class _Reporting:
    """``--report-to``: a thread that hands the trackers the groups emitted (streams.report) every report interval,
    and the last window when the worker stops."""

    def __init__(self, trackers: Any, interval_s: float) -> None:
        import threading
        import time

        from streams.report import StreamReport

        self.trackers, self.interval_s = trackers, interval_s
        self.report = StreamReport(time.monotonic(), _spans_taken())
        self.add = self.report.add
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rolloutbus-report", daemon=True)
        self._thread.start()

    def _log(self) -> None:
        import time

        taken = self.report.take(time.monotonic(), _spans_taken())
        if taken is not None:
            try:
                self.trackers.log(*taken)
            except Exception as exc:  # noqa: BLE001 — a tracker's failure must not stop the stream
                log.warning("report to the trackers failed: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._log()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._log()
        self.trackers.close()


def _spans_taken() -> float:
    """The spans the worker took in so far (its rolloutbus_streams_spans_total, late or not)."""
    from prometheus_client import REGISTRY

    return sum(REGISTRY.get_sample_value("rolloutbus_streams_spans_total", {"late": late}) or 0.0 for late in ("false", "true"))


def _start_report(s: Any) -> _Reporting | None:
    """The trackers ``--report-to`` names, under the run name ``<app id>-<start time>``, with the worker's learning
    settings as the run's configuration; None without ``--report-to``."""
    if not s.streams_report_to:
        return None
    import time

    from foundation.trackers import Trackers

    config = {k: str(getattr(s, k)) for k in ("group_size", "group_min_rollouts", "group_timeout_s", "credit", "gamma",
                                              "advantage_estimator", "scale_by_std", "reward_rules", "feedback_baseline")}
    run = f"{s.application_id}-{time.strftime('%Y%m%d-%H%M%S')}"
    trackers = Trackers.open(s.streams_report_to, s.resolved_tracker_dir(), run, {**config, "topic_prefix": s.topic_prefix})
    print(f"rolloutbus process: reporting to {s.streams_report_to} as {run} every {s.report_interval_s:g} s", flush=True)
    return _Reporting(trackers, s.report_interval_s)


def main(argv: list[str] | None = None) -> int:
    """``python -m streams.cli``: the same as ``rolloutbus process``, without the other subcommands."""
    from foundation.entry import run_command

    return run_command("rolloutbus process", add_arguments, run, argv, description="run the stream processor")


if __name__ == "__main__":
    raise SystemExit(main())
