"""Peak memory per trainer rank, for planning: full fine-tuning and LoRA, with and without activation checkpointing,
on one and two ranks (FSDP2 over gloo on this CPU), at SmolLM2-135M's shape and at a 1B shape.

``python -m bench.bench_trainer_memory``: each setting is a fresh set of processes (``torch.multiprocessing``,
one per rank) that builds the model at that shape (random weights: memory depends on the shape only), shards it
on two ranks, and makes two optimiser steps of the one-device step's code (``TorchGRPOBackend.step``) on a batch
of ``--samples`` sequences of ``--tokens`` tokens; each rank reports its peak resident memory (``VmHWM``), which
includes the model as built before sharding. Writes ``bench/results/trainer-memory-<date>.json`` and prints the
table (``--render FILE``: an earlier run's).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT

SHAPES: dict[str, dict[str, int]] = {
    # SmolLM2-135M-Instruct's config (hidden 576, 30 layers, 9 heads / 3 KV heads, vocab 49152)
    "135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
             "num_key_value_heads": 3, "vocab_size": 49152},
    # a 1.04B Llama shape (the GPU check's large shape)
    "1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 4, "vocab_size": 49152},
}


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _groups(samples: int, tokens: int, vocab: int) -> list[Any]:
    import random

    from schemas.models import GroupBatch, Transition

    rng = random.Random(0)
    half = tokens // 2
    transitions = [Transition(rollout_id=f"r{i}", attempt_id=f"a{i}", task_id="t", span_id=f"s{i}", turn=0,
                              prompt_token_ids=[rng.randrange(vocab) for _ in range(half)],
                              response_token_ids=[rng.randrange(vocab) for _ in range(tokens - half)],
                              response_logprobs=[-1.0] * (tokens - half), advantage=1.0 if i % 2 else -1.0)
                   for i in range(samples)]
    return [GroupBatch(group_id="g", task_id="t", created_ns=0, group_size=samples, rollout_ids=[t.rollout_id for t in transitions],
                       rewards=[float(i % 2) for i in range(samples)], advantages=[t.advantage for t in transitions],
                       transitions=transitions)]


def _rank(rank: int, world: int, init: str, out: str, shape: str, lora: bool, ac: bool, samples: int, tokens: int) -> None:
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer import distributed
    from trainer.grpo import GRPOConfig
    from trainer.lora import LoraSettings, apply_lora
    from trainer.torch_backend import TorchGRPOBackend

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    if world > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPES[shape], max_position_embeddings=2048, tie_word_embeddings=True))
    if ac:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        model = apply_lora(model, LoraSettings(rank=16))
    ranks = distributed.Ranks(rank, world) if world > 1 else None
    if ranks is not None:
        distributed.shard(model)
    backend = TorchGRPOBackend(model, grpo=GRPOConfig(), lr=1e-5, micro_batch_tokens=samples * tokens, ranks=ranks)
    groups = _groups(samples, tokens, SHAPES[shape]["vocab_size"])
    t0 = time.perf_counter()
    for _ in range(2):
        backend.step(groups)
    step_s = (time.perf_counter() - t0) / 2
    Path(f"{out}.{rank}").write_text(json.dumps({"peak_mib": _peak_mib(), "step_s": step_s,
                                                 "trained": sum(p.numel() for p in model.parameters() if p.requires_grad)}))
    if world > 1:
        dist.destroy_process_group()


def measure(shape: str, ranks: int, lora: bool, ac: bool, samples: int, tokens: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank")
        mp.start_processes(_rank, args=(ranks, f"file://{tmp}/store", out, shape, lora, ac, samples, tokens), nprocs=ranks,
                           start_method="spawn")
        per = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(ranks)]
    return {"shape": shape, "ranks": ranks, "lora": lora, "activation_checkpointing": ac, "samples": samples, "tokens": tokens,
            "peak_mib_per_rank": [round(p["peak_mib"]) for p in per], "step_s": round(max(p["step_s"] for p in per), 2),
            "trained_parameters": per[0]["trained"]}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| shape | ranks | training | activation checkpointing | batch | peak memory per rank, MiB | step, s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['ranks']} | {'LoRA r=16' if r['lora'] else 'full'} | {'on' if r['activation_checkpointing'] else 'off'} "
                     f"| {r['samples']} x {r['tokens']} | {', '.join(str(m) for m in r['peak_mib_per_rank'])} | {r['step_s']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="135m,1b")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--render", type=Path)
    args = p.parse_args(argv)
    if args.render:
        print(table(json.loads(args.render.read_text())["rows"]))
        return 0
    started = _dt.datetime.now().replace(microsecond=0)
    path = args.out / f"trainer-memory-{started.date().isoformat()}.json"
    rows: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        # The 1B shape: LoRA only, a small batch (full fine-tuning's 17 GB of weights, gradients and AdamW state on one
        # rank does not fit beside the rest on this 24 GiB machine; a step of 2 x 128 tokens takes ~30 s on 2 cores).
        samples, tokens = (args.samples, args.tokens) if shape != "1b" else (2, 128)
        for ranks in (1, 2):
            for lora in ((False, True) if shape != "1b" else (True,)):
                for ac in (False, True):
                    r = measure(shape, ranks, lora, ac, samples, tokens)
                    rows.append(r)
                    print(table([r]).splitlines()[-1], flush=True)
                    path.write_text(json.dumps({"started": started.isoformat(), "machine": f"{platform.node()} ({os.cpu_count()} cores)",
                                                "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    print(table(rows))
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
