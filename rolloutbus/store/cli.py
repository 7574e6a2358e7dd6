"""``rolloutbus store``: serve the embedded ClickHouse engine over ClickHouse's HTTP interface."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

log = logging.getLogger("rolloutbus.store")


# flag dest → settings field (rolloutbus.store.settings.StoreSettings: each default written there)
_FLAGS = {"host": "store_host", "port": "store_port", "insecure": "insecure"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from foundation import tls
    from foundation.flags import describe_flags

    parser.add_argument("--host", default=None, help="address to serve on")
    parser.add_argument("--port", type=int, default=None, help="port")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="listen on a non-loopback address with users that have no password (logged loudly)")
    parser.add_argument("--path", default=None, help="the engine's data directory (default <data dir>/clickhouse)")
    tls.add_arguments(parser)
    describe_flags(parser, "rolloutbus.store.settings:StoreSettings", _FLAGS)  # each flag's variable and default


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from foundation.entry import settings_from_args
    from foundation.errors import StoreError
    from foundation.chdb_lock import lock_store
    from foundation import tls
    from foundation.exposure import check_listen
    from rolloutbus.store.server import Engine, StoreServer, serve
    from rolloutbus.store.settings import StoreSettings

    s = settings_from_args(StoreSettings, args, _FLAGS)
    users, limits = s.users(), s.limits()
    check_listen(s.store_host, s.has_credentials(), s.insecure, "ROLLOUTBUS_STORE_USERS (name:role:password, every user with a password)",
                 "rolloutbus store")
    ssl_context = tls.from_args(args)
    path = Path(args.path).resolve() if args.path else s.store_path
    lock_store(path, f"rolloutbus store on {s.store_host}:{s.store_port}")
    engine = Engine(path)
    try:
        server = StoreServer((s.store_host, s.store_port), engine, users, limits, ssl_context=ssl_context)
    except OSError as exc:
        engine.close()
        raise StoreError(f"cannot serve on {s.store_host}:{s.store_port}: {exc.strerror or exc} "
                         "(another store or server there? set ROLLOUTBUS_STORE_PORT)") from exc
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    roles = ", ".join(f"{u.name} ({u.role})" for u in users)
    print(f"rolloutbus store: ClickHouse {engine.version} at {path}, serving {tls.scheme(ssl_context)}://{s.store_host}:{server.port} "
          f"(users: {roles})", flush=True)
    try:
        serve(server, stop)
    finally:
        server.server_close()
        engine.close()
        print("rolloutbus store: stopped", flush=True)
    return 0
