"""The trainer's settings: ``ROLLOUTBUS_*`` environment variables, read once at the entry point."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from foundation.config import PORT, CommonSettings, check_http_url
from foundation.health import health_settings
from foundation.registry import registered_in
from foundation.trackers import check_names  # light: the registry, not the trackers' libraries

METRICS_PORT = 9100  # the stream worker's is 9101: both run on one host in the local stack
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _resource_name() -> Any:
    """The policy's resource key, one declaration for the trainer's and the server's settings."""
    return Field(default="policy", description="Key of the published versions on rb.resources.")


def _model_ref(v: str | None) -> str | None:
    if v is not None and v != "tiny" and not Path(v).is_dir():
        raise ValueError("must be 'tiny' or an existing model directory")
    return v


class TrainerSettings(health_settings("train", METRICS_PORT, 600.0,  # type: ignore[misc]
                                      "batches wait, none was read and no step finished (longer than a step takes)")):
    """Everything ``rolloutbus train`` reads. Flags override these; these override the defaults."""

    train_model: str = Field(default="tiny", description="Local HF causal-LM path, or 'tiny' for the project's tiny model.")
    train_seed: int = Field(default=0, ge=0, description="Seed of the tiny model and of torch.")
    checkpoint_dir: Path | None = Field(default=None, description="Checkpoints; default <data_dir>/checkpoints/<resource_name>.")
    resource_name: str = _resource_name()
    train_llm_endpoint: str | None = Field(default=None, description="Base URL of the LLM proxy serving the versions, "
                                           "published as each version's config.endpoint (Agent Lightning's LLM endpoint).")
    train_group: str | None = Field(default=None, description="Consumer group on rb.batches; default <topic prefix>trainer.<resource name>.")
    groups_per_step: int = Field(default=8, ge=1, description="GRPO groups per optimiser step.")
    max_staleness: int = Field(default=4, ge=0, description="Drop batches sampled more than this many versions ago.")
    min_version: int = Field(default=0, ge=0, description="Drop batches served by a version below this one.")
    stale_weight: float = Field(default=0.5, ge=0.0, le=1.0, description="Loss weight of batches exactly max_staleness old.")
    backlog: Literal["oldest", "newest", "sample"] = Field(
        default="oldest", description="Which groups a step takes when more are waiting than it trains on (a trainer slower "
        "than generation): oldest (in order, as they came), newest (the most recent versions' groups; the older ones are "
        "skipped), sample (a uniform sample of what waits; the rest skipped).")
    backlog_window: int = Field(default=64, ge=1, description="With backlog newest or sample: groups read ahead of a step, "
                                "at most, to choose from (what is read and not chosen is skipped, counted).")
    lr: float = Field(default=5e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    clip_eps: float = Field(default=0.2, gt=0.0)
    clip_eps_high: float | None = Field(default=None, gt=0.0)
    loss_agg: Literal["grpo", "dapo", "dr_grpo"] = Field(default="grpo", description="grpo | dapo | dr_grpo")
    policy_loss: str = Field(default="ppo-clip", description="The per-token policy term: a registered policy loss "
                             "(trainer.grpo.POLICY_LOSSES: ppo-clip, decoupled, or one a plugin registers).")
    is_cap: float = Field(default=2.0, gt=0.0, description="decoupled: the cap of each token's proximal/behaviour weight.")
    updates_per_batch: int = Field(default=1, ge=1, le=16, description="Optimiser updates on each batch (GRPO's mu, verl's "
                                   "ppo_epochs, TRL's num_iterations), each clipped against the log-probs it was sampled with; "
                                   "one version is published per batch. Above 1 needs the ppo-clip policy loss.")
    mini_batches: int = Field(default=1, ge=1, le=1024, description="Optimiser steps on each pass over a batch, each on its "
                              "own run of whole groups (verl's train_batch_size / ppo_mini_batch_size); a sample recorded "
                              "without sampling log-probs is clipped against the policy before the batch's first step.")
    lora_rank: int = Field(default=0, ge=0, le=1024, description="LoRA adapters of this rank on lora_targets, the base frozen "
                           "(0: full fine-tuning); versions are published with the adapters merged.")
    lora_alpha: float = Field(default=16.0, gt=0, description="LoRA's alpha (the adapters scaled by alpha / rank).")
    lora_targets: str = Field(default="q_proj,k_proj,v_proj,o_proj", pattern=r"^(all-linear|[A-Za-z0-9_.]+(,[A-Za-z0-9_.]+)*)$",
                              description="Comma-separated module names that get adapters, or all-linear (every linear "
                                          "layer but the output head).")
    activation_checkpointing: bool = Field(default=False, description="Recompute each decoder layer's activations in the "
                                           "backward pass instead of keeping them: less memory, about a third more compute.")
    nproc_per_node: int = Field(default=1, ge=1, le=64, description="Training processes on this machine (FSDP2 ranks, torchrun).")
    nnodes: int = Field(default=1, ge=1, le=1024, description="Machines taking part, each with nproc_per_node ranks.")
    rdzv_endpoint: str | None = Field(default=None, description="HOST:PORT of the ranks' rendezvous when nnodes > 1.")
    kl_beta: float = Field(default=0.0, ge=0.0, description="KL-to-reference weight (k3); > 0 keeps a frozen reference model.")
    max_response_len: int | None = Field(default=None, ge=1, description="dr_grpo's constant normaliser.")
    micro_batch_tokens: int = Field(default=0, ge=0, description="Padded tokens per forward/backward (bounds memory); "
                                    "0: 4096 on the CPU, 16384 on a GPU (where smaller ones leave it waiting on the host).")
    train_temperature: float = Field(default=1.0, gt=0, description="Sampling temperature the behaviour log-probs used.")
    keep_checkpoints: int = Field(default=3, ge=1)
    report_to: str = Field(default="", description="Experiment trackers the run reports to, comma-separated: tensorboard, mlflow, wandb "
                           "(foundation.trackers.TRACKERS; empty: none).")
    tracker_dir: Path | None = Field(default=None, description="Where the trackers write; default <data_dir>/trackers.")
    max_steps: int = Field(default=0, ge=0, description="Stop after this many total steps (0: run forever).")
    idle_exit_s: float = Field(default=0.0, ge=0, description="Exit after this long without new batches (0: never).")
    torch_threads: int = Field(default=0, ge=0, description="torch intra-op threads (0: torch's default).")
    train_layers: int = Field(default=0, ge=0, description="Train only the top N decoder layers (0: every parameter).")
    share_prompts: bool = Field(default=True, description="Run a group's shared prompt (a multi-turn one's shared history) "
                                "through the policy and the reference once per micro-batch, its rows continuing from it, and "
                                "the reference's frozen lower layers (--train-layers) not at all, taking them from the "
                                "policy's forward: the same step, less computed (not with activation checkpointing).")
    skip_zero_variance: bool = Field(default=False, description="Drop groups whose rewards are all equal (their advantages are "
                                     "all 0: DAPO's dynamic sampling), so each step is made of groups that teach.")
    validation_tasks: Path | None = Field(default=None, description="A validation set (JSONL, one task input per line) "
                                          "published as mode-test tasks for each new version; the runners score it, "
                                          "the best version is reported (and early stopping reads it).")
    validate_every: int = Field(default=1, ge=1, description="Validate every Nth version (the initial weights always).")
    early_stop_patience: int = Field(default=0, ge=0, description="Stop once this many fully validated versions newer than "
                                     "the best have not beaten it (0: never; needs validation_tasks).")

    train_precision: Literal["auto", "fp32", "bf16-mixed"] = Field(
        default="auto", description="fp32 | bf16-mixed (forward passes in bfloat16 under autocast; weights, gradients and "
        "optimiser state stay float32) | auto: bf16-mixed on a GPU with bfloat16, fp32 on the CPU.")
    train_device: str = Field(default="auto", description="cpu | cuda | cuda:N | auto (a GPU when one is visible): "
                              "where the model, the reference model and the batches live.")

    check_model = field_validator("train_model")(_model_ref)

    @model_validator(mode="after")
    def _rendezvous(self) -> "TrainerSettings":
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("nnodes > 1 needs rdzv_endpoint (HOST:PORT where the machines' ranks meet)")
        return self

    check_report_to = field_validator("report_to")(check_names)
    check_policy_loss = field_validator("policy_loss")(registered_in("trainer.policy_losses:POLICY_LOSSES"))

    @field_validator("train_device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not _DEVICE.match(v):
            raise ValueError("must be cpu, cuda, cuda:N or auto")
        return v

    @model_validator(mode="after")
    def _updates_need_a_trust_region(self) -> TrainerSettings:
        from trainer.policy_losses import updates_refused

        if (why := updates_refused(self.policy_loss, self.updates_per_batch)) is not None:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _mini_batches_of_the_batch(self) -> TrainerSettings:
        if self.mini_batches > self.groups_per_step:
            raise ValueError(f"{self.mini_batches} mini-batches of a batch of {self.groups_per_step} groups: each mini-batch "
                             "takes whole groups, so there can be at most as many as the batch has")
        return self

    @model_validator(mode="after")
    def _early_stop_needs_validation(self) -> TrainerSettings:
        if self.early_stop_patience and self.validation_tasks is None:
            raise ValueError("early_stop_patience needs validation_tasks: early stopping reads the validation scores")
        return self

    def resolved_group(self) -> str:
        # Derived from the prefix so that two topic namespaces on one cluster never share a group.
        return self.train_group or f"{self.topic_prefix}trainer.{self.resource_name}"

    def resolved_checkpoint_dir(self) -> Path:
        return self.checkpoint_dir or self.data_dir / "checkpoints" / self.resource_name

    def resolved_tracker_dir(self) -> Path:
        return self.tracker_dir or self.data_dir / "trackers"


class ServeSettings(CommonSettings):
    """What ``rolloutbus serve`` reads (``ROLLOUTBUS_SERVE_*``)."""

    serve_model: str | None = Field(default=None, description="Model dir or 'tiny'; unset: wait for the first version on rb.resources.")
    serve_host: str = "127.0.0.1"
    serve_port: int = Field(default=8000, **PORT)
    serve_token: SecretStr | None = Field(default=None, description="Bearer token every route but /healthz needs; unset: no auth "
                                          "(refused on a non-loopback address unless --insecure).")
    insecure: bool = Field(default=False, description="Listen on a non-loopback address without a token (logged loudly).")
    resource_name: str = _resource_name()
    serve_follow: bool = Field(default=True, description="Hot-reload new versions from rb.resources.")
    serve_follow_lag: int = Field(default=0, ge=0, le=64, description="Follow the version this many behind the newest "
                                  "(the staleness bench: every batch at least this many versions old; 0: the newest).")
    serve_max_batch: int = Field(default=16, ge=1)
    serve_max_tokens: int = Field(default=64, ge=1, description="Default max_tokens of a request.")
    torch_threads: int = Field(default=0, ge=0)
    serve_engine: Literal["torch", "vllm"] = Field(default="torch", description="torch (the project's server) | vllm (vLLM's "
                                                   "OpenAI server, in the virtualenv `make vllm` makes).")
    serve_vllm_args: str = Field(default="", description="More vLLM server arguments (shell words), e.g. '--max-num-seqs 32'.")
    serve_lora_rank: int = Field(default=0, ge=0, le=512, description="Serve the versions of a LoRA trainer (train "
                                 "--lora-rank) by loading their adapters alone, up to this rank, the base weights kept "
                                 "(vLLM's runtime LoRA; the torch server adds them to the base weights it holds); 0: every "
                                 "version's merged weights reloaded.")

    check_model = field_validator("serve_model")(_model_ref)


class SFTSettings(TrainerSettings):
    """``rolloutbus train --algorithm sft`` (trainer/sft_cli.py): the trainer's settings and SFT's filter (``ROLLOUTBUS_SFT_*``)."""

    sft_top_k: int | None = Field(default=None, ge=1, description="Keep the k best rollouts by final reward per key; unset: all.")
    sft_min_reward: float | None = Field(default=None, ge=-1e9, le=1e9, description="Keep rollouts whose final reward is at least this.")
    sft_where: str | None = Field(default=None, description="An SQL condition over the rollouts columns (alias r).")
    sft_key: Literal["task", "prompt"] = Field(default="task", description="What top-k ranks within: the task, or the first prompt.")
    sft_epochs: int = Field(default=1, ge=1, description="Epochs over the pairs; one version is published after each.")
    sft_batch_size: int = Field(default=16, ge=1, description="Pairs per optimiser step.")
    sft_lr: float = Field(default=3e-4, gt=0, description="AdamW learning rate of SFT.")


class ApoSettings(CommonSettings):
    """What ``rolloutbus optimize-prompt`` reads (``ROLLOUTBUS_APO_*``)."""

    apo_resource: str = Field(default="prompt", min_length=1, description="The prompt_template resource optimized.")
    apo_llm_url: str | None = Field(default=None, description="The optimizer LLM: any OpenAI-compatible base URL (…/v1).")
    apo_llm_model: str = Field(default="policy", description="Model name sent to the optimizer LLM.")
    apo_llm_key: SecretStr | None = Field(default=None, description="API key of the optimizer LLM.")
    apo_llm_temperature: float = Field(default=0.8, ge=0.0, le=2.0, description="Sampling temperature of critiques and rewrites.")
    apo_llm_max_tokens: int = Field(default=200, ge=16, le=4096, description="Tokens per critique or rewrite.")
    apo_beam_width: int = Field(default=2, ge=1, description="Candidates kept after each round.")
    apo_branch: int = Field(default=2, ge=1, description="New candidates per beam member per round.")
    apo_rounds: int = Field(default=2, ge=0, description="Rounds of critique, rewrite and scoring.")
    apo_failures: int = Field(default=3, ge=1, le=20, description="Low-reward trajectories shown per critique.")
    apo_successes: int = Field(default=1, ge=0, le=20, description="High-reward trajectories shown per critique.")
    apo_score_timeout_s: float = Field(default=1800.0, gt=0, description="Longest wait for one round's validation rollouts.")
    apo_min_gain: float = Field(default=0.0, ge=0.0, description="Publish only a candidate scoring more than this above the incumbent.")

    @field_validator("apo_llm_url")
    @classmethod
    def _llm_url(cls, v: str | None) -> str | None:
        if v is not None:
            check_http_url(v)
        return v
