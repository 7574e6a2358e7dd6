"""A group's shared prompt computed once gives SmolLM2's step of whole rows (the imported model, float32, CPU)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tests.integration.trainer.realmodel import import_smollm2
from trainer.grpo import GRPOConfig
from trainer.model import load_policy
from trainer.torch_backend import Sample, TorchGRPOBackend

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_smollm2_s_step_with_shared_prompts_equals_the_step_of_whole_rows() -> None:
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
        backend = TorchGRPOBackend(policy, grpo=GRPOConfig(kl_beta=0.05), micro_batch_tokens=4096, pad_id=tok.pad_id,
                                   ref_model=copy.deepcopy(model), share_prefix=share)
        m = backend.accumulate(samples)
        runs.append((m, torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])))
    (whole, g_whole), (shared, g_shared) = runs
    # float32 on the CPU: the two orders of summation agree to ~1e-6 of the gradient's norm
    assert shared["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert float((g_shared - g_whole).norm() / g_whole.norm()) < 1e-4
    assert shared["tokens_computed"] < 0.5 * whole["tokens_computed"]
