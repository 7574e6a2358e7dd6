"""The trainer on two ranks (FSDP2 over gloo, two processes on this CPU) makes the one-device step, for full
fine-tuning and for LoRA: the same gradients (to float32's precision over a different summation order), the
same weights after the optimiser step, the same metrics — through the single-device step's own code
(``TorchGRPOBackend.step``), each rank with half the samples and a rank with fewer micro-batches padding with
zero-weight ones; with a KL reference sharded as the policy, the same. The optimizer state the ranks write each
their shard of resumes whole in one process; a rank that builds the model on the meta device gets rank 0's weights
and buffers. Activation checkpointing changes no gradient; LoRA's merged weights are
peft's own merge."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from trainer.grpo import GRPOConfig
from trainer.model import build_tiny
from trainer.synthetic import prompt_groups, sample_groups
from trainer.torch_backend import TorchGRPOBackend

TOL = 1e-5  # largest |difference| of a gradient entry or a weight; the gradients are O(1e-2)


def _batch(shared: bool = False, updates: int = 1) -> list:
    model, tok = build_tiny(seed=0)
    if updates > 1:  # sampled with no log-probs recorded: each rank keeps its micro-batches' own from the first update
        groups = sample_groups(model, tok, n_groups=3, group_size=3, max_new_tokens=12, seed=5)
        return [g.model_copy(update={"transitions": [t.model_copy(update={"response_logprobs": []}) for t in g.transitions]})
                for g in groups]
    if shared:  # 3 groups of 3 sharing 200-token prompts: each rank computes a prompt once for its rows of a group
        return prompt_groups(len(tok), n_groups=3, group_size=3, prompt_tokens=200, response_tokens=8, seed=5)
    # 3 groups of 3: 9 samples, an odd count (rank 0 gets 4, rank 1 gets 5), of varied lengths
    return sample_groups(model, tok, n_groups=3, group_size=3, max_new_tokens=12, seed=5)


def _backend(model: object, ranks: object = None, ref: object = None, shared: bool = False, updates: int = 1,
             minis: int = 1) -> TorchGRPOBackend:
    return TorchGRPOBackend(model, grpo=GRPOConfig(loss_agg="grpo", kl_beta=0.1 if ref is not None else 0.0), lr=1e-3,
                            max_grad_norm=1e9, micro_batch_tokens=512 if shared else 64, pad_id=0, ranks=ranks, ref_model=ref,
                            share_prefix=shared and ranks is not None, updates_per_batch=updates,
                            mini_batches=minis)


def _reference(kl: bool) -> object:
    """The KL reference: another tiny model (seed 7), so the KL term is not zero; None without KL."""
    return build_tiny(seed=7)[0] if kl else None


def _model(lora: bool) -> object:
    from trainer.lora import LoraSettings, apply_lora

    model, _tok = build_tiny(seed=0)
    if lora:
        torch.manual_seed(1)
        model = apply_lora(model, LoraSettings(rank=4))
        with torch.no_grad():  # B starts at 0 (no gradient reaches A): a non-zero B, the same on every rank
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.05)
    return model


def _rank(rank: int, world: int, init: str, out: str, lora: bool, kl: bool = False, shared: bool = False, updates: int = 1,
          minis: int = 1) -> None:
    import torch.distributed as dist

    from trainer import distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model = _model(lora)
        distributed.shard(model)
        ref = _reference(kl)
        if ref is not None:
            distributed.shard(ref)  # the reference sharded as the trainer shards it
        backend = _backend(model, distributed.Ranks(rank, world), ref, shared, updates, minis)
        groups = _batch(shared, max(updates, minis))
        metrics = backend.step(groups)
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
        weights = distributed.full_state_dict(model)
        if rank == 0:
            torch.save({"grads": grads, "weights": weights, "metrics": metrics}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("lora", "kl", "shared", "updates", "minis"), [
    (False, False, False, 1, 1), (True, False, False, 1, 1), (False, True, False, 1, 1), (False, True, True, 1, 1),
    (False, True, False, 2, 1), (False, True, False, 1, 2)],
    ids=["full", "lora", "full-kl", "full-kl-shared-prompts", "full-kl-two-updates", "full-kl-two-mini-batches"])
def test_two_ranks_make_the_one_device_step(tmp_path: Path, lora: bool, kl: bool, shared: bool, updates: int, minis: int) -> None:
    """``shared``: the ranks compute each group's prompt once (policy and reference), the one device runs whole rows.
    ``updates``: two updates on a batch that recorded no sampling log-probs: each rank clips its micro-batches (and its
    padding) against their own from the first update, as the one device does; the gradients compared are the second's.
    ``minis``: two mini-batches (a group, then two) of such a batch: the second's old log-probs from a forward pass on
    each rank's share before the first step; the gradients compared are the second mini-batch's."""
    torch.set_num_threads(1)
    model = _model(lora)
    before = copy.deepcopy(model.state_dict())
    backend = _backend(model, ref=_reference(kl), updates=updates, minis=minis)
    one = backend.step(_batch(shared, max(updates, minis)))
    one_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    adapters = sum("lora_" in n for n, _ in model.named_parameters())
    assert len(one_grads) == (adapters if lora else len(list(model.parameters()))) and (adapters > 0) == lora

    out = tmp_path / "two.pt"
    mp.start_processes(_rank, args=(2, f"file://{tmp_path / 'store'}", str(out), lora, kl, shared, updates, minis), nprocs=2,
                       start_method="spawn")
    two = torch.load(out, weights_only=False)
    assert two["grads"].keys() == one_grads.keys()
    for name, g in one_grads.items():
        assert torch.allclose(two["grads"][name], g, atol=TOL, rtol=0), (name, float((two["grads"][name] - g).abs().max()))
    moved = 0
    for name, w in model.state_dict().items():
        # AdamW divides each gradient by its own size: where a gradient is ~0 (|g| < 1e-6) a float32 difference in it
        # moves the weight by a different fraction of the learning rate (1e-3); elsewhere the weights agree to TOL.
        g = one_grads.get(name.replace("base_model.model.", ""), one_grads.get(name))
        sure = (g.abs() > 1e-6) if g is not None else torch.ones_like(w, dtype=torch.bool)
        if updates * minis > 1:  # the first update's ~0 gradients (not kept) moved weights by such fractions too: its bound only
            sure = torch.zeros_like(w, dtype=torch.bool)
        diff = (two["weights"][name] - w).abs()
        assert float(torch.where(sure, diff, 0.0).max()) <= TOL and float(diff.max()) <= 1e-3, (name, float(diff.max()))
        moved += int(not torch.equal(w, before[name]))
    assert moved >= (adapters if lora else 10)  # the step changed the (trained) weights, on both
    assert (one["kl"] > 1e-4) == kl  # with the reference, a KL term the two steps share
    for key in ("loss", "pg_loss", "kl", "samples", "tokens", "response_tokens", "ratio_mean", "clip_fraction", "grad_norm",
                *(("updates", "ratio_mean_last", "clip_fraction_last") if updates * minis > 1 else ()),
                *(("mini_batches",) if minis > 1 else ())):
        assert two["metrics"][key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    assert updates * minis == 1 or one["ratio_mean_last"] != pytest.approx(1.0, abs=1e-6)  # clipped against the first update's
    assert shared or two["metrics"]["micro_batches"] >= one["micro_batches"]  # (shared: a larger budget on the ranks)
    assert (two["metrics"]["tokens_computed"] < 0.8 * one["tokens_computed"]) == shared


def _rank_saves(rank: int, world: int, init: str, ckpt: str, out: str) -> None:
    import torch.distributed as dist

    from trainer import distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model = _model(False)
        distributed.shard(model)
        backend = _backend(model, distributed.Ranks(rank, world))
        backend.step(_batch())
        distributed.save_sharded_optimizer(model, backend.optimizer, ckpt)  # each rank its shard, nothing gathered
        full = distributed.full_optimizer_state(model, backend.optimizer)
        if rank == 0:
            torch.save(full, out)
    finally:
        dist.destroy_process_group()


def test_two_ranks_optimizer_shards_resume_in_one_process(tmp_path: Path) -> None:
    """A checkpoint's optimizer state as two ranks hold it (torch.distributed.checkpoint, one file per rank) loads
    into one process's fresh AdamW whole: every moment and step count equal to the two ranks' state gathered."""
    from trainer import distributed

    torch.set_num_threads(1)
    ckpt, out = tmp_path / "optimizer.dcp", tmp_path / "full.pt"
    mp.start_processes(_rank_saves, args=(2, f"file://{tmp_path / 'store'}", str(ckpt), str(out)), nprocs=2,
                       start_method="spawn")
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    model = _model(False)
    backend = _backend(model)
    backend.load_sharded_optimizer_state(ckpt)
    full = torch.load(out, weights_only=False)
    got = distributed.by_name(backend.optimizer.state_dict(), distributed.trained_names(model))
    assert got["state"].keys() == full["state"].keys() and len(got["state"]) == len(list(model.parameters()))
    for name, moments in full["state"].items():
        for key, value in moments.items():
            assert torch.equal(torch.as_tensor(got["state"][name][key]), torch.as_tensor(value)), (name, key)
    assert float(next(iter(got["state"].values()))["step"]) == 1.0
    assert got["param_groups"][0]["lr"] == full["param_groups"][0]["lr"] == 1e-3


def _rank_fills(rank: int, world: int, init: str, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    from trainer import distributed
    from trainer.model import load_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model = load_policy(model_dir, device="cpu" if rank == 0 else "meta")[0]
        assert (rank == 0) != all(p.is_meta for p in model.parameters())
        full = model.state_dict() if rank == 0 else {}
        distributed.shard(model)
        distributed.fill_from_rank0(model, full, torch.device("cpu"))
        weights = distributed.full_state_dict(model)
        buffers = {n: b.clone() for n, b in model.named_buffers()}
        torch.save({"weights": weights, "buffers": buffers}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_a_rank_built_on_the_meta_device_gets_rank_0_s_weights_and_buffers(tmp_path: Path) -> None:
    """Rank 1 builds the model's shape on the meta device (no weight read); once sharded, its shard comes from rank
    0's weights: the gathered weights are the model directory's, and its buffers (rotary frequencies) rank 0's."""
    from trainer.model import build_tiny, load_policy, save_policy

    model_dir = save_policy(*build_tiny(seed=0), tmp_path / "base")
    out = tmp_path / "filled.pt"
    mp.start_processes(_rank_fills, args=(2, f"file://{tmp_path / 'store'}", str(model_dir), str(out)), nprocs=2,
                       start_method="spawn")
    expected = load_policy(model_dir)[0]
    rank0, rank1 = (torch.load(f"{out}.{r}", weights_only=False) for r in (0, 1))
    assert rank0["weights"].keys() == expected.state_dict().keys()
    for name, w in expected.state_dict().items():
        assert torch.equal(rank0["weights"][name], w), name
    assert rank1["buffers"].keys() == dict(expected.named_buffers()).keys() and rank1["buffers"]
    for name, b in expected.named_buffers():
        assert torch.equal(rank1["buffers"][name], b), name


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


