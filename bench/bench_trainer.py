"""Trainer benchmark: GRPO step time, tokens/s, peak RSS, and the data path's share of a step.

The data path is what the trainer does per step besides the maths: decode the GroupBatch bytes from
rb.batches and build the padded tensors. Target: <= 5% of a step for the demo model on CPU.

    .venv/bin/python -m bench.bench_trainer [--groups 8] [--group-size 4] [--steps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

import torch

from schemas.codec import decode, encode
from trainer.grpo import GRPOConfig
from trainer.model import build_tiny
from trainer.synthetic import sample_groups
from trainer.torch_backend import TorchGRPOBackend


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model, tok = build_tiny(seed=0)
    groups = sample_groups(model, tok, args.groups, args.group_size, args.max_new_tokens, seed=0)
    wire = [encode(g) for g in groups]
    backend = TorchGRPOBackend(model, grpo=GRPOConfig(), lr=1e-4, micro_batch_tokens=args.micro_batch_tokens, pad_id=tok.pad_id)
    backend.step([decode(b) for b in wire])  # warm-up (allocator, first-call overheads)

    step_s, data_s, tok_s = [], [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        decoded = [decode(b) for b in wire]
        t1 = time.perf_counter()
        m = backend.step(decoded)  # type: ignore[arg-type]
        s = time.perf_counter() - t1
        d = (t1 - t0) + m["build_time_s"]  # decode + rows + padded tensors (timed inside the step)
        s = s + (t1 - t0)
        data_s.append(d)
        step_s.append(s)
        tok_s.append(m["tokens"] / s)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n_tok = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for g in groups for t in g.transitions)
    rows = [
        ("groups x rollouts", f"{args.groups} x {args.group_size}"),
        ("tokens per step", f"{n_tok}"),
        ("bytes on the wire", f"{sum(len(b) for b in wire)}"),
        ("torch threads", f"{args.threads}"),
        ("step time (median)", f"{statistics.median(step_s) * 1000:.0f} ms"),
        ("tokens/s", f"{statistics.median(tok_s):.0f}"),
        ("data path (decode + tensors)", f"{statistics.median(data_s) * 1000:.1f} ms"),
        ("data path share of a step", f"{100 * statistics.median(d / s for d, s in zip(data_s, step_s)):.2f} %"),
        ("peak RSS", f"{rss_mb:.0f} MiB"),
    ]
    width = max(len(k) for k, _ in rows)
    print("trainer benchmark (tiny policy, CPU)")
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
