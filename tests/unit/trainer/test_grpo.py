"""GRPO numbers pinned on small hand-computed cases, plus gradient checks in float64."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.grpo import (
    GRPOConfig,
    aggregate,
    clipped_surrogate,
    group_advantages,
    grpo_loss,
    importance_ratio,
    kl_k3,
    token_logprobs,
)

torch.set_num_threads(1)


def test_token_logprobs_aligned_to_input_positions() -> None:
    # vocab 2; position 0 predicts token 1 with p=1/2, position 1 predicts token 0 with p=3/4.
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, 5.0]]])
    ids = torch.tensor([[0, 1, 0]])
    lp = token_logprobs(logits, ids)
    assert lp.shape == (1, 3)
    assert lp[0, 0].item() == 0.0
    assert lp[0, 1].item() == pytest.approx(math.log(0.5))
    assert lp[0, 2].item() == pytest.approx(math.log(0.75))


def test_token_logprobs_temperature_divides_logits() -> None:
    logits = torch.tensor([[[2.0, 0.0], [0.0, 0.0]]])
    ids = torch.tensor([[0, 0]])
    # T=2 → logits [1, 0] → p(0) = e/(e+1)
    assert token_logprobs(logits, ids, temperature=2.0)[0, 1].item() == pytest.approx(math.log(math.e / (math.e + 1)))


def test_importance_ratio() -> None:
    r = importance_ratio(torch.tensor([math.log(0.3)]), torch.tensor([math.log(0.6)]))
    assert r.item() == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("adv", "expected_loss", "expected_clipped"),
    [
        (1.0, [-0.5, -1.0, -1.2], [0.0, 0.0, 1.0]),  # A>0: the upper bound bites at r=1.5
        (-1.0, [0.8, 1.0, 1.5], [1.0, 0.0, 0.0]),  # A<0: the lower bound bites at r=0.5
    ],
)
def test_clipped_surrogate_symmetric(adv: float, expected_loss: list[float], expected_clipped: list[float]) -> None:
    ratio = torch.tensor([[0.5, 1.0, 1.5]])
    loss, clipped = clipped_surrogate(ratio, torch.tensor([adv]), clip_eps=0.2)
    assert loss[0].tolist() == pytest.approx(expected_loss)
    assert clipped[0].tolist() == expected_clipped


def test_clipped_surrogate_asymmetric_eps_high() -> None:
    ratio = torch.tensor([[1.25, 0.7]])
    loss, clipped = clipped_surrogate(ratio, torch.tensor([2.0]), clip_eps=0.2, clip_eps_high=0.28)
    # 1.25 < 1.28 → unclipped: -2.5 ; 0.7: min(1.4, 0.8*2=1.6) = 1.4 (A>0 never clips from below)
    assert loss[0].tolist() == pytest.approx([-2.5, -1.4])
    assert clipped[0].tolist() == [0.0, 0.0]
    loss_sym, clipped_sym = clipped_surrogate(ratio, torch.tensor([2.0]), clip_eps=0.2)
    assert loss_sym[0].tolist() == pytest.approx([-2.4, -1.4])
    assert clipped_sym[0].tolist() == [1.0, 0.0]


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 7.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("agg", "kwargs", "expected"),
    [
        ("grpo", {}, (2.0 + 4.0) / 2),  # per-sequence means 2 and 4
        ("dapo", {}, 10.0 / 4),  # 10 over 4 active tokens
        ("dr_grpo", {"max_len": 4}, 10.0 / (2 * 4)),
        ("dr_grpo", {}, 10.0 / (2 * 3)),  # constant defaults to the mask width
    ],
)
def test_aggregation_variants(agg: str, kwargs: dict[str, int], expected: float) -> None:
    assert aggregate(PER_TOKEN, MASK, agg, **kwargs).item() == pytest.approx(expected)  # type: ignore[arg-type]


def test_aggregation_sequence_weights_and_empty_sequence() -> None:
    w = torch.tensor([0.5, 1.0])
    assert aggregate(PER_TOKEN, MASK, "grpo", seq_weights=w).item() == pytest.approx((1.0 + 4.0) / 2)
    empty = torch.zeros(2, 3, dtype=torch.long)
    assert aggregate(PER_TOKEN, empty, "grpo").item() == 0.0
    assert aggregate(PER_TOKEN, empty, "dapo").item() == 0.0


@pytest.mark.parametrize("agg", ["grpo", "dapo", "dr_grpo"])
def test_micro_batches_sum_to_the_full_batch(agg: str) -> None:
    """Gradient accumulation with global normalisers gives exactly the full-batch loss."""
    g = torch.Generator().manual_seed(0)
    per_tok = torch.rand(5, 7, generator=g)
    mask = (torch.rand(5, 7, generator=g) > 0.3).long()
    full = aggregate(per_tok, mask, agg, max_len=7)  # type: ignore[arg-type]
    parts = sum(
        aggregate(per_tok[s], mask[s], agg, num_seqs=5, num_tokens=float(mask.sum()), max_len=7)  # type: ignore[arg-type]
        for s in (slice(0, 2), slice(2, 5))
    )
    assert float(parts) == pytest.approx(full.item())


def test_kl_k3_hand_value_and_zero_at_equality() -> None:
    kl = kl_k3(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    # d = log(0.25/0.5) = -log 2 → 0.5 + log 2 - 1
    assert kl.item() == pytest.approx(0.5 + math.log(2.0) - 1.0)
    assert kl_k3(torch.tensor([-1.3]), torch.tensor([-1.3])).item() == 0.0
    assert (kl_k3(torch.randn(100), torch.randn(100)) >= 0).all()
    # a token pushed far below the reference counts at most KL_TOKEN_MAX (as verl's low_var_kl), not e^7
    far = kl_k3(torch.tensor([-8.0, -1.5], requires_grad=True), torch.tensor([-1.0, -1.0]))
    assert far[0].item() == 10.0 and far[1].item() == pytest.approx(math.exp(0.5) - 0.5 - 1.0)


def test_grpo_loss_values_and_metrics() -> None:
    # two sequences, 3 positions; position 0 is prompt (masked); seq 1 has a tool token at position 2.
    old = torch.log(torch.tensor([[1.0, 0.5, 0.5], [1.0, 0.5, 0.5]]))
    new = torch.log(torch.tensor([[1.0, 0.75, 0.5], [1.0, 0.25, 0.9]]))  # ratios [·,1.5,1] and [·,0.5,1.8]
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    adv = torch.tensor([1.0, -1.0])
    cfg = GRPOConfig(clip_eps=0.2, loss_agg="grpo")
    loss, m = grpo_loss(new, old, adv, mask, cfg)
    # seq0: tokens -> -min(1.5,1.2)=-1.2, -1.0 → mean -1.1 ; seq1: -min(-0.5,-0.8)=0.8 → mean 0.8
    assert loss.item() == pytest.approx((-1.1 + 0.8) / 2)
    assert m["clip_fraction"] == pytest.approx(2 / 3)
    assert m["ratio_mean"] == pytest.approx((1.5 + 1.0 + 0.5) / 3)
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)
    assert m["active_tokens"] == 3 and m["kl"] == 0.0
    loss_dapo, _ = grpo_loss(new, old, adv, mask, GRPOConfig(loss_agg="dapo"))
    assert loss_dapo.item() == pytest.approx((-1.2 - 1.0 + 0.8) / 3)


def test_grpo_loss_with_kl_term() -> None:
    old = torch.log(torch.tensor([[1.0, 0.5]]))
    new = old.clone()
    ref = torch.log(torch.tensor([[1.0, 0.25]]))
    mask = torch.tensor([[0, 1]])
    cfg = GRPOConfig(kl_beta=0.1, loss_agg="dapo")
    loss, m = grpo_loss(new, old, torch.tensor([2.0]), mask, cfg, ref_logp=ref)
    k3 = 0.5 + math.log(2.0) - 1.0
    assert m["kl"] == pytest.approx(k3)
    assert loss.item() == pytest.approx(-2.0 + 0.1 * k3)


def test_gradcheck_float64() -> None:
    torch.manual_seed(0)
    old = -torch.rand(3, 5, dtype=torch.float64) - 0.1
    ref = -torch.rand(3, 5, dtype=torch.float64) - 0.1
    # stay away from the clip boundaries, where the loss is not differentiable
    new = (old + 0.05 * torch.randn(3, 5, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [1, 1, 0, 1, 1]])
    for agg in ("grpo", "dapo", "dr_grpo"):
        cfg = GRPOConfig(clip_eps=0.2, kl_beta=0.05, loss_agg=agg)  # type: ignore[arg-type]
        assert torch.autograd.gradcheck(lambda x: grpo_loss(x, old, adv, mask, cfg, ref_logp=ref)[0], (new,))


def test_gradients_vanish_on_clipped_and_masked_tokens() -> None:
    old = torch.zeros(1, 4, dtype=torch.float64)
    new = torch.log(torch.tensor([[1.0, 1.5, 1.1, 1.1]], dtype=torch.float64)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, _ = grpo_loss(new, old, torch.tensor([1.0], dtype=torch.float64), mask, GRPOConfig(loss_agg="dapo"))
    loss.backward()
    g = new.grad[0].tolist()  # type: ignore[union-attr]
    # d/dlogp of -ratio*A/3 = -ratio/3 for active unclipped; 0 where clipped (1.5) or masked
    assert g == pytest.approx([-1 / 3, 0.0, -1.1 / 3, 0.0])


def test_token_logprobs_gradient_matches_finite_differences() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 5, (2, 4))
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, ids).sum(), (logits,))


def test_group_advantages() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert adv.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)
    assert group_advantages(torch.tensor([3.0, 1.0]), scale=False).tolist() == [1.0, -1.0]


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="loss_agg"):
        GRPOConfig(loss_agg="mean")  # type: ignore[arg-type]
