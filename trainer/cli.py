"""``rolloutbus train``: the algorithm ``--algorithm`` names (:data:`trainer.algorithms.TRAIN_ALGORITHMS`: GRPO on
``rb.batches`` by default, ``sft``: :mod:`trainer.sft_cli`). Flags override ``ROLLOUTBUS_*`` variables.

Top-level imports stay light (the ``rolloutbus`` command imports this module to build its parser);
torch and Kafka are imported inside :func:`run`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

log = logging.getLogger(__name__)

# flag → settings field (None-valued flags fall back to the environment / default)
_FLAGS: dict[str, str] = {
    "model": "train_model",
    "checkpoint_dir": "checkpoint_dir",
    "resource_name": "resource_name",
    "llm_endpoint": "train_llm_endpoint",
    "group": "train_group",
    "groups_per_step": "groups_per_step",
    "max_staleness": "max_staleness",
    "min_version": "min_version",
    "stale_weight": "stale_weight",
    "backlog": "backlog",
    "backlog_window": "backlog_window",
    "lr": "lr",
    "loss_agg": "loss_agg",
    "policy_loss": "policy_loss",
    "is_cap": "is_cap",
    "updates_per_batch": "updates_per_batch",
    "mini_batches": "mini_batches",
    "clip_eps": "clip_eps",
    "clip_eps_high": "clip_eps_high",
    "kl_beta": "kl_beta",
    "micro_batch_tokens": "micro_batch_tokens",
    "max_steps": "max_steps",
    "idle_exit": "idle_exit_s",
    "seed": "train_seed",
    "threads": "torch_threads",
    "keep_checkpoints": "keep_checkpoints",
    "report_to": "report_to",
    "tracker_dir": "tracker_dir",
    "train_layers": "train_layers",
    "share_prompts": "share_prompts",
    "skip_zero_variance": "skip_zero_variance",
    "validation_tasks": "validation_tasks",
    "validate_every": "validate_every",
    "early_stop_patience": "early_stop_patience",
    "nproc_per_node": "nproc_per_node",
    "lora_rank": "lora_rank",
    "lora_alpha": "lora_alpha",
    "lora_targets": "lora_targets",
    "activation_checkpointing": "activation_checkpointing",
    "nnodes": "nnodes",
    "rdzv_endpoint": "rdzv_endpoint",
    "device": "train_device",
    "precision": "train_precision",
    "metrics_port": "train_metrics_port",
    "metrics_host": "train_metrics_host",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from trainer.algorithms import DEFAULT_ALGORITHM, TRAIN_ALGORITHMS

    # no choices=: a plugin's algorithm (ROLLOUTBUS_PLUGINS) registers once run() loads it; an unknown name is one line
    p.add_argument("--algorithm", metavar="NAME",
                   help="; ".join(f"{n}: {TRAIN_ALGORITHMS.help(n)}" for n in TRAIN_ALGORITHMS) +
                   f" (trainer/algorithms.py: one decorator adds one; env ROLLOUTBUS_TRAIN_ALGORITHM, default {DEFAULT_ALGORITHM})")
    p.add_argument("--model", help="local HF causal-LM dir, or 'tiny' to build the project's tiny model")
    p.add_argument("--checkpoint-dir", help="checkpoints (env ROLLOUTBUS_CHECKPOINT_DIR, default <data dir>/checkpoints/<name>)")
    p.add_argument("--resource-name", help="name of the published resource on rb.resources")
    p.add_argument("--llm-endpoint", help="base URL of `rolloutbus proxy` in front of the served versions, published as each "
                   "version's config.endpoint: the LLM endpoint Agent Lightning runners get from the gateway")
    p.add_argument("--group", help="consumer group on rb.batches (env ROLLOUTBUS_TRAIN_GROUP, default <prefix>trainer.<name>)")
    p.add_argument("--groups-per-step", type=int, help="GRPO groups per optimiser step")
    p.add_argument("--max-staleness", type=int, help="max version lag trained on")
    p.add_argument("--min-version", type=int, help="drop batches served by a version below this one, whatever their lag: the "
                   "policy that served them was replaced")
    p.add_argument("--stale-weight", type=float, help="loss weight at exactly the max lag")
    p.add_argument("--backlog", help="which groups a step takes when more wait than "
                   "it trains on: oldest (in order), newest (the newest versions' groups, older ones skipped), sample (uniform)")
    p.add_argument("--backlog-window", type=int, help="with --backlog newest or sample: groups read ahead of a step to choose from")
    p.add_argument("--lr", type=float, help="AdamW learning rate")
    p.add_argument("--loss-agg", help="loss aggregation")
    p.add_argument("--policy-loss", metavar="NAME", help="the per-token policy term: ppo-clip, decoupled (AReaL's, for stale batches), verl:<name> (verl's), or a registered one (ROLLOUTBUS_PLUGINS imports modules that register more)")
    p.add_argument("--is-cap", type=float, help="decoupled: cap of each token's proximal/behaviour importance weight")
    p.add_argument("--updates-per-batch", type=int, metavar="N", help="optimiser updates on each batch (GRPO's mu, verl's "
                   "ppo_epochs), each clipped against the batch's sampling log-probs; one version per batch")
    p.add_argument("--mini-batches", type=int, metavar="K", help="optimiser steps on each pass over a batch, each on its own "
                   "groups (verl's train_batch_size / ppo_mini_batch_size); one version per batch")
    p.add_argument("--lora-rank", type=int, help="train LoRA adapters of this rank, the base frozen; versions publish the adapters merged (0: full fine-tuning)")
    p.add_argument("--lora-alpha", type=float, help="LoRA alpha")
    p.add_argument("--lora-targets", help="modules that get adapters")
    p.add_argument("--activation-checkpointing", action="store_true", default=None,
                   help="recompute activations in backward: less memory")
    p.add_argument("--nproc-per-node", type=int, help="training processes on this machine, each a rank of an FSDP2 trainer "
                   "(torchrun; gloo on the CPU, NCCL on GPUs)")
    p.add_argument("--nnodes", type=int, help="machines taking part, each with --nproc-per-node ranks")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT where the machines' ranks meet (torchrun's c10d rendezvous; env ROLLOUTBUS_RDZV_ENDPOINT)")
    p.add_argument("--clip-eps", type=float, help="PPO clip epsilon")
    p.add_argument("--clip-eps-high", type=float, help="upper clip epsilon, DAPO clip-higher")
    p.add_argument("--kl-beta", type=float, help="KL-to-reference weight, k3 estimator")
    p.add_argument("--micro-batch-tokens", type=int, help="padded tokens per forward/backward (0: 4096 on the CPU, 16384 on a GPU)")
    p.add_argument("--max-steps", type=int, help="stop after this many total steps (0: forever)")
    p.add_argument("--idle-exit", type=float, help="exit after N seconds without batches (0: never)")
    p.add_argument("--seed", type=int, help="seed of the tiny model and torch")
    p.add_argument("--threads", type=int, help="torch threads (0: torch's default)")
    p.add_argument("--train-layers", type=int, help="train only the top N decoder layers, 0 = all")
    p.add_argument("--share-prompts", action=argparse.BooleanOptionalAction, default=None,
                   help="compute a group's shared prompt once per micro-batch, and the KL reference's frozen lower layers "
                   "(--train-layers) from the policy's forward: the same step (on unless --no-share-prompts)")
    p.add_argument("--skip-zero-variance", action="store_true", default=None,
                   help="drop groups whose rewards are all equal, so a step waits for groups that teach")
    p.add_argument("--validation-tasks", help="validation set, JSONL of task inputs: published as mode-test tasks for each new "
                   "version, scored by the runners, best version reported")
    p.add_argument("--validate-every", type=int, help="validate every Nth version")
    p.add_argument("--early-stop-patience", type=int, help="stop after N fully validated versions without beating the best (0: never)")
    p.add_argument("--keep-checkpoints", type=int, help="checkpoints kept on disk")
    p.add_argument("--report-to", metavar="TRACKERS", help="experiment trackers, comma-separated: tensorboard, mlflow, wandb (each step's "
                   "metrics, the configuration, each version's validation score; ClickHouse keeps them all regardless)")
    p.add_argument("--tracker-dir", help="where the trackers write (default <data dir>/trackers)")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto: where the model, the reference model and the batches live (auto: a GPU when one is visible)")
    p.add_argument("--precision",
                   help="bf16-mixed: forward passes in bfloat16 under autocast, weights and optimiser state float32 (auto: bf16-mixed on a GPU, fp32 on the CPU)")
    p.add_argument("--metrics-port", type=int,
                   help="port of /metrics, /healthz and /readyz (0: off)")
    p.add_argument("--metrics-host", help="address they bind (0.0.0.0 for probes from outside)")
    from foundation.flags import describe_flags
    from trainer.sft_cli import SFT_FLAGS
    from trainer.sft_cli import add_arguments as add_sft_arguments

    add_sft_arguments(p)
    describe_flags(p, "trainer.settings:SFTSettings", {**_FLAGS, **SFT_FLAGS})  # each flag's variable and default, from the settings


def settings_from_args(args: argparse.Namespace) -> Any:
    """Explicit flag beats environment variable beats default."""
    from foundation.entry import settings_from_args
    from trainer.settings import SFTSettings
    from trainer.sft_cli import SFT_FLAGS

    # SFT's settings are the trainer's and its own: a bad --sft-* value is refused whichever algorithm runs.
    return settings_from_args(SFTSettings, args, {**_FLAGS, **SFT_FLAGS})


def run(args: argparse.Namespace) -> int:
    from foundation.registry import load_plugins
    from trainer.algorithms import TRAIN_ALGORITHMS, chosen_algorithm

    load_plugins()  # the user's registered algorithms and policy losses, before the settings name one
    train = TRAIN_ALGORITHMS.get(chosen_algorithm(getattr(args, "algorithm", None)))
    return train(settings_from_args(args))


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.cli`` — the same as ``rolloutbus train`` without the other components."""
    from foundation.entry import run_command

    return run_command("rolloutbus train", add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
