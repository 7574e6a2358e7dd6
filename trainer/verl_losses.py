"""verl's token-level policy losses (``verl.trainer.ppo.core_algos``) as this trainer's, under ``verl:<name>``
(``rolloutbus train --policy-loss verl:cispo``; ``GRPO(policy_loss="verl:vanilla")``). Imported by
:data:`trainer.policy_losses.POLICY_LOSSES` the first time such a name is asked for; verl is installed by
``make setup`` (``deploy/python/verl-core.txt``, without its dependency pins).

A verl loss returns the batch's aggregate; the trainer needs each token's term (it aggregates itself, over
micro-batches and ranks, with ``--loss-agg``). Each token's term is the aggregate's derivative with respect to that
token's mask entry under verl's ``token-sum`` (the loss is ``Σ mask · term``), kept differentiable: the same
values and the same gradients as verl's own loss under ``token-mean`` (``tests/unit/trainer/test_verl_losses.py``).
That holds for the losses whose term of a token does not depend on the other tokens' masks, the ones registered
here: vanilla (PPO-clip with verl's dual clip at ``clip_ratio_c`` = 3 on negative advantages; the built-in
``ppo-clip`` has no dual clip and is otherwise equal), dppo_tv, dppo_kl, gpg, cispo. Not: gspo, geo_mean, sapo,
clip_cov, kl_cov, dro, bypass_mode (sequence-level ratios, batch statistics, or their own aggregation).

verl's config keys come from :class:`trainer.grpo.GRPOConfig`: ``clip_ratio_low`` = ``clip_eps``,
``clip_ratio_high`` = ``clip_eps_high`` (or ``clip_eps``: :attr:`GRPOConfig.eps_high`). What verl reports is only the clipped fraction, so the
clip mask given back is that fraction on every token.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

from trainer.policy_losses import POLICY_LOSSES, PolicyLoss

if TYPE_CHECKING:
    from trainer.grpo import GRPOConfig

NAMES = ("vanilla", "dppo_tv", "dppo_kl", "gpg", "cispo")


def verl_config(config: GRPOConfig) -> ActorConfig:
    """The actor config verl's losses read, from this trainer's objective settings."""
    return _actor_config(config.clip_eps, config.eps_high)


@functools.lru_cache(maxsize=8)
def _actor_config(clip_eps: float, eps_high: float) -> ActorConfig:
    """Built once per clip setting, not at every micro-batch (``rollout_n`` and the micro-batch size are required by
    its checks and read by no loss)."""
    return ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=1, clip_ratio=clip_eps,
                       clip_ratio_low=clip_eps, clip_ratio_high=eps_high)


def _loss(name: str) -> PolicyLoss:
    fn = core_algos.get_policy_loss_fn(name)

    def loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             config: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        adv = advantages.unsqueeze(-1).expand_as(logp) if advantages.dim() == 1 else advantages
        mask = torch.ones_like(logp, requires_grad=True)
        with torch.enable_grad():
            total, metrics = fn(old_log_prob=old_logp, log_prob=logp, advantages=adv, response_mask=mask,
                                loss_agg_mode="token-sum", config=verl_config(config))
            (per_token,) = torch.autograd.grad(total, mask, create_graph=logp.requires_grad)
        clipped = torch.full_like(logp, float(metrics.get("actor/pg_clipfrac", 0.0))).detach()
        return per_token, clipped, torch.exp(logp - old_logp).detach()

    loss.__doc__ = f"verl's {name} policy loss (core_algos), each token's term"
    return loss


for _name in NAMES:
    POLICY_LOSSES.register(f"verl:{_name}")(_loss(_name))

__all__ = ["NAMES", "verl_config"]
