"""The GPU trainer check (issue 49): the trainer's own GRPO step on CUDA against the same step on the CPU,
step times, tokens/s and peak memory at two model sizes, and verl's DataProto path where verl imports.

What it runs (``trainer.torch_backend.TorchGRPOBackend.step``, the step ``rolloutbus train`` takes; nothing
copied), each part written to ``--out`` (gpu-check.json, gpu-check.md) as soon as it is done:

(a) correctness: recorded GroupBatches (``recorded_groups.avro`` beside this file, the project's Avro
    single-object records) through one step of a model of SmolLM2-135M's architecture (seeded random
    weights: the packaged GGUF is 89 MiB, over the 64 MiB a GPU run may carry), in float32 and bfloat16,
    on the device and on the CPU from the same weights; loss, the step's metrics and every gradient
    compared (and the same step with LoRA adapters, variant ``lora``). Two batch variants: ``recorded`` (the recorded behaviour log-probs, the tiny policy's, about
    -4.6 a token against a random 49k-vocabulary model's -10.8: ratios near 2e-3, so the loss is mostly
    its clipped terms and the gradient comes from the positive-advantage rows) and ``on_policy_kl``
    (behaviour log-probs dropped, so every response token carries gradient, plus the k3 KL to a reference
    model of another seed). The exact step is the CPU's in float64. With ``--device cuda`` a run passes
    when its difference from the CPU's step in the same dtype and its distance from the exact step are
    both within the larger of :data:`TOLERANCES` and :data:`CPU_FACTOR` x the CPU step's own distance
    from the exact one; with ``--device cpu`` (no second implementation) when its distance from the
    exact step is within :data:`TOLERANCES`.
(b) timing: steps of ``--steps`` (after one warm-up) on synthetic GroupBatches of the trainer's shape, for
    the 135M model and a ~1.04B model of the same family (SmolLM2-1.7B's layer shape, 14 of its 24
    layers), in float32 (what the trainer loads) and bfloat16: seconds per step, tokens/s, peak memory
    (CUDA: ``max_memory_allocated``/``reserved``; CPU: the process's peak RSS, which never goes down).
(c) verl: its ``vanilla`` policy loss through the trainer's registry (``verl:vanilla``) against the built-in
    ``ppo-clip`` on the device, loss and gradient, where verl imports. verl does not import on the GPU machine:
    ``verl.protocol`` imports Ray at its top, and Ray's wheel (ray-2.60.0, cp312 manylinux2014_x86_64)
    is 79 MB, over the 64 MiB carry limit by itself; the section records why and what else it would need.
(d) FSDP2: the trainer's step on one rank as ``rolloutbus train --nproc-per-node`` shards it
    (``trainer.distributed.shard``, NCCL on a GPU, gloo on the CPU), at the larger size, in bf16-mixed on a GPU: full
    fine-tuning and LoRA (rank 8, all-linear), each with and without activation checkpointing (step time,
    tokens/s, peak memory, trainable parameters; a non-finite loss fails the run).

The GPU run (one command; estimated 4 to 6 minutes on an H100, never run yet; ``make gpu-wheels`` here first,
then ``gpu-wheels`` named in the device tool's ``carry``, with ``timeout_s`` 540)::

    set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
      --target /tmp/site gpu-wheels/*.whl && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 && \\
      python3 tests/gpu/gpu_check.py --device cuda --out $OUT 2>&1 | tee $OUT/gpu-check.log

Then copy ``gpu-check.md`` into ``bench/results/gpu-<date>.md`` with the card and the commit (where the copy
on the machine has no ``.git`` its commit field reads None).

``--device cpu --tiny`` is what ``tests/gpu/test_gpu_check.py`` runs in ``make test`` (the same code, with a
two-layer model and small batches). The exit status is 1 when a gated comparison failed.
``--record FILE`` re-records the fixture (sampled by the project's tiny policy; see :func:`record_groups`).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import platform
import random
import re
import resource
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file on a machine where the project is not installed
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from schemas.codec import decode, encode  # noqa: E402
from schemas.models import GroupBatch, Transition  # noqa: E402
from trainer.device import CPU_MICRO_BATCH_TOKENS, GPU_MICRO_BATCH_TOKENS  # noqa: E402
from trainer.grpo import GRPOConfig, group_advantages  # noqa: E402
from trainer.sft import SFTConfig, sft_ids  # noqa: E402
from trainer.torch_backend import TorchGRPOBackend  # noqa: E402

FIXTURE = Path(__file__).with_name("recorded_groups.avro")

# The trainer's defaults (trainer/settings.py; tests/gpu/test_gpu_check.py keeps these equal to them):
# settings are not imported because pydantic-settings is not carried to the GPU machine.
TRAINER_LR = 5e-4
TRAINER_MAX_GRAD_NORM = 1.0
TRAINER_MICRO_BATCH_TOKENS = CPU_MICRO_BATCH_TOKENS  # the CPU's default; a GPU's is GPU_MICRO_BATCH_TOKENS
KL_BETA = 0.04  # the on_policy_kl variant's; the trainer's default is 0 (no reference)

# SmolLM2-135M's config.json (HuggingFaceTB/SmolLM2-135M), the fields a LlamaConfig takes.
SMOLLM2_135M: dict[str, Any] = {
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192, "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5, "initializer_range": 0.041666666666666664, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}
# SmolLM2-1.7B's layer shape (hidden 2048, 32 heads, MLP 8192) with 14 of its 24 layers: 1.04B parameters.
SMOLLM2_1B: dict[str, Any] = {
    **SMOLLM2_135M, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 14,
    "num_attention_heads": 32, "num_key_value_heads": 32, "initializer_range": 0.02,
}
# The CPU test's: the same family (GQA, tied head), two narrow layers, a vocabulary of 4096 (the recorded ids
# are under 128; the full one made the test's steps several times slower on 2 cores).
TINY: dict[str, Any] = {**SMOLLM2_135M, "vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
TINY_WIDE: dict[str, Any] = {**TINY, "hidden_size": 128, "intermediate_size": 256}

# Errors: |loss - ref| / max(1, |ref|) and ||g - g_ref|| / ||g_ref|| over all parameters (the gradients the
# optimiser used). The gate (see :func:`correctness`) raises these to CPU_FACTOR x the CPU's own distance from
# the float64 step where that is larger. Seen on the CPU (2026-11-27, torch 2.15) for the 135M model, gradients
# against float64: float32 4.9e-6 (recorded) and 7.6e-6 (on_policy_kl); bfloat16 7.4e-2 and 5.5e-2 (loss 1.2e-3):
# the ratio exp(logp - old) carries bfloat16's log-prob error into every gradient. The two-layer model: 6e-7
# and 8e-3. Two bfloat16 implementations with independent errors e differ by about 1.4 e, hence the factor 3.
# A wrong mask, position or placement moves these by O(1).
TOLERANCES: dict[str, dict[str, float]] = {
    "float32": {"loss_tol": 1e-4, "grad_tol": 1e-3},
    "bfloat16": {"loss_tol": 5e-2, "grad_tol": 1e-1},
    "bf16-mixed": {"loss_tol": 5e-2, "grad_tol": 1e-1},
}
CPU_FACTOR = 3.0
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "bf16-mixed": torch.float32}
# bf16-mixed (the trainer's --precision on a GPU): float32 weights, forward passes under bfloat16 autocast.
AUTOCAST = {"bf16-mixed": torch.bfloat16}
# sft: one step of ``rolloutbus train --algorithm sft`` (:func:`trainer.sft.sft_ids`) on the recorded transitions
# (prompt ids, response ids); SFT takes no --precision (bf16-mixed runs it in float32, as the SFT CLI does).
# lora: the recorded batch through a LoRA policy (``rolloutbus train --lora-rank 8``: peft adapters on the trainer's
# default targets, seeded, B drawn non-zero as after some training so that A gets gradient too); only the adapters
# train, so the comparison is over their gradients (the frozen weights' are zero on both sides).
VARIANTS = ("recorded", "on_policy_kl", "sft", "lora")
LORA_RANK = 8


# ------------------------------------------------------------------------------------------ the batches


def write_groups(path: Path, groups: Sequence[GroupBatch]) -> None:
    """GroupBatches as the project's single-object Avro records, each behind a 4-byte big-endian length."""
    with open(path, "wb") as fh:
        for g in groups:
            body = encode(g)
            fh.write(struct.pack(">I", len(body)) + body)


