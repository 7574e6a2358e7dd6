"""Where a ``fit`` run keeps its records. On the local stack fit owns (neither ``ROLLOUTBUS_KAFKA_BOOTSTRAP``
nor ``ROLLOUTBUS_CLICKHOUSE_DSN`` set) it resets the demo's topics and database for a fresh run, as the demo
does. On given addresses (either set: a deployment others may use too) it deletes nothing: the run gets a
namespace of its own, created if missing — its topics under ``<prefix>fit-<run>.`` (and with them the stream
worker's, the trainer's and the runners' consumer groups, the policy server's and the live table's reads of
versions, the trainer's version numbers) and its database ``<database>_fit_<run>`` (the store's ``resources``
and ``groups`` rows are keyed by resource name and version, and by task id and version, which runs repeat: in
one database a run would replace an earlier run's rows). Nothing of another run is read, replaced or removed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from foundation.config import CommonSettings
from foundation.errors import ConfigError
from foundation.redact import redact_url

if TYPE_CHECKING:
    from rolloutbus.demo.stack import LocalStack


def given_addresses(settings: CommonSettings) -> bool:
    """Whether the settings name a broker or a store of their own (fit then resets nothing). Pure."""
    return not settings.uses_local_broker or not settings.uses_local_store


@dataclass(frozen=True)
class RunScope:
    """The settings a run uses (its topic prefix and database), the environment its processes get on top of
    fit's own, and the run's name (None: the local stack, reset for each run)."""

    settings: CommonSettings
    run: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def run_scope(settings: CommonSettings, run: str | None = None) -> RunScope:
    """The local stack's scope as it is, or a fresh namespace for a run on given addresses (``run``: its name,
    default a random one). The consumer groups are set, not left to the defaults, so that a group the user's
    environment names (``ROLLOUTBUS_APP_ID``, ``ROLLOUTBUS_TRAIN_GROUP``, ``ROLLOUTBUS_RUNNER_GROUP``: the
    deployment's own processes') is never joined. Pure but for the random name."""
    if not given_addresses(settings):
        return RunScope(settings)
    if settings.clickhouse_dsn and settings.clickhouse_dsn.startswith("chdb:"):
        raise ConfigError("fit's processes share one store, and chdb:// opens the engine in one process: give an HTTP "
                          "ClickHouse in ROLLOUTBUS_CLICKHOUSE_DSN (or unset it for the local store, `rolloutbus store`)")
    run = run or uuid.uuid4().hex[:8]
    prefix, database = f"{settings.topic_prefix}fit-{run}.", f"{settings.clickhouse_database}_fit_{run}"
    scoped = settings.model_copy(update={"topic_prefix": prefix, "clickhouse_database": database})
    env = {"ROLLOUTBUS_TOPIC_PREFIX": prefix, "ROLLOUTBUS_CLICKHOUSE_DATABASE": database, "ROLLOUTBUS_APP_ID": f"{prefix}streams",
           "ROLLOUTBUS_TRAIN_GROUP": f"{prefix}trainer", "ROLLOUTBUS_RUNNER_GROUP": f"{prefix}runners"}
    return RunScope(scoped, run, env)


def where_lines(scope: RunScope, stack: LocalStack) -> list[str]:
    """What fit says first on given addresses: which broker and which ClickHouse the run uses (a local one
    where only the other is given), and the run's names. Pure."""
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
            f"(query it: ROLLOUTBUS_CLICKHOUSE_DATABASE={s.clickhouse_database} rolloutbus query ...)"]


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


__all__ = ["RunScope", "check_given", "given_addresses", "prepare", "run_scope", "where_lines"]