def test_activation_checkpointing_changes_no_gradient() -> None:
    torch.set_num_threads(1)
    groups = _batch()
    plain, ac = build_tiny(seed=0)[0], build_tiny(seed=0)[0]
    ac.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    _backend(plain).step(groups)
    _backend(ac).step(groups)
    for (name, a), b in zip(plain.named_parameters(), ac.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=0), name


def test_lora_s_published_weights_are_peft_s_merge() -> None:
    from trainer.lora import LoraSettings, merged_state_dict

    model = _model(True)
    ours = merged_state_dict(model.state_dict(), LoraSettings(rank=4).scaling)
    theirs = copy.deepcopy(model).merge_and_unload().state_dict()
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.allclose(ours[key], value, atol=1e-6), key


def test_lora_s_adapters_load_in_peft_onto_their_base_and_make_the_merged_weights(tmp_path: Path) -> None:
    """A LoRA checkpoint's adapter/ (what vLLM's server loads at run time) is peft's format: loaded onto the weights it
    names as its base, it gives the weights published beside it."""
    import json

    from peft import PeftModel

    from trainer.lora import ADAPTER_CONFIG, LoraSettings, adapter_state_dict, merged_state_dict, write_adapter

    model = _model(True)
    state = model.state_dict()
    assert set(adapter_state_dict(state)) and all(".default." not in k for k in adapter_state_dict(state))
    out = write_adapter(tmp_path, state, LoraSettings(rank=4), "/ckpt/step-0")
    config = json.loads((out / ADAPTER_CONFIG).read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 16.0, "/ckpt/step-0")
    base, _tok = build_tiny(seed=0)  # the weights the adapters were trained on
    loaded = PeftModel.from_pretrained(base, str(out)).merge_and_unload().state_dict()
    ours = merged_state_dict(state, LoraSettings(rank=4).scaling)
    assert loaded.keys() == ours.keys()
    for key, value in ours.items():
        assert torch.allclose(loaded[key], value, atol=1e-6), key
    with pytest.raises(ValueError, match="no LoRA adapters"):
        write_adapter(tmp_path / "full", build_tiny(seed=0)[0].state_dict(), LoraSettings(rank=4), None)