def read_groups(path: Path) -> list[GroupBatch]:
    """The records :func:`write_groups` wrote, decoded (and validated) by ``schemas.codec.decode``."""
    data = path.read_bytes()
    out, at = [], 0
    while at < len(data):
        (n,) = struct.unpack_from(">I", data, at)
        out.append(decode(data[at + 4 : at + 4 + n], expect="rolloutbus.GroupBatch"))
        at += 4 + n
    if not out:
        raise ValueError(f"{path}: no GroupBatch records")
    return out  # type: ignore[return-value]


def record_groups(path: Path, n_groups: int = 6, group_size: int = 4, max_new_tokens: int = 24, seed: int = 49) -> None:
    """Sample GroupBatches with the project's tiny policy (real sampling, real behaviour log-probs) and
    record them. Their ids are char-tokenizer ids, all inside SmolLM2's vocabulary."""
    from trainer.model import build_tiny
    from trainer.synthetic import sample_groups

    model, tok = build_tiny(seed=seed)
    write_groups(path, sample_groups(model, tok, n_groups=n_groups, group_size=group_size, max_new_tokens=max_new_tokens,
                                     seed=seed))


def on_policy(groups: Sequence[GroupBatch]) -> list[GroupBatch]:
    """The same groups with the behaviour log-probs dropped (the trainer then takes its own: ratio 1)."""
    return [g.model_copy(update={"transitions": [t.model_copy(update={"response_logprobs": []}) for t in g.transitions]})
            for g in groups]


