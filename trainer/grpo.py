"""The GRPO objective as pure tensor functions (no Kafka, no model, no I/O).

Conventions: a batch row is ``prompt + response`` padded on the right to length ``T``. Per-token
tensors are ``[B, T]`` and aligned with the *input positions*: ``logp[b, t]`` is the log-probability
of ``input_ids[b, t]`` given ``input_ids[b, :t]`` (so position 0 is always 0). ``mask[b, t]`` is 1 on
response tokens the policy produced and 0 on the prompt, on padding and on tool/observation tokens
spliced into a multi-turn response — those are conditioned on but never trained on.

Objective per active token (Schulman et al. PPO-clip, as used by GRPO/DAPO):

    ratio = exp(logp - old_logp)
    L_tok = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A) + beta * k3(logp, ref_logp)
    k3    = exp(ref_logp - logp) - (ref_logp - logp) - 1           (unbiased, always >= 0; at most 10 per token)

Aggregation over tokens (``loss_agg``):

* ``grpo``    — mean over each sequence's active tokens, then mean over sequences.
* ``dapo``    — sum over all active tokens of the batch / number of active tokens.
* ``dr_grpo`` — sum over all active tokens / (number of sequences * a constant max length).

Every aggregation accepts *global* normalisers so that micro-batches whose losses are summed give
exactly the full-batch loss (gradient accumulation without bias).

The per-token policy term is a registered policy loss (:data:`POLICY_LOSSES`, ``@POLICY_LOSSES.register``;
the trainer's ``--policy-loss``). Built in:

* ``ppo-clip``  — the clipped ratio against the behaviour log-probs, as above.
* ``decoupled`` — AReaL's decoupled objective for stale batches (Fu et al. 2025, "AReaL", §5.2): the ratio is
  taken against a *proximal* policy (the current weights before this step, ``logp`` detached; so it takes
  one optimiser update per batch: ``--updates-per-batch`` above 1 is refused with it) and the clipped term is weighted by the truncated importance weight
  ``min(π_prox / π_behaviour, is_cap)`` of each token (:func:`truncated_importance_weights`). A batch
  sampled versions ago then moves the policy in proportion to how likely the current policy finds its tokens,
  rather than having most tokens' gradients cut by the clip against a distant behaviour policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from trainer.policy_losses import POLICY_LOSSES, decoupled, ppo_clip, truncated_importance_weights

LossAgg = Literal["grpo", "dapo", "dr_grpo"]
LOSS_AGGS: tuple[str, ...] = ("grpo", "dapo", "dr_grpo")


@dataclass(frozen=True)
class GRPOConfig:
    """Knobs of the objective. ``clip_eps_high`` None means symmetric clipping."""

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    loss_agg: LossAgg = "grpo"
    kl_beta: float = 0.0
    max_response_len: int | None = None  # the constant of dr_grpo; None → the batch's mask width
    policy_loss: str = "ppo-clip"  # a name in POLICY_LOSSES
    is_cap: float = 2.0  # decoupled: the truncation of the proximal / behaviour importance weight

    def __post_init__(self) -> None:
        POLICY_LOSSES.check(self.policy_loss)
        if self.is_cap <= 0:
            raise ValueError(f"is_cap must be > 0, got {self.is_cap}")
        if self.loss_agg not in LOSS_AGGS:
            raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {self.loss_agg!r}")
        if self.clip_eps < 0 or (self.clip_eps_high is not None and self.clip_eps_high < 0):
            raise ValueError("clip epsilons must be >= 0")
        if self.kl_beta < 0:
            raise ValueError("kl_beta must be >= 0")

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each input token under ``logits`` (``[B, T, V]``), aligned to input positions.

    Uses ``gather - logsumexp`` rather than a full ``log_softmax`` so memory stays ``O(B*T)`` beyond
    the logits themselves. ``temperature`` divides the logits, matching a sampler that did the same.
    """
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(f"logits {tuple(logits.shape)} and input_ids {tuple(input_ids.shape)} do not line up")
    shifted = logits[:, :-1, :].float() if logits.dtype in (torch.float16, torch.bfloat16) else logits[:, :-1, :]
    if temperature != 1.0:
        shifted = shifted / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = torch.gather(shifted, -1, targets).squeeze(-1) - torch.logsumexp(shifted, dim=-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """``exp(logp - old_logp)``: the current policy's probability over the behaviour policy's."""
    return torch.exp(logp - old_logp)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float, clip_eps_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss ``-min(r*A, clip(r, 1-eps, 1+eps_high)*A)`` and where clipping bit.

    ``advantages`` is ``[B]`` (one per sequence) or ``[B, T]``. The second tensor is 1 where the clipped
    term was chosen and differs from the unclipped one (the gradient is zero there).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped).to(ratio.dtype)
    return loss, was_clipped


