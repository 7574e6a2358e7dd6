"""The algorithms ``Trainer`` takes: ``GRPO(...)``, the settings of ``rolloutbus train`` and the stream worker's groups;
``SFT(...)``, rejection-sampling fine-tuning by ``rolloutbus train --algorithm sft``; ``APO(...)``, automatic prompt
optimization of a ``prompt_template`` resource by ``rolloutbus optimize-prompt``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from foundation.errors import ConfigError


@dataclass
class GRPO:
    """GRPO on the policy the ``main_llm`` resource names (``model``: a local HF directory, a packaged model's
    name for ``rolloutbus model import``, or ``tiny``). Training stops after ``minutes`` or ``max_steps``.
    Validation rollouts call the LLMs at ``val_temperature`` (0: greedy, as verl's ``val_kwargs`` and the demo;
    None: the LLM's own sampling parameters), so a version's score does not vary with sampling.

    ``credit`` (with ``gamma``), ``advantage_estimator`` and ``policy_loss`` are names in the registries
    (``streams.credit.CREDIT``, ``streams.grouping.ESTIMATORS``, ``trainer.policy_losses.POLICY_LOSSES``): how a
    rollout's rewards become each step's advantage, and the loss's policy term (``decoupled`` for stale
    batches)."""

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
    credit: str = "identical"
    gamma: float = 1.0
    advantage_estimator: str = "grpo"
    policy_loss: str = "ppo-clip"
    train_args: list[str] = field(default_factory=list)  # more ``rolloutbus train`` flags, as given

    def __post_init__(self) -> None:
        from streams.credit import CREDIT
        from streams.grouping import ESTIMATORS
        from trainer.policy_losses import POLICY_LOSSES

        if self.group_size < 2:
            raise ConfigError("GRPO(group_size=...) must be at least 2: GRPO compares rollouts within a group")
        CREDIT.check(self.credit)
        ESTIMATORS.check(self.advantage_estimator)
        POLICY_LOSSES.check(self.policy_loss)
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"GRPO(gamma=...) must be in [0, 1], got {self.gamma}")

    def process_args(self) -> list[str]:
        """The stream worker's flags for this algorithm's advantages. Pure."""
        return ["--credit", self.credit, "--gamma", str(self.gamma), "--advantage-estimator", self.advantage_estimator]


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


@dataclass
class APO:
    """Automatic prompt optimization of the ``prompt_template`` resource (a :class:`~rolloutbus.trainer_api.resources.
    PromptTemplate`; ``resource`` names it when there are several) by ``rolloutbus optimize-prompt``, Agent
    Lightning's names: ``beam_rounds`` rounds of critique and rewrite, ``branch_factor`` rewrites per beam member,
    ``beam_width`` kept. The policy is served as given and does not change. Candidates are scored on the first
    ``val_batch_size`` validation rows (None: all) at ``val_temperature``; before the search the first
    ``gradient_batch_size`` training rows run once under the initial prompt (version 0), so the first critiques
    read training trajectories (later rounds critique the validation rollouts of the candidate they rewrite).
    The optimizer LLM is ``optimizer_url`` / ``optimizer_model`` (None: the policy server fit starts, by the name
    it serves), or, as Agent Lightning's first argument, ``client``: an ``OpenAI`` / ``AsyncOpenAI`` client, whose
    ``base_url`` and ``api_key`` are used (with ``optimizer_model``). ``candidates``: prompts of your own (templates) scored beside the initial one. A candidate is
    published as the next version only when it scores more than ``min_gain`` above the initial prompt."""

    client: Any = None
    beam_width: int = 2
    branch_factor: int = 2
    beam_rounds: int = 2
    val_batch_size: int | None = None
    gradient_batch_size: int = 8
    val_temperature: float | None = 0.0
    optimizer_url: str | None = None
    optimizer_model: str | None = None
    optimizer_temperature: float = 0.8
    candidates: list[str] = field(default_factory=list)
    min_gain: float = 0.0
    resource: str | None = None
    score_timeout_s: float = 1800.0
    rollout_timeout_s: float = 900.0
    apo_args: list[str] = field(default_factory=list)  # more ``rolloutbus optimize-prompt`` flags, as given

    def __post_init__(self) -> None:
        if self.beam_width < 1 or self.branch_factor < 1 or (self.val_batch_size is not None and self.val_batch_size < 1):
            raise ConfigError("APO(beam_width=, branch_factor=, val_batch_size=) must each be at least 1")
        if self.beam_rounds < 0 or self.gradient_batch_size < 0 or self.min_gain < 0:
            raise ConfigError("APO(beam_rounds=, gradient_batch_size=, min_gain=) must not be negative")
        if self.score_timeout_s <= 0 or self.rollout_timeout_s <= 0:
            raise ConfigError("APO(score_timeout_s=, rollout_timeout_s=) must be greater than 0")
        if self.client is not None:
            if getattr(self.client, "base_url", None) is None:
                raise ConfigError(f"APO's first argument is the optimizer LLM's OpenAI or AsyncOpenAI client, not a "
                                  f"{type(self.client).__name__}")
            if not self.optimizer_model:
                raise ConfigError("APO(client) calls that client's endpoint: name the model, APO(client, optimizer_model=...)")
            self.optimizer_url = self.optimizer_url or str(self.client.base_url).rstrip("/")

    def optimizer_key(self) -> str | None:
        """The ``client``'s API key (given to ``optimize-prompt`` as ``ROLLOUTBUS_APO_LLM_KEY``, not on its command line)."""
        return getattr(self.client, "api_key", None) or None

    def command(self, val_tasks: str, resource: str, llm_url: str, llm_model: str, run_id: str, out: str,
                candidates: str | None = None) -> list[str]:
        """The ``rolloutbus optimize-prompt`` command line: ``val_tasks`` a JSONL file, ``candidates`` the file
        holding :attr:`candidates` (JSON), ``out`` where its summary goes. Pure."""
        return ["optimize-prompt", val_tasks, "--resource", resource, "--llm-url", self.optimizer_url or llm_url,
                "--llm-model", self.optimizer_model or llm_model, "--llm-temperature", str(self.optimizer_temperature),
                "--beam-width", str(self.beam_width), "--branch", str(self.branch_factor), "--rounds", str(self.beam_rounds),
                "--score-timeout", str(self.score_timeout_s), "--min-gain", str(self.min_gain), "--run-id", run_id,
                "--out", out, *(["--max-val-tasks", str(self.val_batch_size)] if self.val_batch_size else []),
                *(["--candidates", candidates] if candidates else []), *self.apo_args]


__all__ = ["APO", "GRPO", "SFT"]