def timing_groups(n_groups: int, group_size: int, prompt_len: int, response_len: int, vocab: int,
                  seed: int = 0) -> list[GroupBatch]:
    """Synthetic GroupBatches of the trainer's shape: random ids, behaviour log-probs near a uniform
    policy's (so ratios stay near 1, as for a fresh random model), group-normalised advantages."""
    rng = random.Random(seed)
    uniform = -math.log(vocab)
    groups = []
    for gi in range(n_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        rewards = [rng.random() for _ in range(group_size)]
        advs = group_advantages(torch.tensor(rewards)).tolist()
        gid = uuid.UUID(int=rng.getrandbits(128)).hex
        rids = [f"{gid}-{i}" for i in range(group_size)]
        transitions = [
            Transition(rollout_id=rid, attempt_id=f"{rid}-a", task_id=gid, span_id=f"{rid}-s", turn=0, resource_version=0,
                       prompt_token_ids=prompt, response_token_ids=[rng.randrange(3, vocab) for _ in range(response_len)],
                       response_logprobs=[uniform + rng.gauss(0.0, 0.05) for _ in range(response_len)],
                       response_mask=[1] * response_len, reward=r, return_=r, advantage=a)
            for rid, r, a in zip(rids, rewards, advs)
        ]
        groups.append(GroupBatch(group_id=gid, task_id=gid, resource_version=0, created_ns=gi, group_size=group_size,
                                 rollout_ids=rids, rewards=rewards, advantages=advs, transitions=transitions))
    return groups


# ------------------------------------------------------------------------------------------ models and steps


def build_model(config: dict[str, Any], seed: int, device: str = "cpu") -> Any:
    """A ``LlamaForCausalLM`` of ``config`` with seeded random weights, built on ``device`` in float32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**config)
    cfg._attn_implementation = "sdpa"  # what from_pretrained picks where torch has SDPA; said so in the results
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    model.eval()
    return model


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


@dataclass
class StepRun:
    """One trainer step's outcome: its metrics and every gradient (on the CPU, in float64)."""

    where: str  # "cuda float32"
    metrics: dict[str, float]
    grads: dict[str, torch.Tensor]
    seconds: float


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_sft_step(policy: Any, groups: Sequence[GroupBatch], device: str, dtype: str) -> StepRun:
    """One optimiser step of :func:`trainer.sft.sft_ids` (all transitions in one batch) on a copy of ``policy``
    moved to ``device`` in ``dtype``; the gradients are read after the step (clipped, as the step used them)."""
    dev = torch.device(device)
    model = copy.deepcopy(policy).to(device=dev, dtype=DTYPES[dtype])
    pairs = [(t.prompt_token_ids, t.response_token_ids) for g in groups for t in g.transitions]
    sync(dev)
    t0 = time.perf_counter()
    losses = sft_ids(model, pairs, SFTConfig(epochs=1, lr=TRAINER_LR, batch_size=len(pairs)), int(model.config.pad_token_id))
    sync(dev)
    seconds = time.perf_counter() - t0
    grads = {n: (p.grad.detach().to("cpu", torch.float64) if p.grad is not None else torch.zeros(p.shape, dtype=torch.float64))
             for n, p in model.named_parameters()}
    del model
    return StepRun(f"{dev.type} {dtype}", {"loss": losses[0]}, grads, seconds)


def run_step(policy: Any, groups: Sequence[GroupBatch], device: str, dtype: str, *, ref: Any | None = None,
             micro_batch_tokens: int = TRAINER_MICRO_BATCH_TOKENS, variant: str = "") -> StepRun:
    """One ``TorchGRPOBackend.step`` of a copy of ``policy`` (and of ``ref``) moved to ``device`` in ``dtype``.

    The gradients are read after the step, so they are the clipped ones the optimiser used (both sides
    of a comparison are clipped by their own norms; the metrics carry the norm before clipping). The ``sft``
    variant takes :func:`run_sft_step`."""
    if variant == "sft":
        return run_sft_step(policy, groups, device, dtype)
    if variant == "lora":
        policy = with_lora(policy)
    dev = torch.device(device)
    model = copy.deepcopy(policy).to(device=dev, dtype=DTYPES[dtype])
    ref_model = None if ref is None else copy.deepcopy(ref).to(device=dev, dtype=DTYPES[dtype])
    grpo = GRPOConfig(kl_beta=KL_BETA if ref is not None else 0.0)
    backend = TorchGRPOBackend(model, grpo=grpo, lr=TRAINER_LR, max_grad_norm=TRAINER_MAX_GRAD_NORM,
                               micro_batch_tokens=micro_batch_tokens, ref_model=ref_model, pad_id=int(model.config.pad_token_id),
                               autocast=AUTOCAST.get(dtype))
    sync(dev)
    t0 = time.perf_counter()
    metrics = backend.step(groups)
    sync(dev)
    seconds = time.perf_counter() - t0
    grads = {n: (p.grad.detach().to("cpu", torch.float64) if p.grad is not None else torch.zeros(p.shape, dtype=torch.float64))
             for n, p in model.named_parameters()}
    del backend, model, ref_model
    return StepRun(f"{dev.type} {dtype}", metrics, grads, seconds)


def with_lora(policy: Any, seed: int = 7) -> Any:
    """A copy of ``policy`` with the trainer's LoRA adapters (:func:`trainer.lora.apply_lora`), the same on every call."""
    from trainer.lora import LoraSettings, apply_lora

    torch.manual_seed(seed)
    model = apply_lora(copy.deepcopy(policy), LoraSettings(rank=LORA_RANK))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    return model


COMPARED_METRICS = ("loss", "pg_loss", "kl", "grad_norm", "ratio_mean", "clip_fraction")


def compare(run: StepRun, ref: StepRun) -> dict[str, Any]:
    """``run`` against ``ref``: the loss, the metrics, the global and the worst per-tensor gradient error,
    and whether the loss and every gradient are finite."""
    num = den = 0.0
    worst, worst_name = 0.0, ""
    finite = math.isfinite(run.metrics.get("loss", math.nan))
    for name, g_ref in ref.grads.items():
        g = run.grads[name]
        finite = finite and bool(torch.isfinite(g).all())
        d2, r2 = float((g - g_ref).pow(2).sum()), float(g_ref.pow(2).sum())
        num, den = num + d2, den + r2
        if r2 > 0 and math.sqrt(d2 / r2) > worst:
            worst, worst_name = math.sqrt(d2 / r2), name
    grad_rel = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)
    loss, loss_ref = run.metrics.get("loss", math.nan), ref.metrics.get("loss", math.nan)
    return {"run": run.where, "ref": ref.where, "loss": loss, "loss_ref": loss_ref,
            "loss_err": abs(loss - loss_ref) / max(1.0, abs(loss_ref)), "grad_rel_err": grad_rel,
            "grad_norm_ref": math.sqrt(den), "worst_tensor_rel_err": worst, "worst_tensor": worst_name,
            "metrics": {k: [run.metrics.get(k), ref.metrics.get(k)] for k in COMPARED_METRICS}, "finite": finite}


