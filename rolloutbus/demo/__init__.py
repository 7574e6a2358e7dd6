"""``rolloutbus demo``: watch an agent learn, end to end, through the real Kafka and ClickHouse engine.

Heavy imports (torch, confluent-kafka) happen inside :func:`run`, so ``rolloutbus --help`` stays fast.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=None, help="minutes of training (default 6; --quick: 0.6)")
    p.add_argument("--group-size", type=int, default=None, help="rollouts per task, one GRPO group (default 8)")
    p.add_argument("--runners", type=int, default=None, help="rollouts run at once (default 16)")
    p.add_argument("--groups-per-step", type=int, default=None, help="GRPO groups per trainer step (default 8)")
    p.add_argument("--held-out", type=int, default=None, help="held-out problems evaluated at the end (default 150 of the 486 problems)")
    p.add_argument("--lr", type=float, default=None, help="trainer learning rate (default 5e-4)")
    p.add_argument("--kl-beta", type=float, default=None, help="KL-to-warm-up weight that keeps the policy from collapsing (default 0.05)")
    p.add_argument("--sft-epochs", type=int, default=None, help="epochs of supervised warm-up (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, the problems and sampling")
    p.add_argument("--out", default="demo-output", help="where the reward curve and the logs go (default demo-output)")
    p.add_argument("--quick", action="store_true", help="a smoke run of under 2 minutes (used by the tests)")
    p.add_argument("--keep-running", action="store_true", help="leave the broker running at the end")


def run(args: argparse.Namespace) -> int:
    from rolloutbus.demo.run import DemoConfig, run_demo

    return run_demo(DemoConfig.from_args(args))
