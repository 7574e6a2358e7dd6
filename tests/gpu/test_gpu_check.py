"""The GPU trainer check's CPU mode (issue 49), so the script that runs on a GPU machine cannot rot here.

``gpu_check.py --device cpu --tiny`` runs the same code as the GPU run (the trainer's step, the comparison
with its tolerances, the timing and memory code with its CPU fallback, the verl section), the reference
being the CPU in float64; the gate itself is shown to fail on a step that is not the same step.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", HERE / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gc = _load()


def test_cpu_mode_runs_the_whole_check_as_the_gpu_run_does(tmp_path: Path) -> None:
    """The command line of the GPU run, on the CPU: every part ran, wrote its results, and passed."""
    proc = subprocess.run([sys.executable, str(HERE / "gpu_check.py"), "--device", "cpu", "--tiny", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "gpu-check.json").read_text())
    assert res["passed"] is True
    rows = res["correctness"]
    assert {(r["variant"], r["vs_exact"]["run"]) for r in rows} == {(v, f"cpu {d}") for v in gc.VARIANTS
                                                                    for d in ("float32", "bfloat16", "bf16-mixed")}
    for r in rows:
        e = r["vs_exact"]
        assert r["passed"] and e["ref"] == "cpu float64" and e["finite"] and "vs_cpu" not in r, r
        assert r["limit"] == gc.TOLERANCES[r["dtype"]] and e["grad_norm_ref"] > 0 and e["grad_rel_err"] <= r["limit"]["grad_tol"]
    # The on-policy variant trains every response token: its float32 gradients are float64's to rounding.
    assert next(r for r in rows if r["variant"] == "on_policy_kl" and r["dtype"] == "float32")["vs_exact"]["grad_rel_err"] < 1e-4
    # SFT's step (rolloutbus train --algorithm sft) is gated the same way: its loss is the response tokens' NLL.
    sft = next(r for r in rows if r["variant"] == "sft" and r["dtype"] == "float32")["vs_exact"]
    assert sft["grad_rel_err"] < 1e-4 and sft["loss_ref"] > 1.0
    # LoRA's step (rolloutbus train --lora-rank 8): the adapters' gradients, float32 to float64's rounding.
    assert next(r for r in rows if r["variant"] == "lora" and r["dtype"] == "float32")["vs_exact"]["grad_rel_err"] < 1e-4
    timing = res["timing"]
    assert [(t["model"], t["dtype"], t["micro_batch_tokens"]) for t in timing] == [
        ("tiny", "bf16-mixed", 16384), ("tiny-wide", "bf16-mixed", 16384),
        *((m, d, 4096) for m in ("tiny", "tiny-wide") for d in ("float32", "bfloat16", "bf16-mixed")),
        ("tiny", "float32", 16384), ("tiny-wide", "float32", 16384)]
    for t in timing:
        assert t["tokens_per_s"] > 0 and t["step_s_median"] > 0 and t["process_peak_rss_gib"] > 0 and t["loss_finite"], t
        assert t["rows"] == 4 and t["tokens_per_step"] == 4 * 40
    verl = res["verl"]
    if importlib.util.find_spec("verl") is None:
        assert verl["ran"] is False and "ray" in verl["what_did_not_fit"]
    else:
        assert verl["passed"], verl
    # (d) the trainer's FSDP2 step on one rank (gloo here, NCCL on a GPU): full and LoRA, checkpointing off and on
    fsdp = res["fsdp"]
    assert [(f["lora_rank"], f["activation_checkpointing"]) for f in fsdp] == list(gc.FSDP_PLAN)
    assert all(f["model"] == "tiny-wide" and f["loss_finite"] and f["step_s_median"] > 0 for f in fsdp), fsdp
    full, lora = fsdp[0]["trainable"], fsdp[2]["trainable"]
    assert 0 < lora < full / 5 and fsdp[1]["trainable"] == full and fsdp[3]["trainable"] == lora
    md = (tmp_path / "gpu-check.md").read_text()
    assert "| on_policy_kl | cpu bfloat16 |" in md and "| tiny-wide |" in md and "PASSED" in proc.stdout
    assert "## (d) FSDP2 on one rank" in md and "| tiny-wide | 8 | on |" in md


def test_the_gate_fails_a_step_that_is_not_the_same_step() -> None:
    """Another model's step, or a NaN gradient, fails the float32 gate; the same step passes it."""
    groups = gc.on_policy(gc.read_groups(gc.FIXTURE))[:2]
    policy, other = gc.build_model(gc.TINY, seed=0), gc.build_model(gc.TINY, seed=5)
    a = gc.run_step(policy, groups, "cpu", "float32")
    again = gc.run_step(policy, groups, "cpu", "float32")
    b = gc.run_step(other, groups, "cpu", "float32")
    tol = gc.TOLERANCES["float32"]
    same = gc.compare(again, a)
    assert gc.within(same, tol) and same["grad_rel_err"] == 0.0 and same["loss_err"] == 0.0
    wrong = gc.compare(b, a)
    assert not gc.within(wrong, tol) and wrong["grad_rel_err"] > 0.5
    name = next(iter(a.grads))
    poisoned = gc.StepRun(a.where, dict(a.metrics), {**a.grads, name: torch.full_like(a.grads[name], math.nan)}, a.seconds)
    assert not gc.within(gc.compare(poisoned, a), tol)
    assert not gc.within(gc.compare(gc.StepRun(a.where, {**a.metrics, "loss": math.inf}, a.grads, a.seconds), a), tol)


