"""The algorithms ``Trainer`` takes: ``GRPO(...)``, the settings of ``rolloutbus train`` and the stream worker's groups."""

from __future__ import annotations

from dataclasses import dataclass, field

from foundation.errors import ConfigError


@dataclass
class GRPO:
    """GRPO on the policy the ``main_llm`` resource names (``model``: a local HF directory, a packaged model's
    name for ``rolloutbus model import``, or ``tiny``). Training stops after ``minutes`` or ``max_steps``."""

    group_size: int = 4
    groups_per_step: int = 2
    lr: float = 1e-4
    kl_beta: float = 0.02
    minutes: float = 10.0
    max_steps: int | None = None
    temperature: float = 0.7
    train_layers: int | None = None
    skip_zero_variance: bool = True
    group_timeout_s: float = 300.0
    rollout_timeout_s: float = 900.0
    seed: int = 0
    train_args: list[str] = field(default_factory=list)  # more ``rolloutbus train`` flags, as given

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ConfigError("GRPO(group_size=...) must be at least 2: GRPO compares rollouts within a group")


__all__ = ["GRPO"]