def test_all_linear_adapts_every_linear_layer_but_the_head_and_its_adapters_load_in_peft(tmp_path: Path) -> None:
    """--lora-targets all-linear (verl's default): adapters on the MLP too, none on the output head; adapter/ names the
    modules it adapted (vLLM checks them), and peft loads it onto its base as the merged weights."""
    import json

    from peft import PeftModel

    from trainer.lora import ADAPTER_CONFIG, LoraSettings, apply_lora, merged_state_dict, write_adapter
    from trainer.settings import TrainerSettings

    assert TrainerSettings(lora_targets="all-linear").lora_targets == "all-linear"
    lora = LoraSettings(rank=4, targets=("all-linear",))
    model = apply_lora(build_tiny(seed=0)[0], lora)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.05)
    state = model.state_dict()
    config = json.loads((write_adapter(tmp_path, state, lora, "/base") / ADAPTER_CONFIG).read_text())
    assert {"q_proj", "o_proj", "gate_proj", "down_proj"} <= set(config["target_modules"])
    assert not any("lm_head" in k and "lora_" in k for k in state)
    loaded = PeftModel.from_pretrained(build_tiny(seed=0)[0], str(tmp_path / "adapter")).merge_and_unload().state_dict()
    ours = merged_state_dict(state, lora.scaling)
    for key, value in ours.items():
        assert torch.allclose(loaded[key], value, atol=1e-6), key
