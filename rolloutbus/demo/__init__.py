"""``rolloutbus demo``: watch an agent learn, end to end, through the real Kafka and ClickHouse engine.

Heavy imports (torch, confluent-kafka) happen inside :func:`run`, so ``rolloutbus --help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from foundation.flags import Bounded, describe_flags
from producers.settings import feeder_choices

# the feeder's flags: producers.settings.FeederSettings declares them (defaults, bounds, variables)
FEEDER_FLAGS = {"task_selection": "--task-selection", "selection_k": "--selection-k", "selection_explore": "--selection-explore",
                "pace": "--pace"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rolloutbus.demo.config import profile_help as d  # each default as DemoConfig and its PROFILES apply it
    from rolloutbus.demo.config import production_help as pd

    p.add_argument("--minutes", type=Bounded(float, gt=0), default=None, help=f"minutes of training ({d('minutes')})")
    p.add_argument("--max-steps", type=Bounded(int, ge=0), default=None,
                   help="stop training after this many optimiser steps, or when --minutes are up if that comes first "
                        f"({d('max_steps')}: the minutes alone); a step budget makes a run depend less on the machine's speed")
    p.add_argument("--group-size", type=Bounded(int, ge=2), default=None,
                   help="rollouts per task, one GRPO group; at least 2, GRPO compares rollouts within a group "
                        f"({d('group_size')})")
    p.add_argument("--runners", type=Bounded(int, ge=1), default=None, help=f"rollouts run at once ({d('runners')})")
    p.add_argument("--groups-per-step", type=Bounded(int, ge=1), default=None, help=f"GRPO groups per trainer step ({d('groups_per_step')}); with --production the judged rollouts per step "
                   f"({pd('groups_per_step')})")
    p.add_argument("--held-out", type=Bounded(int, ge=1), default=None, help="held-out problems evaluated at the end, of the calculator's 486 problems or the SQL task's questions "
                   f"({d('held_out')})")
    p.add_argument("--lr", type=Bounded(float, gt=0), default=None, help=f"trainer learning rate ({d('lr')})")
    p.add_argument("--kl-beta", type=Bounded(float, ge=0), default=None, help=f"KL-to-warm-up weight that keeps the policy from collapsing ({d('kl_beta')})")
    p.add_argument("--sft-epochs", type=Bounded(int, ge=1), default=None, help=f"calc: epochs of supervised warm-up ({d('sft_epochs')})")
    p.add_argument("--task", choices=["calc", "sql"], default="calc",
                   help="calc: the tiny model learns a calculator agent (fast); sql: SmolLM2-135M-Instruct learns Text-to-SQL")
    p.add_argument("--model", type=_model_source, default=None, help=f"--task sql: the model to import and train ({d('model')}; "
                   "a .gguf or HF directory works too)")
    p.add_argument("--train-layers", type=Bounded(int, ge=0), default=None, help=f"--task sql: top decoder layers trained ({d('train_layers')}; 0 = all)")
    p.add_argument("--temperature", type=Bounded(float, gt=0), default=None, help=f"--task sql: sampling temperature of training rollouts ({d('temperature')})")
    p.add_argument("--engine", choices=["torch", "vllm"], default=None, help="--task sql: the policy server's engine: vllm (vLLM's CPU "
                   "build, installed once by `make vllm`; the default where it is installed, but for --algorithm apo) "
                   "or torch (rolloutbus serve's own; the default elsewhere)")
    p.add_argument("--single-turn", action="store_true", help="--task sql: one SQL answer per question, no rewrite after an error "
                   "(the form TRL's GRPOTrainer runs in the learning bench)")
    p.add_argument("--validation", type=Bounded(int, ge=0), default=None, help="--task sql: validation questions scored greedily "
                   f"for each version by the runners; the winner is evaluated ({d('validation')}; 0: none, the last version)")
    p.add_argument("--validate-every", type=Bounded(int, ge=1), default=None, help=f"--task sql: validate every Nth version ({d('validate_every')})")
    p.add_argument("--train-questions", type=Bounded(int, ge=0), default=None, metavar="N",
                   help="--task sql: train on N of the training questions (levels and databases in proportion; the same "
                        "N for the same --seed; with --production the traffic asks them), so each comes round more often "
                        f"in a short run, as in a second epoch ({d('train_questions')}: all)")
    from rolloutbus.demo.sql import REWARDS

    p.add_argument("--sql-reward", choices=list(REWARDS), default=None,
                   help=f"--task sql: the training rollouts' reward ({d('sql_reward')}): "
                        + "; ".join(f"{k}: {v}" for k, v in REWARDS.items())
                        + ". Validation and held-out questions are scored by execution match either way")
    p.add_argument("--early-stop-patience", type=Bounded(int, ge=0), default=None,
                   help=f"--task sql: the trainer stops after N validated versions without a better score ({d('early_stop_patience')}: never)")
    p.add_argument("--algorithm", choices=["grpo", "apo"], default="grpo",
                   help="--task sql: grpo trains the weights; apo optimizes the agent's prompt (critiques and rewrites by the served model)")
    p.add_argument("--val-size", type=Bounded(int, ge=2), default=None, help=f"--algorithm apo: validation questions per candidate ({d('val_size')})")
    p.add_argument("--apo-rounds", type=Bounded(int, ge=0), default=None, help=f"--algorithm apo: rounds of the beam search ({d('apo_rounds')})")
    p.add_argument("--apo-beam", type=Bounded(int, ge=1), default=None, help=f"--algorithm apo: beam width ({d('apo_beam')})")
    p.add_argument("--apo-branch", type=Bounded(int, ge=1), default=None, help=f"--algorithm apo: candidates per beam member per round ({d('apo_branch')})")
    p.add_argument("--production", action="store_true", help="requests with no task id, as a deployed agent serves them; a "
                   "simulated user sends feedback later for a fraction of them, and the worker trains each judged rollout once "
                   "with a running leave-one-out baseline (rolloutbus/demo/production.py)")
    p.add_argument("--request-rate", dest="rate", metavar="R", type=Bounded(float, ge=0), default=None,
                   help=f"--production: requests a second, at most ({pd('rate')}; 0: as fast as the agents answer)")
    p.add_argument("--feedback-fraction", dest="feedback_fraction", metavar="F", type=Bounded(float, gt=0, le=1), default=None,
                   help=f"--production: the share of answers the user judges ({pd('feedback_fraction')})")
    p.add_argument("--feedback-delay-min", dest="delay_min_s", metavar="S", type=Bounded(float, gt=0), default=None,
                   help=f"--production: the shortest delay of the user's feedback, seconds ({pd('delay_min_s')})")
    p.add_argument("--feedback-delay-max", dest="delay_max_s", metavar="S", type=Bounded(float, gt=0), default=None,
                   help=f"--production: the longest delay, seconds; delays are log-uniform in between ({pd('delay_max_s')})")
    p.add_argument("--feedback-window", dest="window_s", metavar="S", type=Bounded(float, gt=0), default=None,
                   help=f"--production: the stream worker's window for late feedback, seconds ({pd('window_s')})")
    from streams.baselines import FEEDBACK_BASELINES

    p.add_argument("--feedback-baseline", dest="baseline", choices=FEEDBACK_BASELINES.names(), default=None,
                   help="--production: the worker's baseline: loo (default: the agent's running leave-one-out mean), prompt "
                   "(the same request's earlier feedback) or none")
    p.add_argument("--sft-first", dest="sft_first", action="store_true", default=None,
                   help="--production: serve the warm-up untrained for 40%% of the minutes, fine-tune on the positively judged "
                   "rollouts (rolloutbus train --algorithm sft, the best one per prompt), then train on the feedback from there")
    from streams.credit import CREDIT
    from streams.grouping import ESTIMATORS
    from trainer.policy_losses import POLICY_LOSSES

    p.add_argument("--credit", choices=CREDIT.names(), default=None,
                   help="how a rollout's rewards become each step's return: identical (every turn its rollout's total), "
                        "discounted (the rewards from the turn on, by --gamma) or per-turn; the stream worker's default, which "
                        "the SQL task's measurement kept (docs/training.md)")
    p.add_argument("--gamma", type=Bounded(float, ge=0, le=1), default=None, help="discount of --credit discounted")
    p.add_argument("--reward-rules", type=Path, default=None, metavar="FILE",
                   help="TOML/JSON weights of the intermediate reward rules (default: every automatic rule off, "
                        "the agent's own mid-run rewards kept; deploy/rewards/air.toml: the former defaults)")
    p.add_argument("--advantage-estimator", choices=ESTIMATORS.names(), default=None, help="how a group's step returns become advantages")
    p.add_argument("--policy-loss", choices=POLICY_LOSSES.names(), default=None, help="the trainer's policy term")
    from foundation.config import choices_of, setting_bounds
    from trainer.settings import TrainerSettings

    p.add_argument("--backlog", choices=choices_of(TrainerSettings, "backlog"), default=None,
                   help="which groups a trainer step takes when more wait than it trains on: oldest (in order), newest "
                        "(the newest versions'; the rest skipped) or sample (a uniform draw; the rest skipped)")
    p.add_argument("--updates-per-batch", type=Bounded(int, **setting_bounds(TrainerSettings, "updates_per_batch")), default=None, metavar="N",
                   help="the trainer's optimiser updates on each batch (GRPO's mu, verl's ppo_epochs), each clipped against "
                        "the log-probs the batch was sampled with; one version per batch")
    p.add_argument("--mini-batches", type=Bounded(int, **setting_bounds(TrainerSettings, "mini_batches")), default=None, metavar="K",
                   help="the trainer's optimiser steps on each pass over a batch, each on its own groups (verl's "
                        "train_batch_size / ppo_mini_batch_size; at most --groups-per-step); one version per batch")
    p.add_argument("--serve-lag", type=Bounded(int, ge=0, le=16), default=None, metavar="N",
                   help="serve the version N behind the newest, so every batch is at least N versions old: the staleness "
                        "bench's knob for --policy-loss decoupled against ppo-clip (the trainer's --max-staleness becomes N + 2; "
                        "default 0)")
    p.add_argument("--nproc-per-node", type=Bounded(int, ge=1, le=64), default=None,
                   help="the trainer's ranks (FSDP2 under torchrun, gloo on the CPU; default 1)")
    p.add_argument("--lora-rank", type=Bounded(int, **setting_bounds(TrainerSettings, "lora_rank")), default=None, metavar="R",
                   help="train LoRA adapters of rank R on the base frozen (the trainer's --lora-rank; every layer, so the "
                        "task's --train-layers is dropped), served by their adapters alone (rank up to 512; default 0: no LoRA)")
    # their defaults and variables from the models that declare them (the demo reads the variables too: DemoConfig)
    describe_flags(p, "streams.settings:StreamSettings", ["credit", "gamma", "advantage_estimator"])
    describe_flags(p, "trainer.settings:TrainerSettings", ["policy_loss", "backlog", "updates_per_batch", "mini_batches"])
    p.add_argument("--task-selection", choices=feeder_choices("task_selection"), default=None,
                   help="which problems get groups: all, in turn, or pass-rate: a problem whose last --selection-k "
                        "rollouts (in ClickHouse) all earned the same reward, always solved or never, is passed over but for "
                        "--selection-explore of the times it comes round; one with fewer rollouts of its own is taken with the chance "
                        "that a group of its family (the SQL question's level, the calculator's keywords) teaches")
    p.add_argument("--selection-k", type=int, default=None, help="--task-selection pass-rate: rollouts looked at")
    p.add_argument("--selection-explore", type=float, default=None,
                   help="--task-selection pass-rate: the chance a passed-over problem is taken all the same")
    p.add_argument("--pace", choices=feeder_choices("pace"), default=None,
                   help="what the task feeder keeps a few groups ahead of: generation (the runners never wait), or "
                        "the trainer (the groups that teach and wait for it count too: the runners wait while it catches up)")
    describe_flags(p, "producers.settings:FeederSettings", list(FEEDER_FLAGS))
    p.add_argument("--seed", type=Bounded(int, ge=0), default=0, help="seed of the model, the problems and sampling")
    p.add_argument("--out", default="demo-output", help="where the reward curve and the logs go (default demo-output)")
    p.add_argument("--quick", action="store_true", help="a smoke run of under 2 minutes (used by the tests)")
    p.add_argument("--keep-running", action="store_true", help="leave the broker running at the end")
    p.add_argument("--no-dashboard", action="store_true", help="do not serve the live dashboard during the run "
                   "(default: on http://127.0.0.1:8050, or a free port when that one is taken)")


def _model_source(text: str) -> str:
    from pathlib import Path

    from trainer.model_import import PACKAGED

    if text in PACKAGED or Path(text).expanduser().exists():
        return text
    raise argparse.ArgumentTypeError(f"{text!r} must be {', '.join(PACKAGED)}, a .gguf file or a model directory")


def run(args: argparse.Namespace) -> int:
    from rolloutbus.demo.driver import DemoConfig, run_demo
    from rolloutbus.localproc import stop_on_sigterm

    stop_on_sigterm()
    cfg = DemoConfig.from_args(args)
    if cfg.algorithm == "apo":
        from rolloutbus.demo.apo import run_apo_demo

        return run_apo_demo(cfg)
    return run_demo(cfg)

