"""Where a run keeps its records. A ``fit`` run, on the local stack or on given addresses (a deployment others
may use too), deletes nothing: it gets a namespace of its own, created if missing — its topics under ``<prefix>fit-<run>.`` (and with them the stream
worker's, the trainer's and the runners' consumer groups, the policy server's and the live table's reads of
versions, the trainer's version numbers) and its database ``<database>_fit_<run>`` (the store's ``resources``
and ``groups`` rows are keyed by resource name and version, and by task id and version, which runs repeat: in
one database a run would replace an earlier run's rows). Nothing of another run is read, replaced or removed;
earlier runs stay queryable (``rolloutbus runs`` lists them, ``rolloutbus runs rm RUN`` removes one).

The demo owns the default namespace on the local stack (``rb.*`` topics, the ``rolloutbus`` database) and resets
only that for a fresh run (:func:`reset_namespace`): every fit run's namespace stays.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import re
import time

from foundation.config import CommonSettings
from foundation.errors import ConfigError, RolloutbusError
from foundation.redact import redact_url

if TYPE_CHECKING:
    from rolloutbus.runs.stack import LocalStack


def given_addresses(settings: CommonSettings) -> bool:
    """Whether the settings name a broker or a store of their own (not the local stack's). Pure."""
    return not settings.uses_local_broker or not settings.uses_local_store


@dataclass(frozen=True)
class RunScope:
    """The settings a run uses (its topic prefix and database), the environment its processes get on top of
    fit's own, and the run's name (None: the settings as they are, the demo's namespace)."""

    settings: CommonSettings
    run: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def run_scope(settings: CommonSettings, run: str | None = None) -> RunScope:
    """A fresh namespace for a run (``run``: its name, default a random one), on the local stack as on given
    addresses. The consumer groups are set, not left to the defaults, so that a group the user's environment
    names (``ROLLOUTBUS_APP_ID``, ``ROLLOUTBUS_TRAIN_GROUP``, ``ROLLOUTBUS_RUNNER_GROUP``: the deployment's own
    processes') is never joined. Pure but for the random name."""
    if given_addresses(settings) and settings.clickhouse_dsn and settings.clickhouse_dsn.startswith("chdb:"):
        raise ConfigError("fit's processes share one store, and chdb:// opens the engine in one process: give an HTTP "
                          "ClickHouse in ROLLOUTBUS_CLICKHOUSE_DSN (or unset it for the local store, `rolloutbus store`)")
    run = run or uuid.uuid4().hex[:8]
    prefix, database = run_prefix(settings, run), run_database(settings, run)
    scoped = settings.model_copy(update={"topic_prefix": prefix, "clickhouse_database": database})
    env = {"ROLLOUTBUS_TOPIC_PREFIX": prefix, "ROLLOUTBUS_CLICKHOUSE_DATABASE": database, "ROLLOUTBUS_APP_ID": f"{prefix}streams",
           "ROLLOUTBUS_TRAIN_GROUP": f"{prefix}trainer", "ROLLOUTBUS_RUNNER_GROUP": f"{prefix}runners"}
    return RunScope(scoped, run, env)


RUN_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def run_prefix(settings: CommonSettings, run: str) -> str:
    """The topic prefix of run ``run`` under the settings' prefix. Pure."""
    return f"{settings.topic_prefix}fit-{run}."


def run_database(settings: CommonSettings, run: str) -> str:
    """The database of run ``run`` beside the settings' database. Pure."""
    return f"{settings.clickhouse_database}_fit_{run}"


def own_topics(names: list[str] | set[str], prefix: str) -> list[str]:
    """Of ``names``, the topics of the namespace ``prefix`` itself: under it, and not a run's namespace
    nested in it (``<prefix>fit-<run>.``). Pure."""
    return sorted(t for t in names if t.startswith(prefix) and not t.startswith(f"{prefix}fit-"))


def reset_namespace(settings: CommonSettings, say: Callable[[str], None]) -> None:
    """A fresh run in the settings' own namespace (the demo's): its topics, consumer groups and database are
    removed and the topics created again. Runs' namespaces under it (``rolloutbus runs``) are left as they are."""
    from foundation.clickhouse import connect
    from foundation.kafka_admin import admin, ensure_topics, topic_specs

    prefix = settings.topic_prefix
    a = admin(settings.kafka_conf())
    old = own_topics(set(a.list_topics(timeout=10).topics), prefix)
    if old:
        for fut in a.delete_topics(old, operation_timeout=30).values():
            try:
                fut.result()
            except Exception:  # noqa: BLE001 - already gone
                pass
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and set(old) & set(a.list_topics(timeout=10).topics):
            time.sleep(0.5)
    # The previous run's consumer groups go too: a group's offsets can outlive its topic's deletion, and a consumer
    # whose committed offset lies past the end of the recreated topic waits there (seen: faust on <prefix>feedback).
    # A group the previous run's worker has not left yet (a slow shutdown on a busy machine) cannot be deleted:
    # its committed offsets would outlive the recreated topics and the new worker would skip the new run's first
    # records as already seen. Deleted again until none is left (the broker ends an old member's session; a
    # coordinator still loading answers with an error that passes). A group an old worker commits to after this
    # (recreating it) is harmless: the stages read a partition whose committed offset lies past its end from its
    # beginning (streams.spans_stage.resume_point, streams.faust_guards).
    deadline = time.monotonic() + 60
    while True:
        groups = [g.group_id for g in a.list_consumer_groups().result().valid
                  if own_topics([g.group_id], prefix) or g.group_id.startswith("demo-live-")]
        left = {}
        for gid, fut in (a.delete_consumer_groups(groups).items() if groups else ()):
            try:
                fut.result()
            except Exception as exc:  # noqa: BLE001 - already gone (fine), else try again
                if "GROUP_ID_NOT_FOUND" not in str(exc) and own_topics([gid], prefix):
                    left[gid] = str(exc)  # a live view's group (demo-live-*) may be another run's: tried once
        if not left:
            break
        if time.monotonic() > deadline:
            busy = [g for g, why in left.items() if "NON_EMPTY" in why or "not empty" in why.lower()]
            raise RolloutbusError(f"consumer groups {busy} still have members a minute on: another run is using "
                                  f"{prefix}* (stop it, or give this run another ROLLOUTBUS_TOPIC_PREFIX)" if busy else
                                  f"consumer groups of {prefix}* could not be deleted a minute on: {left}")
        time.sleep(1.0)
    for attempt in range(20):
        try:
            ensure_topics(settings.kafka_conf(), topic_specs(settings.topics, 4))
            break
        except RolloutbusError:
            time.sleep(1)  # a deleted topic's name is briefly still taken
    client = connect(settings.dsn, database=None, password=settings.clickhouse_password)
    client.command(f"DROP DATABASE IF EXISTS {settings.clickhouse_database}")
    client.close()
    say(f"reset      {len(old)} old topics and the '{settings.clickhouse_database}' database removed: a fresh run "
        f"(fit runs' namespaces kept: rolloutbus runs)")


@dataclass(frozen=True)
class RunInfo:
    """A run's namespace as the broker and the store hold it."""

    run: str
    database: str | None  # None: the store holds no database of the run
    topics: int
    rollouts: int = 0
    versions: int = 0


def list_runs(settings: CommonSettings) -> list[RunInfo]:
    """Every run's namespace under the settings' prefix and beside its database: topics and database (each
    run's rollouts and published versions counted), oldest name first."""
    from foundation.clickhouse import connect
    from foundation.kafka_admin import admin

    head = f"{settings.topic_prefix}fit-"
    topics: dict[str, int] = {}
    for t in admin(settings.kafka_conf()).list_topics(timeout=10).topics:
        if t.startswith(head) and "." in t[len(head):]:
            run = t[len(head):].split(".", 1)[0]
            topics[run] = topics.get(run, 0) + 1
    client = connect(settings.dsn, database=None, password=settings.clickhouse_password)
    try:
        base = f"{settings.clickhouse_database}_fit_"
        dbs = [r[0] for r in client.query("SELECT name FROM system.databases WHERE startsWith(name, {b:String})",
                                          parameters={"b": base}).result_rows]
        out: dict[str, RunInfo] = {}
        for db in dbs:
            run = db[len(base):]
            try:
                rollouts = int(client.query(f"SELECT count() FROM `{db}`.rollouts FINAL").result_rows[0][0])
                versions = int(client.query(f"SELECT count() FROM `{db}`.resource_versions FINAL").result_rows[0][0])
            except Exception:  # noqa: BLE001 - a database not migrated (yet): its tables are missing
                rollouts = versions = 0
            out[run] = RunInfo(run, db, topics.get(run, 0), rollouts, versions)
    finally:
        client.close()
    for run, n in topics.items():
        out.setdefault(run, RunInfo(run, None, n))
    return [out[k] for k in sorted(out)]


def remove_run(settings: CommonSettings, run: str) -> tuple[int, bool]:
    """Run ``run``'s topics, consumer groups and database removed (nothing else): (topics removed, whether its
    database was there)."""
    from foundation.clickhouse import connect
    from foundation.kafka_admin import admin

    if not RUN_NAME.match(run):
        raise ConfigError(f"{run!r} is not a run's name (rolloutbus runs lists them)")
    prefix, database = run_prefix(settings, run), run_database(settings, run)
    a = admin(settings.kafka_conf())
    topics = [t for t in a.list_topics(timeout=10).topics if t.startswith(prefix)]
    for fut in (a.delete_topics(topics, operation_timeout=30).values() if topics else ()):
        try:
            fut.result()
        except Exception:  # noqa: BLE001 - already gone
            pass
    groups = [g.group_id for g in a.list_consumer_groups().result().valid if g.group_id.startswith(prefix)]
    for fut in (a.delete_consumer_groups(groups).values() if groups else ()):
        try:
            fut.result()
        except Exception:  # noqa: BLE001 - already gone
            pass
    client = connect(settings.dsn, database=None, password=settings.clickhouse_password)
    try:
        had = bool(client.query("SELECT count() FROM system.databases WHERE name = {d:String}",
                                parameters={"d": database}).result_rows[0][0])
        client.command(f"DROP DATABASE IF EXISTS `{database}`")
    finally:
        client.close()
    return len(topics), had


def where_lines(scope: RunScope, stack: LocalStack) -> list[str]:
    """What fit says first: which broker and which ClickHouse the run uses (a local one where only the other is
    given, or both), the run's names, and how to query and remove its data. Pure."""
    s = scope.settings
    if s.uses_local_broker:
        kafka = f"kafka      {'started' if stack.started_broker else 'reused'} on {stack.broker.bootstrap}"
    else:
        kafka = f"kafka      {s.bootstrap} (ROLLOUTBUS_KAFKA_BOOTSTRAP): nothing started or deleted there"
    if stack.store is not None:
        store = f"store      {'started' if stack.started_store else 'reused'} on {stack.store.url}"
    else:
        store = f"store      {redact_url(s.dsn)} (ROLLOUTBUS_CLICKHOUSE_DSN): nothing started or deleted there"
    return [kafka, store, f"run        {scope.run}: its own topics {s.topic_prefix}* and database {s.clickhouse_database} "
            f"(query it: ROLLOUTBUS_CLICKHOUSE_DATABASE={s.clickhouse_database} rolloutbus query ...; "
            f"remove it: rolloutbus runs rm {scope.run})"]


def check_given(settings: CommonSettings, timeout_s: float = 10.0) -> None:
    """One line (the project's error) for a given address that does not answer: called before anything starts."""
    if not settings.uses_local_broker:
        from foundation.kafka_admin import admin, list_topic_names

        errors: list = []
        conf = settings.kafka_conf()
        list_topic_names(admin(conf, errors), conf, errors, timeout_s)
    if not settings.uses_local_store:
        from foundation.clickhouse import connect

        connect(settings.dsn, database=None, password=settings.clickhouse_password).close()


def prepare(scope: RunScope, say: Callable[[str], None]) -> None:
    """The run's topics created and its database migrated, as ``rolloutbus up`` does (nothing deleted)."""
    from foundation.clickhouse import open_store
    from foundation.kafka_admin import ensure_topics, topic_specs

    s = scope.settings
    created = ensure_topics(s.kafka_conf(), topic_specs(s.topics, 4))
    open_store(s.dsn, s.clickhouse_database, s.clickhouse_password, s.clickhouse_cluster).close()
    say(f"prepared   {len(created)} topics created, database {s.clickhouse_database} migrated")


__all__ = ["RunInfo", "RunScope", "check_given", "given_addresses", "list_runs", "own_topics", "prepare", "remove_run",
           "reset_namespace", "run_database", "run_prefix", "run_scope", "where_lines"]
