"""``rolloutbus export --report-to tensorboard,mlflow,wandb``: a finished run's metrics from ClickHouse to the experiment trackers
(:mod:`rolloutbus.runs.export`). The store is the one ``rolloutbus query`` reads (``ROLLOUTBUS_CLICKHOUSE_DSN``);
``--run RUN`` a ``fit`` run's own database; the trackers write under ``--tracker-dir`` (default
``<data dir>/trackers``), as ``rolloutbus train --report-to`` does."""

from __future__ import annotations

import argparse
from pathlib import Path

from foundation.flags import describe_flags


# flag dest → trainer.settings.TrainerSettings field: the same settings `rolloutbus train` reports with
_FLAGS = {"report_to": "report_to", "resource_name": "resource_name", "tracker_dir": "tracker_dir"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report-to", metavar="NAMES", help="comma-separated trackers (foundation.trackers.TRACKERS: tensorboard, mlflow, wandb)")
    parser.add_argument("--run", metavar="RUN", help="a fit run's own database (`rolloutbus runs` lists them)")
    parser.add_argument("--run-id", help="one training run of the database (train_steps.run_id; default: every one)")
    parser.add_argument("--resource-name", help="the resource the run trained, the first half of the tracker's run name <resource>-<run id>")
    parser.add_argument("--tracker-dir", type=Path, help="where the trackers write (default <data dir>/trackers)")
    describe_flags(parser, "trainer.settings:TrainerSettings", _FLAGS)


def run(args: argparse.Namespace) -> int:
    import re

    from foundation.clickhouse import connect
    from foundation.entry import settings_from_args
    from foundation.errors import ConfigError
    from foundation.registry import load_plugins
    from rolloutbus.runs.export import export
    from trainer.settings import TrainerSettings

    load_plugins()  # a user's registered trackers, before the settings check the names
    s = settings_from_args(TrainerSettings, args, _FLAGS)  # a bad setting is one line before anything is read
    if args.run_id is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", args.run_id):
        raise ConfigError(f"--run-id {args.run_id!r}: a run id is letters, digits, '.', '_' and '-' (train_steps.run_id)")
    names = [n.strip() for n in s.report_to.split(",") if n.strip()]  # each a registered tracker (the settings check)
    if not names:
        raise ConfigError("give the trackers to write to: --report-to tensorboard, mlflow or wandb (or ROLLOUTBUS_REPORT_TO)")
    if args.run:
        from rolloutbus.runs.scope import run_database

        s = s.model_copy(update={"clickhouse_database": run_database(s, args.run)})
    root = s.resolved_tracker_dir()
    client = connect(s.dsn, database=s.clickhouse_database, password=s.clickhouse_password, create_database=False)
    try:
        written = export(client, ",".join(names), root, s.resource_name, args.run_id, s.clickhouse_database)
    except Exception as exc:  # noqa: BLE001 - what the driver raises for a missing database or table varies
        from clickhouse_connect.driver.exceptions import ClickHouseError as DriverError

        from foundation.errors import ClickHouseError

        if not isinstance(exc, DriverError):
            raise
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        raise ClickHouseError(f"cannot read the run's metrics from {s.clickhouse_database}: {first} (`rolloutbus runs` "
                              "lists the fit runs; --run RUN reads one)") from exc
    finally:
        client.close()
    if not written:
        print(f"no training steps in {s.clickhouse_database}.train_steps" + (f" for run {args.run_id}" if args.run_id else ""))
        return 1
    for name, steps in written.items():
        print(f"{name}: {steps} steps to {','.join(names)} under {root}")
    return 0
