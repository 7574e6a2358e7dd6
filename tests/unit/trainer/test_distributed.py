"""The trainer on two ranks (FSDP2 over gloo, two processes on this CPU) makes the one-device step: the same
gradients (to float32's precision over a different summation order), the same weights after the optimiser
step, the same metrics — through the single-device step's own code (``TorchGRPOBackend.step``), each rank
with half the samples and a rank with fewer micro-batches padding with zero-weight ones."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from trainer.grpo import GRPOConfig
from trainer.model import build_tiny
from trainer.synthetic import sample_groups
from trainer.torch_backend import TorchGRPOBackend

TOL = 1e-5  # largest |difference| of a gradient entry or a weight; the gradients are O(1e-2)


def _batch() -> list:
    model, tok = build_tiny(seed=0)
    # 3 groups of 3: 9 samples, an odd count (rank 0 gets 5, rank 1 gets 4), of varied lengths
    return sample_groups(model, tok, n_groups=3, group_size=3, max_new_tokens=12, seed=5)


def _backend(model: object, ranks: object = None) -> TorchGRPOBackend:
    return TorchGRPOBackend(model, grpo=GRPOConfig(loss_agg="grpo", kl_beta=0.0), lr=1e-3, max_grad_norm=1e9,
                            micro_batch_tokens=64, pad_id=0, ranks=ranks)


def _rank(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from trainer import distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model, _tok = build_tiny(seed=0)
        distributed.shard(model)
        backend = _backend(model, distributed.Ranks(rank, world))
        groups = _batch()
        metrics = backend.step(groups)
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        weights = distributed.full_state_dict(model)
        if rank == 0:
            torch.save({"grads": grads, "weights": weights, "metrics": metrics}, out)
    finally:
        dist.destroy_process_group()


def test_two_ranks_make_the_one_device_step(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model, _tok = build_tiny(seed=0)
    before = copy.deepcopy(model.state_dict())
    backend = _backend(model)
    one = backend.step(_batch())
    one_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    out = tmp_path / "two.pt"
    mp.start_processes(_rank, args=(2, f"file://{tmp_path / 'store'}", str(out)), nprocs=2, start_method="spawn")
    two = torch.load(out, weights_only=False)
    for name, g in one_grads.items():
        assert torch.allclose(two["grads"][name], g, atol=TOL, rtol=0), (name, float((two["grads"][name] - g).abs().max()))
    moved = 0
    for name, w in model.state_dict().items():
        assert torch.allclose(two["weights"][name], w, atol=TOL, rtol=0), name
        moved += int(not torch.equal(w, before[name]))
    assert moved > 10  # the step changed the weights, on both
    for key in ("loss", "pg_loss", "samples", "tokens", "response_tokens", "ratio_mean", "clip_fraction", "grad_norm"):
        assert two["metrics"][key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    assert two["metrics"]["micro_batches"] >= one["micro_batches"]


@pytest.mark.skipif(os.cpu_count() == 1, reason="two processes")
def test_the_check_sees_a_step_that_is_not_the_one_device_step(tmp_path: Path) -> None:
    """The comparison above fails when it should: one device's step on half the batch differs."""
    torch.set_num_threads(1)
    groups = _batch()
    full, half = build_tiny(seed=0)[0], build_tiny(seed=0)[0]
    _backend(full).step(groups)
    _backend(half).step(groups[:1])
    diffs = [float((a.grad - b.grad).abs().max()) for a, b in zip(full.parameters(), half.parameters())]
    assert max(diffs) > 100 * TOL
