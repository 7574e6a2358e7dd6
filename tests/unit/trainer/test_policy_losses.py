"""The policy term of the loss is chosen by name (:data:`trainer.policy_losses.POLICY_LOSSES`): ``ppo-clip`` is
today's objective; ``decoupled`` (AReaL's) matches it on fresh data and keeps the gradient of a stale batch
that PPO-clip cuts; a registered loss and a registered estimator are used end to end, from the stream worker's
batch to the trainer's optimiser step."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from foundation.errors import ConfigError
from streams.grouping import ESTIMATORS, GroupAdvantages, GroupPolicy, build_batch
from streams.rollout import Settings, finish_attempt
from tests.unit.streams.spans import finished, llm
from trainer.grpo import GRPOConfig, grpo_loss
from trainer.model import build_tiny
from trainer.policy_losses import POLICY_LOSSES, truncated_importance_weights
from trainer.torch_backend import TorchGRPOBackend

torch.set_num_threads(1)


def _grad(config: GRPOConfig, logp0: torch.Tensor, old: torch.Tensor, adv: torch.Tensor) -> tuple[float, torch.Tensor]:
    logp = logp0.clone().requires_grad_(True)
    loss, _ = grpo_loss(logp, old, adv, torch.ones_like(logp0), config)
    loss.backward()
    return float(loss.detach()), logp.grad


def test_decoupled_equals_ppo_clip_on_fresh_data() -> None:
    torch.manual_seed(0)
    logp = -torch.rand(3, 5) * 2
    adv = torch.tensor([1.0, -0.5, 0.3])
    fresh = [_grad(GRPOConfig(policy_loss=name), logp, logp.clone(), adv) for name in ("ppo-clip", "decoupled")]
    assert fresh[0][0] == pytest.approx(fresh[1][0], abs=1e-7)
    assert torch.allclose(fresh[0][1], fresh[1][1], atol=1e-7)


def test_decoupled_keeps_the_gradient_of_a_stale_batch_weighted_by_the_truncated_ratio() -> None:
    """Tokens the current policy finds 3x likelier than the behaviour policy did: PPO-clip's ratio 3 is outside
    [0.8, 1.2] for a positive advantage, so their gradient is 0; the decoupled loss pushes them with weight
    min(3, cap=2) = 2 (and with weight 0.5 where the current policy finds them half as likely)."""
    logp = torch.log(torch.tensor([[0.3, 0.3], [0.1, 0.1]]))
    old = torch.log(torch.tensor([[0.1, 0.1], [0.2, 0.2]]))
    adv = torch.tensor([1.0, 1.0])
    _, g_ppo = _grad(GRPOConfig(), logp, old, adv)
    _, g_dec = _grad(GRPOConfig(policy_loss="decoupled", is_cap=2.0), logp, old, adv)
    assert torch.all(g_ppo[0] == 0)  # clipped: nothing learnt from the stale tokens
    # grpo aggregation: mean over 2 tokens, then over 2 sequences -> each token's gradient is -A * w / 4
    assert g_dec[0].tolist() == pytest.approx([-2.0 / 4] * 2)
    assert g_dec[1].tolist() == pytest.approx([-0.5 / 4] * 2)
    w = truncated_importance_weights(logp, old, 2.0)
    assert w.flatten().tolist() == pytest.approx([2.0, 2.0, 0.5, 0.5]) and not w.requires_grad


def test_an_unknown_loss_is_one_line_naming_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="policy loss 'nope' is not one of: ppo-clip, decoupled"):
        GRPOConfig(policy_loss="nope")


def test_a_registered_estimator_and_loss_are_used_end_to_end() -> None:
    """A toy estimator (+1 on the last turn, -1 before it) and a toy loss (-A * logp) registered with one decorator
    each: the stream worker's batch carries the estimator's advantages, the trainer's step calls the loss with
    them, and the optimiser moves the last turn's tokens up and the earlier turn's down."""
    seen: list[list[float]] = []

    @ESTIMATORS.register("last-turn-test")
    def last_turn(returns: list[list[float]], policy: GroupPolicy) -> GroupAdvantages:
        """+1 on each rollout's last turn, -1 on the others"""
        steps = [[-1.0] * (len(p) - 1) + [1.0] for p in returns]
        return GroupAdvantages(steps, [0.0] * len(steps), 0.0, 1.0, False)

    @POLICY_LOSSES.register("reinforce-test")
    def reinforce(logp, old_logp, advantages, config):  # type: ignore[no-untyped-def]
        """-A * logp per token"""
        seen.append(advantages.flatten().tolist())
        a = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
        return -a * logp, torch.zeros_like(logp), torch.exp(logp - old_logp)

    try:
        spans = [llm(1, rid="r", att="r-1", prompt=[1, 2, 3], response=[5, 6]),
                 llm(2, rid="r", att="r-1", prompt=[1, 2, 3, 5, 6, 4], response=[7, 8])]
        result = finish_attempt(spans, finished("r", "r-1", task="t", reward_=1.0, span_count=2, resource_version=3),
                                Settings())
        batch = build_batch([result], GroupPolicy(group_size=1, min_rollouts=1, estimator="last-turn-test"), 1, True)
        assert [t.advantage for t in batch.transitions] == [-1.0, 1.0]

        model, tok = build_tiny(seed=0)
        before = copy.deepcopy(model)
        backend = TorchGRPOBackend(model, grpo=GRPOConfig(policy_loss="reinforce-test"), lr=1e-2, micro_batch_tokens=512,
                                   pad_id=tok.pad_id)
        backend.step([batch])
        assert sorted(seen[0]) == [-1.0, 1.0]

        def logp(m: object, t: object) -> float:
            from trainer.model import sequence_logprobs

            return math.fsum(sequence_logprobs(m, t.prompt_token_ids, t.response_token_ids))  # type: ignore[attr-defined]

        first, last = batch.transitions
        assert logp(model, last) > logp(before, last) and logp(model, first) < logp(before, first)
    finally:
        ESTIMATORS.unregister("last-turn-test")
        POLICY_LOSSES.unregister("reinforce-test")
