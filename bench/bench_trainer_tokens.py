"""The trainer's tokens per CPU-second: each row run whole against a group's shared prompt computed once.

One GRPO step (forward, backward, AdamW) on synthetic groups of ``--group-size`` rollouts that share a prompt of
``--prompt-tokens`` tokens, each with its own ``--response-tokens``; the two ways alternate, ``--steps`` steps each,
after one warm-up step each. CPU seconds are the process's (every thread), so the figure is what the machine pays.
Tokens are the batch's (prompt + response of every row), the same for both.

    .venv/bin/python -m bench.bench_trainer_tokens [--model tiny|PATH] [--prompt-tokens 256] [--response-tokens 32]
        [--groups 4] [--group-size 4] [--train-layers 0] [--kl-beta 0.02] [--steps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

from trainer.grpo import GRPOConfig
from trainer.model import build_tiny, load_policy, train_top_layers
from trainer.synthetic import prompt_groups
from trainer.torch_backend import TorchGRPOBackend


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny (the calculator's model) or a model directory")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--response-tokens", type=int, default=32)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--train-layers", type=int, default=0)
    ap.add_argument("--kl-beta", type=float, default=0.02)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    base, tok = build_tiny(seed=0) if args.model == "tiny" else load_policy(args.model)
    groups = prompt_groups(base.config.vocab_size, args.groups, args.group_size, args.prompt_tokens, args.response_tokens)
    backends = {}
    for share in (False, True):
        model = copy.deepcopy(base)
        train_top_layers(model, args.train_layers)
        ref = copy.deepcopy(base) if args.kl_beta > 0 else None
        backends[share] = TorchGRPOBackend(model, grpo=GRPOConfig(kl_beta=args.kl_beta), lr=1e-5, micro_batch_tokens=args.micro_batch_tokens,
                                           ref_model=ref, pad_id=tok.pad_id, share_prefix=share)
        backends[share].step(groups)  # warm-up
    cpu: dict[bool, list[float]] = {False: [], True: []}
    tokens, computed = {}, {}
    for _ in range(args.steps):
        for share in (False, True):
            c0 = time.process_time()
            m = backends[share].step(groups)
            cpu[share].append(time.process_time() - c0)
            tokens[share], computed[share] = m["tokens"], m["tokens_computed"]
    print(f"trainer tokens per CPU-second ({args.model}, {args.groups} groups x {args.group_size}, prompt {args.prompt_tokens}, "
          f"response ~{args.response_tokens}, train_layers {args.train_layers}, kl_beta {args.kl_beta}, {args.threads} threads, "
          f"{args.steps} steps each, alternately)")
    rate = {}
    for share in (False, True):
        rate[share] = tokens[share] / statistics.median(cpu[share])
        print(f"  {'shared prompt' if share else 'whole rows   '}  tokens {tokens[share]:.0f}  positions run {computed[share]:.0f}  "
              f"CPU-s per step {statistics.median(cpu[share]):.2f} ({', '.join(f'{c:.2f}' for c in cpu[share])})  "
              f"tokens per CPU-s {rate[share]:.0f}")
    print(f"  ratio {rate[True] / rate[False]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
