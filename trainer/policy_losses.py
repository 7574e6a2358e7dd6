"""The per-token policy term of the trainer's loss, by name: :data:`POLICY_LOSSES` (``@POLICY_LOSSES.register("name")``;
``rolloutbus train --policy-loss``). Light to import (torch is imported inside the losses), so the settings can
check a name before anything starts. See :mod:`trainer.grpo` for the objective around it. Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from foundation.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

    from trainer.grpo import GRPOConfig

# A policy loss: (logp, behaviour logp, advantages [B] or [B, T], config) -> (per-token loss, where it was
# clipped or truncated, the ratio reported in the metrics).
PolicyLoss = Callable[[Any, Any, Any, Any], tuple[Any, Any, Any]]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", providers={"verl:": "trainer.verl_losses"})


@POLICY_LOSSES.register("ppo-clip")
def ppo_clip(logp: Tensor, old_logp: Tensor, advantages: Tensor,
             config: GRPOConfig) -> tuple[Tensor, Tensor, Tensor]:
    """PPO-clip against the behaviour log-probs (GRPO's, DAPO's with clip-higher)"""
    from trainer.grpo import clipped_surrogate, importance_ratio

    ratio = importance_ratio(logp, old_logp)
    loss, was_clipped = clipped_surrogate(ratio, advantages, config.clip_eps, config.clip_eps_high)
    return loss, was_clipped, ratio


# The policy losses that clip against the log-probs they are given, so that a batch's later updates
# (``--updates-per-batch``, GRPO's μ) stay within a trust region of the policy that sampled it. The others take the ratio
# to the policy as it is at each update (``decoupled``'s proximal one) or none at all (verl's ``gpg``).
MULTI_UPDATE_LOSSES = ("ppo-clip", "verl:vanilla")


def updates_refused(policy_loss: str, updates_per_batch: int) -> str | None:
    """Why ``updates_per_batch`` updates on each batch cannot go with ``policy_loss`` (None: they can). Pure."""
    if updates_per_batch > 1 and policy_loss not in MULTI_UPDATE_LOSSES:
        return (f"{updates_per_batch} updates a batch need a policy loss that clips against the batch's sampling log-probs "
                f"({', '.join(MULTI_UPDATE_LOSSES)}), not {policy_loss}: its later updates would have no trust region")
    return None


def truncated_importance_weights(prox_logp: Tensor, behaviour_logp: Tensor, cap: float) -> Tensor:
    """Per token ``min(exp(prox − behaviour), cap)``, no gradient: the weight of a token sampled by an older policy."""
    import torch

    return torch.exp((prox_logp - behaviour_logp).detach()).clamp(max=cap)


@POLICY_LOSSES.register("decoupled")
def decoupled(logp: Tensor, old_logp: Tensor, advantages: Tensor,
              config: GRPOConfig) -> tuple[Tensor, Tensor, Tensor]:
    """AReaL's decoupled PPO: clip against the proximal policy, truncated importance weight to the behaviour one"""
    import torch

    from trainer.grpo import clipped_surrogate, importance_ratio

    prox = logp.detach()
    weight = truncated_importance_weights(prox, old_logp, config.is_cap)
    loss, was_clipped = clipped_surrogate(importance_ratio(logp, prox), advantages, config.clip_eps, config.clip_eps_high)
    truncated = (torch.exp(prox - old_logp) > config.is_cap).to(logp.dtype)
    return loss * weight, torch.maximum(was_clipped, truncated), torch.exp(prox - old_logp)



__all__ = ["MULTI_UPDATE_LOSSES", "POLICY_LOSSES", "PolicyLoss", "decoupled", "ppo_clip", "truncated_importance_weights",
           "updates_refused"]
