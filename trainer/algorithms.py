"""The training algorithms ``rolloutbus train --algorithm NAME`` runs, by name: the one place to add one (a function
of the trainer's settings returning the exit status, under ``@TRAIN_ALGORITHMS.register("name")``; a plugin named in
``ROLLOUTBUS_PLUGINS`` may register its own). ``--algorithm``'s choices and help are read from here.

The public API's algorithms (``rolloutbus.GRPO``, ``SFT``, ``APO``, ``VERL``: what ``Trainer.fit`` runs) are in
:data:`rolloutbus.trainer_api.algorithms.ALGORITHMS`; those that train run one of these.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundation.registry import Registry

log = logging.getLogger(__name__)

TRAIN_ALGORITHMS: Registry[Callable[[Any], int]] = Registry("training algorithm")
DEFAULT_ALGORITHM = "grpo"  # what --algorithm / ROLLOUTBUS_TRAIN_ALGORITHM default to


def chosen_algorithm(flag: str | None) -> str:
    """The algorithm a ``rolloutbus train`` runs: the flag, else ``ROLLOUTBUS_TRAIN_ALGORITHM``, else the default."""
    return flag or os.environ.get("ROLLOUTBUS_TRAIN_ALGORITHM") or DEFAULT_ALGORITHM


@TRAIN_ALGORITHMS.register("grpo")
def train_grpo(settings: Any) -> int:
    """GRPO on the stream worker's groups (rb.batches), on one rank or several (--nproc-per-node)"""
    from foundation.health import serve_health
    from trainer.device import resolve_device
    from trainer.health import TrainerHealth
    from trainer.loop import Trainer

    device = resolve_device(settings.train_device)  # before anything is loaded or bound
    if settings.nproc_per_node > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return launch_ranks(settings)
    rank = int(os.environ.get("RANK", "0"))
    # Probes answer while the model loads: /healthz at once, /readyz 503 until the batches topic is assigned.
    health = TrainerHealth(settings.train_stall_s)
    if rank == 0:  # rank 0 alone reads the topics, publishes and answers the probes
        serve_health(health.verdict, settings.train_metrics_host, settings.train_metrics_port,
                     explicit="train_metrics_port" in settings.model_fields_set, registry=health.registry,
                     flag="--metrics-port", env="ROLLOUTBUS_TRAIN_METRICS_PORT")
    trainer = Trainer(settings, device=device, health=health)
    if trainer.ranks is not None and not trainer.ranks.main:
        import signal

        from trainer import distributed

        # Rank 0 decides when the run ends (a SIGTERM to the whole group stops it after its step, and it then tells
        # the others); a rank 0 that dies ends the others' waits with a connection error.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        steps = distributed.follow(trainer.backend)
        log.info("rank %d: followed %d steps", trainer.ranks.rank, steps)
        return 0
    log.info("training %s from %s on %s (groups/step %d, checkpoints %s)", settings.resource_name, settings.bootstrap,
             trainer.topics.batches, settings.groups_per_step, trainer.store.root)
    try:
        steps = trainer.run()
    finally:
        trainer.stop_ranks()
    print(f"trained {steps} steps; {settings.resource_name} is at version {trainer.state.version} (step {trainer.state.step})")
    if trainer.validator is not None:
        print(trainer.validator.summary())
    return 0


@TRAIN_ALGORITHMS.register("sft")
def train_sft(settings: Any) -> int:
    """supervised fine-tuning on the transitions that pass the --sft-* filter, read from ClickHouse"""
    from trainer.sft_cli import train_sft as run

    return run(settings)


def launch_ranks(settings: Any) -> int:
    """``--nproc-per-node N``: this command again under ``torchrun`` (N processes here, ``--nnodes`` machines meeting
    at ``--rdzv-endpoint``), each one rank of an FSDP2 trainer; returns torchrun's exit status."""
    import subprocess

    argv = list(sys.argv[1:])
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(settings.nproc_per_node)]
    if settings.nnodes > 1:
        launcher += ["--nnodes", str(settings.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", str(settings.rdzv_endpoint)]
    else:
        launcher += ["--standalone"]
    own = sys.argv and Path(sys.argv[0]).parts[-2:] == ("trainer", "cli.py")  # python -m trainer.cli, else rolloutbus train
    target = ["-m", "trainer.cli" if own else "rolloutbus.cli", *argv]
    log.info("launching %d ranks: %s", settings.nproc_per_node * settings.nnodes, " ".join(launcher + target))
    return subprocess.call([*launcher, *target], env=dict(os.environ, ROLLOUTBUS_NPROC_PER_NODE=str(settings.nproc_per_node)))
