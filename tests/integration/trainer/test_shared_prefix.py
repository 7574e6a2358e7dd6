"""A group's shared prompt computed once, and the reference's frozen lower layers taken from the policy's forward,
give SmolLM2's step of whole rows (the imported model, float32, CPU)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tests.integration.trainer.realmodel import import_smollm2
from trainer.grpo import GRPOConfig
from trainer.model import load_policy, train_top_layers
from trainer.torch_backend import Sample, TorchGRPOBackend

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.mark.parametrize("train_layers", [0, 10])
def test_smollm2_s_step_with_shared_prompts_equals_the_step_of_whole_rows(train_layers: int) -> None:
    model, tok = load_policy(import_smollm2())
    rng = random.Random(0)
    samples = []
    for _ in range(2):  # two groups of three: a single-turn prompt, and a multi-turn one whose tool tokens are not trained
        prompt = [rng.randrange(100, 40_000) for _ in range(96)]
        for _ in range(3):
            resp = [rng.randrange(100, 40_000) for _ in range(rng.randrange(8, 20))]
            mask = [1] * len(resp)
            mask[3:6] = [0, 0, 0]
            samples.append(Sample(prompt + resp, [0] * len(prompt) + mask, [0.0] * len(prompt) + [-4.0] * len(resp),
                                  rng.uniform(-1.0, 1.0)))
    runs = []
    for share in (False, True):
        policy = copy.deepcopy(model)
        train_top_layers(policy, train_layers)
        backend = TorchGRPOBackend(policy, grpo=GRPOConfig(kl_beta=0.05), micro_batch_tokens=4096, pad_id=tok.pad_id,
                                   ref_model=copy.deepcopy(model), share_prefix=share, lr=1e-4)
        # The trained part off the reference's (KL ~0.06), so the KL term has a gradient: nearer (1e-3, KL ~6e-4) its
        # gradient comes from a difference of nearly equal log-probabilities, where float32 rounding shows at 1e-4.
        with torch.no_grad():
            for p in policy.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 1e-2)
        assert backend.shared_layers == (20 if share and train_layers else 0)  # the 20 frozen of SmolLM2's 30
        m = backend.accumulate(samples)
        runs.append((m, torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])))
    (whole, g_whole), (shared, g_shared) = runs
    # float32 on the CPU: the two orders of summation agree to ~1e-6 of the gradient's norm
    assert shared["loss"] == pytest.approx(whole["loss"], rel=1e-5) and shared["kl"] == pytest.approx(whole["kl"], rel=1e-4)
    assert whole["kl"] > 0
    assert float((g_shared - g_whole).norm() / g_whole.norm()) < 1e-4
    assert shared["tokens_computed"] < 0.5 * whole["tokens_computed"]