def within(errors: dict[str, Any], limit: dict[str, float]) -> bool:
    """The gate on one comparison: finite, a non-zero reference gradient, both errors within ``limit``
    (a NaN error fails: no comparison with NaN is true)."""
    return bool(errors["finite"] and errors["grad_norm_ref"] > 0 and errors["loss_err"] <= limit["loss_tol"]
                and errors["grad_rel_err"] <= limit["grad_tol"])


def correctness(groups: Sequence[GroupBatch], config: dict[str, Any], device: str, dtypes: Sequence[str],
                seed: int = 0, log: Callable[[str], None] = print, against_cpu: bool | None = None) -> list[dict[str, Any]]:
    """Part (a): every variant x dtype on ``device`` against the CPU (see the module docstring).

    The exact step is the CPU's in float64. On CUDA a run passes when both its difference from the CPU's step
    in its dtype and its distance from the exact step are within ``max(TOLERANCES, CPU_FACTOR x the CPU
    step's own distance from the exact one)``: bfloat16 steps of thirty layers differ from the exact one by
    several percent on either device. On the CPU (no second implementation to scale by) a run passes when
    its distance from the exact step is within TOLERANCES. ``against_cpu`` forces either way (the CPU test
    takes the CUDA way on the CPU, so that code runs in ``make test`` too)."""
    policy = build_model(config, seed)
    ref_policy = build_model(config, seed + 1)
    log(f"  model of {parameter_count(policy) / 1e6:.1f}M parameters")
    second_cpu_run = torch.device(device).type == "cuda" if against_cpu is None else against_cpu
    rows: list[dict[str, Any]] = []
    for variant in VARIANTS:
        batch = on_policy(groups) if variant == "on_policy_kl" else list(groups)
        ref = ref_policy if variant == "on_policy_kl" else None
        exact = run_step(policy, batch, "cpu", "float64", ref=ref, variant=variant)
        for dtype in dtypes:
            target = run_step(policy, batch, device, dtype, ref=ref, variant=variant)
            row: dict[str, Any] = {"variant": variant, "dtype": dtype, "seconds": target.seconds,
                                   "vs_exact": compare(target, exact)}
            limit = dict(TOLERANCES[dtype])
            passed = True
            if second_cpu_run:
                cpu = run_step(policy, batch, "cpu", dtype, ref=ref, variant=variant)
                row["cpu_vs_exact"] = compare(cpu, exact)
                limit = {"loss_tol": max(limit["loss_tol"], CPU_FACTOR * row["cpu_vs_exact"]["loss_err"]),
                         "grad_tol": max(limit["grad_tol"], CPU_FACTOR * row["cpu_vs_exact"]["grad_rel_err"])}
                row["vs_cpu"] = compare(target, cpu)
                passed = within(row["vs_cpu"], limit)
            row["limit"] = limit
            row["passed"] = passed and within(row["vs_exact"], limit)
            gate = row.get("vs_cpu", row["vs_exact"])
            log(f"  {variant:13s} {target.where:16s} vs {gate['ref']:14s} loss_err {gate['loss_err']:.2e} "
                f"grad_rel_err {gate['grad_rel_err']:.2e}; vs exact {row['vs_exact']['grad_rel_err']:.2e} "
                f"(limit {limit['grad_tol']:.1e}) {'ok' if row['passed'] else 'FAILED'}")
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ timing


def memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def memory_peak(device: torch.device) -> dict[str, float]:
    """Peak memory since :func:`memory_reset`, in GiB (CUDA), or the process's peak RSS (CPU fallback)."""
    if device.type == "cuda":
        return {"peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30}
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"process_peak_rss_gib": rss_kib / 2**20}


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed_steps(backend: Any, groups: Sequence[GroupBatch], steps: int, dev: torch.device) -> tuple[list[float], dict[str, Any]]:
    """One warm-up step (kernels chosen, optimiser state allocated), then ``steps`` timed ones: their seconds, sorted,
    and the last step's metrics."""
    backend.step(groups)
    times, last = [], {}
    for _ in range(steps):
        sync(dev)
        t0 = time.perf_counter()
        last = backend.step(groups)
        sync(dev)
        times.append(time.perf_counter() - t0)
    return sorted(times), last


def time_steps(name: str, config: dict[str, Any], groups: Sequence[GroupBatch], device: str, dtype: str, steps: int,
               micro_batch_tokens: int = TRAINER_MICRO_BATCH_TOKENS, seed: int = 0) -> dict[str, Any]:
    """Part (b) for one model and dtype: one warm-up step, then ``steps`` timed ones (model built on the device)."""
    dev = torch.device(device)
    free(dev)
    model = build_model(config, seed, device).to(DTYPES[dtype])
    free(dev)
    memory_reset(dev)  # the peak from here: the weights, then what training adds to them
    backend = TorchGRPOBackend(model, lr=TRAINER_LR, max_grad_norm=TRAINER_MAX_GRAD_NORM, micro_batch_tokens=micro_batch_tokens,
                               pad_id=int(model.config.pad_token_id), autocast=AUTOCAST.get(dtype))
    times, last = timed_steps(backend, groups, steps, dev)
    median = times[len(times) // 2]
    row = {"model": name, "parameters": parameter_count(model), "dtype": dtype, "device": str(dev),
           "micro_batch_tokens": micro_batch_tokens, "rows": int(last.get("samples", 0)), "tokens_per_step": int(last.get("tokens", 0)),
           "response_tokens_per_step": int(last.get("response_tokens", 0)), "steps_timed": steps,
           "step_s_median": median, "step_s_min": times[0], "step_s_max": times[-1],
           "tokens_per_s": last.get("tokens", 0.0) / median if median > 0 else 0.0,
           "micro_batches": int(last.get("micro_batches", 0)), "loss_finite": math.isfinite(last.get("loss", math.nan)),
           **memory_peak(dev)}
    del backend, model
    free(dev)
    return row


FSDP_PLAN = ((0, False), (0, True), (LORA_RANK, False), (LORA_RANK, True))  # (LoRA rank, activation checkpointing)


def fsdp_section(name: str, config: dict[str, Any], groups: Sequence[GroupBatch], device: str, steps: int,
                 micro_batch_tokens: int, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Part (d): the trainer's step under FSDP2 on one rank (``trainer.distributed.shard``, the backend given its
    ranks, as ``rolloutbus train --nproc-per-node`` runs it), full fine-tuning and LoRA (all-linear), each with and
    without activation checkpointing: step time, tokens/s, peak memory, trainable parameters."""
    import os

    import torch.distributed as dist

    from trainer import distributed
    from trainer.lora import LoraSettings, apply_lora

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    made = not dist.is_initialized()
    if made:
        from rolloutbus.localproc import free_port

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=0, world_size=1)
    rows = []
    try:
        for rank, checkpointing in FSDP_PLAN:
            free(dev)
            model = build_model(config, 0, device)
            if checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if rank:
                model = apply_lora(model, LoraSettings(rank, 16.0, ("all-linear",)))
            distributed.shard(model)
            memory_reset(dev)
            backend = TorchGRPOBackend(model, lr=TRAINER_LR, max_grad_norm=TRAINER_MAX_GRAD_NORM,
                                       micro_batch_tokens=micro_batch_tokens, pad_id=int(config["pad_token_id"]),
                                       autocast=torch.bfloat16 if dev.type == "cuda" else None, ranks=distributed.Ranks(0, 1))
            times, last = timed_steps(backend, groups, steps, dev)
            median = times[len(times) // 2]
            row = {"model": name, "lora_rank": rank, "activation_checkpointing": checkpointing,
                   "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                   "micro_batch_tokens": micro_batch_tokens, "step_s_median": median,
                   "tokens_per_s": last.get("tokens", 0.0) / median if median > 0 else 0.0,
                   "loss_finite": math.isfinite(last.get("loss", math.nan)), **memory_peak(dev)}
            rows.append(row)
            log(f"  {name:13s} lora {rank:2d} checkpointing {'on ' if checkpointing else 'off'} {median:.3f} s/step "
                f"{row['tokens_per_s']:.0f} tok/s peak {row.get('peak_allocated_gib', row.get('process_peak_rss_gib', 0)):.2f} GiB")
            del backend, model
            free(dev)
    finally:
        if made:
            dist.destroy_process_group()
    return rows


def profile_steps(device: str, plan: Sequence[tuple[str, dict[str, Any], str, int]], groups: Sequence[GroupBatch],
                  log: Callable[[str], None], top: int = 14) -> list[dict[str, Any]]:
    """Where a step's time goes: one warm-up step, then one under ``torch.profiler`` per (model, dtype,
    micro-batch) of ``plan``; the busiest operators by device time, and the step's wall time beside the
    device's busy time (a wide gap means the host, not the GPU, bounds the step)."""
    from torch.profiler import ProfilerActivity, profile

    out = []
    dev = torch.device(device)
    for name, cfg, dtype, mbt in plan:
        free(dev)
        model = build_model(cfg, 0, device).to(DTYPES[dtype])
        backend = TorchGRPOBackend(model, lr=TRAINER_LR, max_grad_norm=TRAINER_MAX_GRAD_NORM, micro_batch_tokens=mbt,
                                   pad_id=int(model.config.pad_token_id), autocast=AUTOCAST.get(dtype))
        backend.step(groups)
        sync(dev)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            metrics = backend.step(groups)
            sync(dev)
        wall = time.perf_counter() - t0
        events = prof.key_averages()
        try:
            table = events.table(sort_by="self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total", row_limit=top)
        except (KeyError, AttributeError, ValueError):
            table = events.table(sort_by="self_cuda_time_total", row_limit=top)
        # The table's own footer: summing its rows would count an operator and its kernels twice.
        busy = re.search(r"Self (?:CUDA|CPU) time total: ([0-9.]+)(us|ms|s)", table.split("Self CPU time total")[-1]
                         if dev.type == "cuda" else table)
        busy_s = float(busy.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[busy.group(2)] if busy else math.nan
        row = {"model": name, "dtype": dtype, "micro_batch_tokens": mbt, "wall_s": wall, "device_busy_s": busy_s,
               "build_time_s": metrics.get("build_time_s"), "table": table}
        log(f"  profile {name} {dtype} {mbt}: wall {wall:.3f} s, device busy {busy_s:.3f} s, "
            f"host build/collate {metrics.get('build_time_s', 0):.3f} s\n{table}")
        out.append(row)
        del backend, model, prof
        free(dev)
    return out


# ------------------------------------------------------------------------------------------ verl


def verl_section(groups: Sequence[GroupBatch], device: str) -> dict[str, Any]:
    """Part (c): verl's loss through the registry on ``device`` where verl imports; otherwise why not."""
    try:
        import verl  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure to import is the answer here
        return {"ran": False, "why": f"verl does not import: {type(exc).__name__}: {str(exc)[:200]}",
                "what_did_not_fit": "verl.protocol imports ray at its top; ray-2.60.0-cp312-manylinux2014_x86_64.whl is 79 MB, "
                                    "over the 64 MiB carry limit by itself. The rest would fit: verl-0.9.1 1.7 MB, transformers-5.10.4 "
                                    "11 MB (verl caps transformers <5.11; the image has 5.17), tensordict-0.10.0 0.45 MB, hydra-core, "
                                    "omegaconf, codetiming, dill, torchdata, pylatexenc under 1 MB together; antlr4-python3-runtime "
                                    "4.9.*, which hydra-core 1.3.8 pins, is a source distribution only (a wheel built here)"}
    from trainer.grpo import GRPOConfig, grpo_loss

    g = torch.Generator().manual_seed(0)
    old = (-torch.rand(8, 64, generator=g) * 3).to(device)
    logp0 = old + ((torch.rand(8, 64, generator=g) - 0.5) * 0.6).to(device)
    adv, mask = torch.randn(8, generator=g).to(device), torch.ones_like(old)
    out = {}
    for name in ("ppo-clip", "verl:vanilla"):
        logp = logp0.clone().requires_grad_(True)
        loss, _ = grpo_loss(logp, old, adv, mask, GRPOConfig(policy_loss=name, kl_beta=0.0))
        loss.backward()
        out[name] = (float(loss.detach()), logp.grad)
    diff = float((out["ppo-clip"][1] - out["verl:vanilla"][1]).abs().max())
    return {"ran": True, "device": str(logp0.device), "loss": {k: v[0] for k, v in out.items()}, "grad_max_diff": diff,
            "passed": abs(out["ppo-clip"][0] - out["verl:vanilla"][0]) < 1e-5 and diff < 1e-5}


# ------------------------------------------------------------------------------------------ the run


def environment(device: str) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                           "transformers": transformers.__version__, "device": device, "cpu_threads": torch.get_num_threads(),
                           "attn_implementation": "sdpa"}
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update({"gpu": props.name, "gpu_memory_gib": props.total_memory / 2**30,
                    "tf32_matmul": torch.backends.cuda.matmul.allow_tf32})
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                       timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["commit"] = None
    return env


