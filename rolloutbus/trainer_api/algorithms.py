"""The algorithms ``Trainer`` takes: ``GRPO(...)``, the settings of ``rolloutbus train`` and the stream worker's groups;
``SFT(...)``, rejection-sampling fine-tuning by ``rolloutbus train --algorithm sft``."""

from __future__ import annotations

from dataclasses import dataclass, field

from foundation.errors import ConfigError


@dataclass
class GRPO:
    """GRPO on the policy the ``main_llm`` resource names (``model``: a local HF directory, a packaged model's
    name for ``rolloutbus model import``, or ``tiny``). Training stops after ``minutes`` or ``max_steps``.
    Validation rollouts call the LLMs at ``val_temperature`` (0: greedy, as verl's ``val_kwargs`` and the demo;
    None: the LLM's own sampling parameters), so a version's score does not vary with sampling."""

    group_size: int = 4
    groups_per_step: int = 2
    lr: float = 1e-4
    kl_beta: float = 0.02
    minutes: float = 10.0
    max_steps: int | None = None
    temperature: float = 0.7
    val_temperature: float | None = 0.0
    train_layers: int | None = None
    skip_zero_variance: bool = True
    group_timeout_s: float = 300.0
    rollout_timeout_s: float = 900.0
    seed: int = 0
    train_args: list[str] = field(default_factory=list)  # more ``rolloutbus train`` flags, as given

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ConfigError("GRPO(group_size=...) must be at least 2: GRPO compares rollouts within a group")


@dataclass
class SFT:
    """Rejection-sampling fine-tuning: the agent runs each task ``samples_per_task`` times on the policy as it is
    for ``collect_minutes``; then ``rolloutbus train --algorithm sft`` fine-tunes on the rollouts that pass the
    filter (final reward >= ``min_reward``, the ``top_k`` best per ``key``, the SQL condition ``where`` over the
    ``rollouts`` columns, alias ``r``) for ``epochs``, publishing a version after each. ``min_reward=None``
    and ``top_k=None`` keep every rollout."""

    samples_per_task: int = 4
    collect_minutes: float = 5.0
    top_k: int | None = 1
    min_reward: float | None = 1.0
    where: str | None = None
    key: str = "task"
    epochs: int = 1
    lr: float = 3e-4
    batch_size: int = 16
    temperature: float = 0.7
    group_timeout_s: float = 300.0
    rollout_timeout_s: float = 900.0
    seed: int = 0
    train_args: list[str] = field(default_factory=list)  # more ``rolloutbus train`` flags, as given

    def __post_init__(self) -> None:
        if self.samples_per_task < 1 or self.epochs < 1 or self.batch_size < 1 or (self.top_k is not None and self.top_k < 1):
            raise ConfigError("SFT(samples_per_task=, epochs=, batch_size=, top_k=) must each be at least 1")
        if self.key not in ("task", "prompt"):
            raise ConfigError(f"SFT(key=...) must be 'task' or 'prompt', got {self.key!r}")
        if self.collect_minutes <= 0 or self.lr <= 0:
            raise ConfigError("SFT(collect_minutes=, lr=) must be greater than 0")

    def command(self, model: str) -> list[str]:
        """The ``rolloutbus train`` command line of the fine-tuning (after the collection)."""
        return ["train", "--algorithm", "sft", "--model", model, "--threads", "1", "--seed", str(self.seed),
                "--sft-epochs", str(self.epochs), "--sft-lr", str(self.lr), "--sft-batch-size", str(self.batch_size),
                "--sft-key", self.key,
                *(["--sft-top-k", str(self.top_k)] if self.top_k is not None else []),
                *(["--sft-min-reward", str(self.min_reward)] if self.min_reward is not None else []),
                *(["--sft-where", self.where] if self.where else []), *self.train_args]


__all__ = ["GRPO", "SFT"]