KL_TOKEN_MAX = 10.0


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: ``exp(d) - d - 1`` with ``d = ref - logp``.

    Bounded as verl's ``low_var_kl`` bounds it (``d`` to [-20, 20], the result to at most
    :data:`KL_TOKEN_MAX`): one token the policy has pushed far below the reference (``d`` = 7 gives
    1,000) would otherwise outweigh the whole batch's policy gradient.
    """
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(max=KL_TOKEN_MAX)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_agg: LossAgg,
    *,
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
    seq_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with the chosen aggregation.

    ``num_seqs``/``num_tokens`` are the full batch's sequence and active-token counts when this is one
    micro-batch of several (defaults: this tensor's own). ``seq_weights`` ``[B]`` scales each sequence
    (used to down-weight stale samples).
    """
    mask = mask.to(per_token.dtype)
    weighted = per_token * mask
    if seq_weights is not None:
        weighted = weighted * seq_weights.to(per_token.dtype).unsqueeze(-1)
    if loss_agg == "grpo":
        n = float(per_token.shape[0]) if num_seqs is None else float(num_seqs)
        # A sequence with no active token contributes 0, not NaN.
        per_seq = weighted.sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / n
    if loss_agg == "dapo":
        n_tok = mask.sum().clamp(min=1.0) if num_tokens is None else max(float(num_tokens), 1.0)
        return weighted.sum() / n_tok
    if loss_agg == "dr_grpo":
        n = float(per_token.shape[0]) if num_seqs is None else float(num_seqs)
        length = float(per_token.shape[1] if max_len is None else max_len)
        return weighted.sum() / (n * length)
    raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    seq_weights: torch.Tensor | None = None,
    num_seqs: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss and its metrics for one (micro-)batch.

    Returns ``(loss, metrics)``; metrics are plain floats computed over active tokens: ``loss``,
    ``pg_loss``, ``kl`` (mean k3, 0 without a reference), ``clip_fraction``, ``ratio_mean``,
    ``ratio_max``, ``ratio_min``, ``active_tokens``.
    """
    if not (logp.shape == old_logp.shape == mask.shape):
        raise ValueError(f"shapes differ: logp {tuple(logp.shape)}, old {tuple(old_logp.shape)}, mask {tuple(mask.shape)}")
    pg_tok, was_clipped, ratio = POLICY_LOSSES.get(config.policy_loss)(logp, old_logp, advantages, config)
    max_len = config.max_response_len
    pg = aggregate(pg_tok, mask, config.loss_agg, num_seqs=num_seqs, num_tokens=num_tokens, max_len=max_len, seq_weights=seq_weights)
    loss = pg
    fmask = mask.to(logp.dtype)
    n_active = float(fmask.sum().item())
    denom = max(n_active, 1.0)
    kl_mean = 0.0
    if ref_logp is not None and config.kl_beta > 0:
        kl_tok = kl_k3(logp, ref_logp)
        kl = aggregate(kl_tok, mask, config.loss_agg, num_seqs=num_seqs, num_tokens=num_tokens, max_len=max_len, seq_weights=seq_weights)
        loss = pg + config.kl_beta * kl
        kl_mean = float((kl_tok.detach() * fmask).sum().item()) / denom
    elif ref_logp is not None:
        kl_mean = float((kl_k3(logp, ref_logp).detach() * fmask).sum().item()) / denom
    with torch.no_grad():
        r = ratio.detach()
        active = fmask > 0
        metrics = {
            "loss": float(loss.detach().item()),
            "pg_loss": float(pg.detach().item()),
            "kl": kl_mean,
            "clip_fraction": float((was_clipped * fmask).sum().item()) / denom,
            "ratio_mean": float((r * fmask).sum().item()) / denom,
            "ratio_max": float(r[active].max().item()) if n_active else 1.0,
            "ratio_min": float(r[active].min().item()) if n_active else 1.0,
            "active_tokens": n_active,
        }
    return loss, metrics


def group_advantages(rewards: torch.Tensor, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's group-relative advantage ``(r - mean) / (std + eps)`` over one group (Dr. GRPO: ``scale=False``).

    The stream processor computes advantages upstream; this is here so tests and the demo can check
    the same numbers the trainer consumes.
    """
    centred = rewards - rewards.mean()
    if not scale:
        return centred
    return centred / (rewards.std(unbiased=False) + eps)


__all__ = [
    "GRPOConfig",
    "LOSS_AGGS",
    "POLICY_LOSSES",
    "decoupled",
    "ppo_clip",
    "truncated_importance_weights",
    "LossAgg",
    "aggregate",
    "clipped_surrogate",
    "group_advantages",
    "grpo_loss",
    "importance_ratio",
    "kl_k3",
    "token_logprobs",
]