def markdown(res: dict[str, Any]) -> str:
    def pair(errors: dict[str, Any] | None) -> str:
        return f"{errors['loss_err']:.1e}, {errors['grad_rel_err']:.1e}" if errors else "n/a"

    env = res["environment"]
    lines = [f"# GPU trainer check ({env['device']}{', ' + env['gpu'] if 'gpu' in env else ''})", "",
             f"torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']}, Python {env['python']}, "
             f"commit {env.get('commit')}, {res.get('elapsed_s', 0):.0f} s", "",
             "## (a) one trainer step against the CPU", "",
             "| variant | run | loss | vs the CPU in its dtype (loss, grads) | vs exact (loss, grads) | CPU vs exact (grads) "
             "| limit (loss, grads) | worst tensor vs exact | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res.get("correctness", []):
        e, lim = r["vs_exact"], r["limit"]
        cpu = f"{r['cpu_vs_exact']['grad_rel_err']:.1e}" if "cpu_vs_exact" in r else "n/a"
        lines.append(f"| {r['variant']} | {e['run']} | {e['loss']:.6g} | {pair(r.get('vs_cpu'))} | {pair(e)} | {cpu} | "
                     f"{lim['loss_tol']:.1e}, {lim['grad_tol']:.1e} | {e['worst_tensor_rel_err']:.1e} ({e['worst_tensor']}) | "
                     f"{'pass' if r['passed'] else 'FAIL'} |")
    lines += ["", "Tolerances: " + "; ".join(f"{k}: loss {v['loss_tol']:g}, gradients {v['grad_tol']:g}" for k, v in TOLERANCES.items())
              + f"; on CUDA the limit is the larger of these and {CPU_FACTOR:g} x the CPU step's own distance from the exact "
              "(float64 CPU) step, and both the difference from the CPU's step and the distance from the exact step must be within it.",
              "", "## (b) step time, tokens/s, peak memory", "",
              "| model | params | dtype | rows x tokens | micro-batch tokens | s/step (median) | tokens/s | peak memory GiB |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in res.get("timing", []):
        if "skipped" in t:
            lines.append(f"| {t['model']} | | {t['dtype']} | | {t['micro_batch_tokens']} | skipped: {t['skipped']} | | |")
            continue
        mem = t.get("peak_allocated_gib", t.get("process_peak_rss_gib", 0.0))
        lines.append(f"| {t['model']} | {t['parameters'] / 1e6:.1f}M | {t['dtype']} | {t['rows']} x {t['tokens_per_step'] // max(t['rows'], 1)} | "
                     f"{t['micro_batch_tokens']} | {t['step_s_median']:.3f} | {t['tokens_per_s']:.0f} | {mem:.2f} |")
    verl = res.get("verl", {})
    lines += ["", "## (c) verl", "", (f"ran: {verl.get('data_proto')}; {verl.get('actor_update')}" if verl.get("ran")
                                      else f"not run: {verl.get('why')}. {verl.get('what_did_not_fit', '')}"), ""]
    if res.get("fsdp"):
        lines += ["## (d) FSDP2 on one rank (the trainer's sharding), full and LoRA", "",
                  "| model | LoRA rank | activation checkpointing | trainable | s/step (median) | tokens/s | peak memory GiB |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for f in res["fsdp"]:
            if "skipped" in f:
                lines.append(f"| {f['model']} | | | | skipped: {f['skipped']} | | |")
                continue
            mem = f.get("peak_allocated_gib", f.get("process_peak_rss_gib", 0.0))
            lines.append(f"| {f['model']} | {f['lora_rank'] or 'none'} | {'on' if f['activation_checkpointing'] else 'off'} | "
                         f"{f['trainable'] / 1e6:.2f}M | {f['step_s_median']:.3f} | {f['tokens_per_s']:.0f} | {mem:.2f} |")
        lines.append("")
    return "\n".join(lines)


def write(out: Path | None, res: dict[str, Any]) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "gpu-check.md").write_text(markdown(res))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto",
                    help="cuda, cuda:N, cpu (the reference is then the CPU in float64) or auto (cuda when visible, else cpu --tiny)")
    ap.add_argument("--out", type=Path, default=None, help="folder for gpu-check.json and gpu-check.md")
    ap.add_argument("--tiny", action="store_true", help="two-layer models and small batches (the CPU test)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per row (default 3; --tiny 1)")
    ap.add_argument("--budget-s", type=float, default=360.0,
                    help="timing rows not started after this many seconds are skipped (the 1B float32 row, the longest, "
                         "is estimated at about a minute on an H100: the whole run then ends inside 8 minutes)")
    ap.add_argument("--fixture", type=Path, default=FIXTURE)
    ap.add_argument("--profile", action="store_true",
                    help="only profile one step of each model in bfloat16 and the small one in float32 (where the time goes)")
    ap.add_argument("--record", type=Path, default=None, help="record a new fixture to this file and exit")
    args = ap.parse_args(argv)
    if args.record is not None:
        record_groups(args.record)
        print(f"recorded {len(read_groups(args.record))} GroupBatches to {args.record}")
        return 0
    start = time.monotonic()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        args.tiny = args.tiny or device == "cpu"  # the full sizes on a CPU take hours
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print(f"--device {device}: CUDA is not available here", file=sys.stderr)
        return 2
    dtypes = ("float32", "bfloat16", "bf16-mixed")
    steps = args.steps if args.steps is not None else (1 if args.tiny else 3)
    if args.tiny:
        check_config, sizes = TINY, [("tiny", TINY), ("tiny-wide", TINY_WIDE)]
        shape = {"n_groups": 2, "group_size": 2, "prompt_len": 24, "response_len": 16}
    else:
        check_config, sizes = SMOLLM2_135M, [("smollm2-135m", SMOLLM2_135M), ("smollm2-1b", SMOLLM2_1B)]
        shape = {"n_groups": 8, "group_size": 8, "prompt_len": 512, "response_len": 512}
    res: dict[str, Any] = {"environment": environment(device), "tolerances": TOLERANCES, "timing_batch": shape}
    print(f"gpu check on {device}: {res['environment'].get('gpu', platform.processor() or 'cpu')}", flush=True)

    if args.profile:
        batch = timing_groups(vocab=int(check_config["vocab_size"]), **shape)
        (small, small_cfg), (big, big_cfg) = sizes
        plan = [(small, small_cfg, "bf16-mixed", CPU_MICRO_BATCH_TOKENS), (small, small_cfg, "bf16-mixed", GPU_MICRO_BATCH_TOKENS),
                (big, big_cfg, "bf16-mixed", GPU_MICRO_BATCH_TOKENS)]
        res["profile"] = profile_steps(device, plan, batch, log=lambda s: print(s, flush=True))
        write(args.out, res)
        return 0

    groups = read_groups(args.fixture)
    print(f"(a) {len(groups)} recorded GroupBatches, {sum(len(g.transitions) for g in groups)} transitions", flush=True)
    res["correctness"] = correctness(groups, check_config, device, dtypes, log=lambda s: print(s, flush=True))
    res["elapsed_s"] = time.monotonic() - start
    write(args.out, res)

    print("(b) timing", flush=True)
    batch = timing_groups(vocab=int(check_config["vocab_size"]), **shape)
    res["timing"] = []
    # The trainer's GPU defaults first (bf16-mixed, GPU_MICRO_BATCH_TOKENS), then the CPU's micro-batch in every
    # precision, then float32 with the GPU's: the rows a deployment is sized from, the extra ones first to go when
    # the budget runs out.
    plan = [(name, cfg, "bf16-mixed", GPU_MICRO_BATCH_TOKENS) for name, cfg in sizes]
    plan += [(name, cfg, dtype, CPU_MICRO_BATCH_TOKENS) for name, cfg in sizes for dtype in dtypes]
    plan += [(name, cfg, "float32", GPU_MICRO_BATCH_TOKENS) for name, cfg in sizes]
    for name, cfg, dtype, mbt in plan:
        if time.monotonic() - start > args.budget_s:
            row: dict[str, Any] = {"model": name, "dtype": dtype, "micro_batch_tokens": mbt,
                                   "skipped": f"past the {args.budget_s:.0f} s budget"}
        else:
            try:
                row = time_steps(name, cfg, batch, device, dtype, steps, micro_batch_tokens=mbt)
            except torch.OutOfMemoryError as exc:
                free(torch.device(device))
                row = {"model": name, "dtype": dtype, "micro_batch_tokens": mbt,
                       "skipped": f"out of memory: {str(exc).splitlines()[0][:160]}"}
        res["timing"].append(row)
        print(f"  {name:13s} {dtype:9s} {mbt:6d} " + (
            f"{row['step_s_median']:.3f} s/step {row['tokens_per_s']:.0f} tok/s "
            f"peak {row.get('peak_allocated_gib', row.get('process_peak_rss_gib', 0)):.2f} GiB" if "skipped" not in row
            else row["skipped"]), flush=True)
        res["elapsed_s"] = time.monotonic() - start
        write(args.out, res)

    print("(c) verl", flush=True)
    res["verl"] = verl_section(groups, device)
    res["elapsed_s"] = time.monotonic() - start
    write(args.out, res)

    print("(d) FSDP2 on one rank: full and LoRA, activation checkpointing off and on", flush=True)
    big, big_cfg = sizes[-1]
    try:
        res["fsdp"] = fsdp_section(big, big_cfg, batch, device, steps, GPU_MICRO_BATCH_TOKENS if not args.tiny else CPU_MICRO_BATCH_TOKENS,
                                   log=lambda s: print(s, flush=True))
    except torch.OutOfMemoryError as exc:
        free(torch.device(device))
        res["fsdp"] = [{"model": big, "skipped": f"out of memory: {str(exc).splitlines()[0][:160]}"}]
    res["elapsed_s"] = time.monotonic() - start
    res["passed"] = all(r["passed"] for r in res["correctness"]) and res["verl"].get("passed", True) and all(
        t.get("loss_finite", True) for t in [*res["timing"], *res["fsdp"]])
    write(args.out, res)
    print(markdown(res))
    print("PASSED" if res["passed"] else "FAILED", flush=True)
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
