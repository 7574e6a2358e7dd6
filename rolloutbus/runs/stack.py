"""The local stack runs use: the broker, the store (where the settings use the local one) and the run's own
processes, one context manager for all of them (``Trainer.fit``, ``rolloutbus demo``, its APO form, and the
learning bench's evaluation of another trainer's model).

On the way in it starts the broker, then the store, each unless it already runs (a ``rolloutbus up``
before the demo); on the way out, also on an exception or Ctrl-C, it stops the processes the demo
started (in reverse order), then the store and the broker if it started them. ``keep_running`` leaves
the broker and the store running; :attr:`LocalStack.keep_store` leaves the store running (a finished
run, there to be queried).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from foundation.config import CommonSettings
from rolloutbus.runs.procs import Supervisor

if TYPE_CHECKING:
    from rolloutbus.local_kafka import LocalKafka
    from rolloutbus.store.local import LocalStore


@dataclass
class LocalStack:
    """What :func:`local_stack` started or found running, and the supervisor of the demo's processes."""

    broker: LocalKafka
    procs: Supervisor
    store: LocalStore | None = None
    started_broker: bool = False
    started_store: bool = False
    keep_store: bool = False  # set once the run is there to be queried: the store this stack started stays up


def process_env(settings: CommonSettings) -> dict[str, str]:
    """The environment of the demo's processes: this one's, their data dir, unbuffered output."""
    return dict(os.environ, ROLLOUTBUS_DATA_DIR=str(settings.data_dir), PYTHONUNBUFFERED="1")


@contextlib.contextmanager
def local_stack(settings: CommonSettings, log_dir: Path, *, keep_running: bool = False) -> Iterator[LocalStack]:
    """The local broker and the local store, each where ``settings`` use it, started unless it runs; the demo's
    processes are started through ``stack.procs`` (logs under ``log_dir``). Everything started here is stopped
    on exit, as the module says."""
    from rolloutbus.local_kafka import LocalKafka

    with contextlib.ExitStack() as on_exit:  # runs in reverse: processes, store, broker; each also if one before fails
        stack = LocalStack(LocalKafka(settings.data_dir, settings.kafka_port), Supervisor(log_dir, process_env(settings)))
        stack.started_broker = settings.uses_local_broker and stack.broker.start()  # a given broker (fit) is not ours
        if stack.started_broker and not keep_running:
            on_exit.callback(stack.broker.stop)
        if settings.uses_local_store:
            from rolloutbus.store.local import LocalStore

            store = stack.store = LocalStore(settings.data_dir, settings.store_host, settings.store_port)
            stack.started_store = store.start()
            if stack.started_store and not keep_running:
                on_exit.callback(lambda: None if stack.keep_store else store.stop())
        on_exit.callback(stack.procs.stop_all)
        yield stack


def say_stack(stack: LocalStack, say: Callable[[str], None]) -> None:
    """The stack's first lines: the broker and the store, started or found running."""
    say(f"kafka      {'started' if stack.started_broker else 'reused'} on {stack.broker.bootstrap}")
    if stack.store is not None:
        say(f"store      {'started' if stack.started_store else 'reused'} on {stack.store.url}: query the run while it trains")


__all__ = ["LocalStack", "local_stack", "process_env", "say_stack"]
