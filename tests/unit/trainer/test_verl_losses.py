"""verl's policy losses through this trainer's registry (``verl:<name>``): each token's term, aggregated as verl
aggregates, gives verl's own loss and verl's own gradient; ``verl:vanilla`` is the built-in ``ppo-clip`` where
verl's dual clip does not bind; the trainer's CLI takes the names. verl is installed by ``make setup``."""

from __future__ import annotations

import pytest
import torch

from tests.installs import installed
from trainer.grpo import GRPOConfig, grpo_loss
from trainer.policy_losses import POLICY_LOSSES

installed("verl.trainer.ppo.core_algos", "make verl-core (make setup installs it)")
from trainer import verl_losses  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

torch.set_num_threads(1)


def _batch(seed: int, spread: float = 0.4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(6, 9, generator=g) * 3
    logp = old + (torch.rand(6, 9, generator=g) - 0.5) * 2 * spread
    adv = torch.randn(6, generator=g).unsqueeze(-1).expand(6, 9).contiguous()
    mask = (torch.rand(6, 9, generator=g) > 0.2).float()
    mask[:, 0] = 1.0
    return logp, old, adv, mask


@pytest.mark.parametrize("name", verl_losses.NAMES)
def test_each_tokens_term_gives_verls_loss_and_gradient(name: str) -> None:
    config = GRPOConfig(clip_eps=0.2, clip_eps_high=0.28, loss_agg="dapo", policy_loss=f"verl:{name}", kl_beta=0.0)
    for seed in range(3):
        logp0, old, adv, mask = _batch(seed)
        ours = logp0.clone().requires_grad_(True)
        loss, metrics = grpo_loss(ours, old, adv, mask, config)  # dapo: verl's token-mean
        loss.backward()
        theirs = logp0.clone().requires_grad_(True)
        want, _ = core_algos.get_policy_loss_fn(name)(old, theirs, adv, mask, "token-mean", verl_losses.verl_config(config))
        want.backward()
        assert torch.allclose(loss.detach(), want.detach(), atol=1e-6), (name, seed, float(loss), float(want))
        assert torch.allclose(ours.grad, theirs.grad, atol=1e-6), (name, seed)
        assert metrics["active_tokens"] == float(mask.sum())


def test_verl_vanilla_is_the_built_in_ppo_clip_where_the_dual_clip_does_not_bind() -> None:
    """Ratios within [0.67, 1.5]: verl's dual clip (ratio capped at 3 on negative advantages) never binds, and verl's
    PPO-clip is this trainer's to float precision, loss and gradient."""
    for seed in range(3):
        logp0, old, adv, mask = _batch(seed)
        grads, losses = [], []
        for loss_name in ("ppo-clip", "verl:vanilla"):
            logp = logp0.clone().requires_grad_(True)
            loss, _ = grpo_loss(logp, old, adv, mask, GRPOConfig(loss_agg="grpo", policy_loss=loss_name, kl_beta=0.0))
            loss.backward()
            grads.append(logp.grad)
            losses.append(float(loss.detach()))
        assert losses[0] == pytest.approx(losses[1], abs=1e-6)
        assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_the_dual_clip_is_where_they_part() -> None:
    """A token 20× likelier than when sampled, with a negative advantage: ppo-clip's term grows with the ratio,
    verl's vanilla stops at 3 × |A| (its ``clip_ratio_c``)."""
    logp, old, adv = torch.tensor([[0.0]]), torch.tensor([[-3.0]]), torch.tensor([-1.0])
    config = GRPOConfig()
    ppo, _, _ = POLICY_LOSSES.get("ppo-clip")(logp, old, adv, config)
    verl, _, _ = POLICY_LOSSES.get("verl:vanilla")(logp, old, adv, config)
    assert float(ppo) == pytest.approx(torch.exp(torch.tensor(3.0)).item(), rel=1e-5) and float(verl) == pytest.approx(3.0)


def test_the_trainer_takes_verl_names_and_refuses_one_it_lacks_in_one_line() -> None:
    from foundation.errors import ConfigError
    from trainer.settings import TrainerSettings

    assert TrainerSettings(policy_loss="verl:cispo").policy_loss == "verl:cispo"
    assert "verl:cispo" in POLICY_LOSSES.names()
    with pytest.raises(Exception, match="verl:gspo"):
        TrainerSettings(policy_loss="verl:gspo")
    with pytest.raises(ConfigError, match=r"'verl:gspo' is not one of: ppo-clip, decoupled, .*verl:vanilla"):
        POLICY_LOSSES.get("verl:gspo")


def test_a_verl_estimator_and_loss_train_a_step_end_to_end() -> None:
    """The stream worker's batch under ``verl:grpo`` and the trainer's step under ``verl:cispo``: the better
    rollout's response grows likelier, the worse one's less likely."""
    import math

    from streams.grouping import GroupPolicy, build_batch
    from streams.rollout import Settings, finish_attempt
    from tests.unit.streams.spans import finished, llm
    from trainer.model import build_tiny, sequence_logprobs
    from trainer.torch_backend import TorchGRPOBackend

    results = [finish_attempt([llm(1, rid=rid, att=f"{rid}-1", prompt=[1, 2, 3], response=resp)],
                              finished(rid, f"{rid}-1", task="t", reward_=reward, span_count=1, resource_version=0), Settings())
               for rid, resp, reward in (("a", [5, 6], 1.0), ("b", [7, 8], 0.0))]
    batch = build_batch(results, GroupPolicy(group_size=2, estimator="verl:grpo"), 1, True)
    assert [t.advantage > 0 for t in batch.transitions] == [True, False]
    model, tok = build_tiny(seed=0)
    before = [math.fsum(sequence_logprobs(model, t.prompt_token_ids, t.response_token_ids)) for t in batch.transitions]
    TorchGRPOBackend(model, grpo=GRPOConfig(policy_loss="verl:cispo", kl_beta=0.0), lr=1e-2, micro_batch_tokens=512,
                     pad_id=tok.pad_id).step([batch])
    after = [math.fsum(sequence_logprobs(model, t.prompt_token_ids, t.response_token_ids)) for t in batch.transitions]
    assert after[0] > before[0] and after[1] < before[1]