def test_the_cuda_way_of_the_gate_runs_here() -> None:
    """The second CPU run, the scaled limit and its table, taken on the CPU (the target then is the CPU too)."""
    groups = gc.read_groups(gc.FIXTURE)[:2]
    rows = gc.correctness(groups, gc.TINY, "cpu", ("bfloat16",), log=lambda s: None, against_cpu=True)
    assert [r["variant"] for r in rows] == list(gc.VARIANTS)
    for r in rows:
        assert r["passed"] and r["vs_cpu"]["grad_rel_err"] == 0.0 and r["vs_cpu"]["ref"] == "cpu bfloat16"
        assert r["limit"]["grad_tol"] == max(gc.TOLERANCES["bfloat16"]["grad_tol"], gc.CPU_FACTOR * r["cpu_vs_exact"]["grad_rel_err"])
    skipped = {"model": "smollm2-1b", "dtype": "float32", "micro_batch_tokens": 16384, "skipped": "past the 360 s budget"}
    md = gc.markdown({"environment": gc.environment("cpu"), "correctness": rows, "timing": [skipped],
                      "verl": {"ran": False, "why": "verl does not import", "what_did_not_fit": "ray"}})
    assert md.count("| pass |") == len(gc.VARIANTS) and "n/a" not in md.split("## (b)")[0]
    assert "| smollm2-1b | | float32 | | 16384 | skipped: past the 360 s budget |" in md and "not run: verl does not import" in md


def test_the_fixture_holds_recorded_groups_the_models_can_read() -> None:
    groups = gc.read_groups(gc.FIXTURE)
    assert len(groups) >= 4
    ts = [t for g in groups for t in g.transitions]
    assert all(len(t.response_logprobs) == len(t.response_token_ids) > 0 for t in ts)
    assert max(max(t.prompt_token_ids + t.response_token_ids) for t in ts) < gc.TINY["vocab_size"] < gc.SMOLLM2_135M["vocab_size"]
    assert any(t.advantage > 0 for t in ts) and any(t.advantage < 0 for t in ts)


def test_the_check_steps_with_the_trainers_defaults() -> None:
    from trainer.settings import TrainerSettings

    from trainer.device import micro_batch_tokens

    fields = TrainerSettings.model_fields
    assert (gc.TRAINER_LR, gc.TRAINER_MAX_GRAD_NORM) == (fields["lr"].default, fields["max_grad_norm"].default)
    assert gc.TRAINER_MICRO_BATCH_TOKENS == micro_batch_tokens(fields["micro_batch_tokens"].default, torch.device("cpu"))


@pytest.mark.parametrize("name, params", [("SMOLLM2_135M", 134_515_008), ("SMOLLM2_1B", 1_040_246_784)])
def test_the_model_configs_have_the_sizes_they_claim(name: str, params: int) -> None:
    """Counted from the config (no weights built): SmolLM2-135M's 134.5M, and the ~1B row's."""
    c = getattr(gc, name)
    h, i, L, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h
    assert v * h + L * per_layer + h == params


def test_the_lora_variant_trains_the_adapters_alone_and_the_same_ones_each_time() -> None:
    policy = gc.build_model(gc.TINY, 0)
    a, b = gc.with_lora(policy), gc.with_lora(policy)
    trainable = {n for n, p in a.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
