"""``rolloutbus runs``: the ``fit`` runs on this broker and store (each in its own namespace: topics
``<prefix>fit-<run>.*``, database ``<database>_fit_<run>``), and ``rolloutbus runs rm RUN`` to remove one."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="runs_command", metavar="ACTION")
    sub.add_parser("ls", help="list the runs: name, database, topics, rollouts, versions (the default)")
    rm = sub.add_parser("rm", help="remove runs' topics, consumer groups and databases (nothing else)")
    rm.add_argument("run", nargs="+", help="a run's name, as `rolloutbus runs` lists it")


def run(args: argparse.Namespace) -> int:
    from foundation.config import CommonSettings, load_settings

    s = load_settings(CommonSettings, {"data_dir": args.data_dir} if getattr(args, "data_dir", None) else {})
    broker = None
    if s.uses_local_broker:  # the local broker is started for the command where it is down, and stopped again
        from rolloutbus.local_kafka import LocalKafka

        broker = LocalKafka(s.data_dir, s.kafka_port)
        if not broker.start():
            broker = None
    try:
        return _run(args, s)
    finally:
        if broker is not None:
            broker.stop()


def _run(args: argparse.Namespace, s: object) -> int:
    from rolloutbus.runs.scope import list_runs, remove_run

    if getattr(args, "runs_command", None) == "rm":
        for name in args.run:
            topics, had = remove_run(s, name)
            if not topics and not had:
                print(f"run {name}: nothing found (rolloutbus runs lists the runs)")
            else:
                print(f"run {name}: {topics} topics and {'its database' if had else 'no database'} removed")
        return 0
    runs = list_runs(s)
    if not runs:
        print(f"no runs under {s.topic_prefix}fit-* or {s.clickhouse_database}_fit_*")
        return 0
    print(f"{'run':<10} {'database':<32} {'topics':>6} {'rollouts':>8} {'versions':>8}")
    for r in runs:
        print(f"{r.run:<10} {r.database or '-':<32} {r.topics:>6} {r.rollouts:>8} {r.versions:>8}")
    print("query one: rolloutbus query --run RUN \"SELECT ...\"; remove one: rolloutbus runs rm RUN")
    return 0
