"""``rolloutbus train --algorithm sft``: supervised fine-tuning on the transitions that pass a filter
(:mod:`trainer.sft_data`, read from ClickHouse), published as versions on rb.resources like GRPO's.

The policy, its checkpoints and its versions are the GRPO trainer's (:class:`trainer.loop.Trainer`: the same
``--model``, ``--checkpoint-dir`` and ``--resource-name``): it starts from the newest checkpoint (or the
base model, published first as a version), trains ``--sft-epochs`` epochs over the pairs, and saves and
publishes one version after each. The checkpoint keeps the GRPO trainer's rb.batches offsets, so
``rolloutbus train`` run afterwards on the same checkpoint directory goes on from the SFT weights:
rejection-sampling fine-tuning, then GRPO.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

# argparse destination → settings field (the GRPO trainer's flags apply too)
SFT_FLAGS: dict[str, str] = {
    "sft_top_k": "sft_top_k",
    "sft_min_reward": "sft_min_reward",
    "sft_where": "sft_where",
    "sft_key": "sft_key",
    "sft_epochs": "sft_epochs",
    "sft_batch_size": "sft_batch_size",
    "sft_lr": "sft_lr",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sft-top-k", type=int, help="SFT: the k best rollouts by final reward per --sft-key (env ROLLOUTBUS_SFT_TOP_K; unset: all)")
    p.add_argument("--sft-min-reward", type=float, help="SFT: rollouts with final reward >= this (env ROLLOUTBUS_SFT_MIN_REWARD)")
    p.add_argument("--sft-where", help="SFT: an SQL condition over the rollouts columns, alias r, e.g. \"r.task_id LIKE 'calc%%'\" "
                   "(env ROLLOUTBUS_SFT_WHERE)")
    p.add_argument("--sft-key", choices=["task", "prompt"], help="SFT: top-k within each task or each first prompt")
    p.add_argument("--sft-epochs", type=int, help="SFT: epochs, one version published after each")
    p.add_argument("--sft-batch-size", type=int, help="SFT: pairs per optimiser step")
    p.add_argument("--sft-lr", type=float, help="SFT: learning rate")


def train_sft(s: Any) -> int:
    """The SFT run: ``s`` is :class:`trainer.settings.SFTSettings`, read by ``rolloutbus train``."""
    from foundation.clickhouse import connect
    from foundation.errors import ConfigError
    from trainer.checkpoint import Manifest
    from trainer.device import resolve_device
    from trainer.loop import Trainer
    from trainer.sft import SFTConfig, sft_ids
    from trainer.sft_data import SFTFilter, read_pairs

    try:
        filt = SFTFilter(top_k=s.sft_top_k, min_reward=s.sft_min_reward, where=s.sft_where, key=s.sft_key)
    except ValueError as exc:
        raise ConfigError(f"SFT filter: {exc}") from exc
    client = connect(s.dsn, database=s.clickhouse_database, password=s.clickhouse_password, readonly=True, create_database=False)
    pairs = read_pairs(client, filt)
    close = getattr(client, "close", None)
    if close is not None:
        close()  # an embedded store is one process's: let go of it before training
    print(f"SFT: {len(pairs)} transitions pass the filter {filt}", flush=True)
    if not pairs:
        print("SFT: nothing to train on; no version published")
        return 1
    device = resolve_device(s.train_device)
    trainer = Trainer(s, device=device)
    try:
        trainer.reconcile()
        cfg = SFTConfig(epochs=1, lr=s.sft_lr, batch_size=s.sft_batch_size, seed=s.train_seed)
        for epoch in range(s.sft_epochs):
            t0 = time.perf_counter()
            losses = sft_ids(trainer.model, pairs, SFTConfig(**{**cfg.__dict__, "seed": s.train_seed + epoch}),
                             trainer.tok.pad_id)
            step, version = trainer.state.step + 1, trainer.current_version + 1
            metrics = {"loss": losses[-1], "sft_loss_first": losses[0], "sft_pairs": float(len(pairs)),
                       "sft_epoch": float(epoch + 1), "step_time_s": time.perf_counter() - t0, "resource_version": float(version)}
            manifest = Manifest(step=step, version=version, resource_name=s.resource_name, base_model=trainer.base_model,
                                run_id=trainer.state.run_id, offsets={t: dict(p) for t, p in trainer.state.offsets.items()},
                                seen_group_ids=list(trainer.state.seen), metrics=metrics,
                                config={**trainer._config(), "algorithm": "sft"}, created_ns=time.time_ns())
            path = trainer._save(manifest)  # as a GRPO step saves: with --lora-rank, the adapters merged (and beside)
            trainer.state.step, trainer.state.version = step, version
            trainer._publish_checkpoint(path, manifest)
            trainer.store.prune(s.keep_checkpoints, trainer._protected_steps())
            print(f"SFT epoch {epoch + 1}: loss {losses[0]:.4f} → {losses[-1]:.4f} over {len(losses)} steps; "
                  f"{s.resource_name} version {version}", flush=True)
    finally:
        trainer.close()
    return 0


__all__ = ["SFT_FLAGS", "add_arguments", "train_sft"]
