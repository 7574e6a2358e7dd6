"""The demo's configuration: :class:`DemoConfig` (``rolloutbus demo``'s flags) and :class:`ProductionConfig` (its
``--production`` flags), each with its table of defaults by task and mode (:mod:`rolloutbus.demo.profiles`). Light on
imports: ``rolloutbus --help`` writes the demo's help from here without loading the demo's machinery."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation.config import default_of, load_settings
from foundation.errors import ConfigError
from producers.settings import FeederSettings, feeder_default
from rolloutbus.demo import profiles
from streams.settings import StreamSettings
from trainer.settings import ApoSettings, TrainerSettings


# The demo's defaults by task and mode (rolloutbus.demo.profiles): DemoConfig's field defaults are the calculator's full
# run; each profile whose condition holds overrides them, in order, before the flags; `--help` is written from this table.
PROFILES: tuple[profiles.Profile, ...] = (
    # a 135M-parameter model on 2 cores: small groups, two per step (a step as soon as two groups teach, so later
    # rollouts come from the better policy), the top layers trained
    ("--task sql", {"task": "sql"}, {"minutes": 9.0, "group_size": 4, "groups_per_step": 2, "lr": 1e-4, "kl_beta": 0.02}),
    # greedy scoring of many prompts: more agents per batch
    ("--task sql --algorithm apo", {"task": "sql", "algorithm": "apo"}, {"runners": 32}),
    ("--quick", {"task": "calc", "quick": True},
     {"minutes": 0.6, "group_size": 4, "runners": 8, "groups_per_step": 2, "held_out": 24, "sft_epochs": 1, "demonstrations": 600}),
    ("--task sql --quick", {"task": "sql", "quick": True},
     {"minutes": 1.5, "runners": 8, "held_out": 16, "validation": 8}),
)


def profile_help(name: str) -> str:
    """A demo flag's defaults as the config applies them: ``default X; --task sql Y; ...``."""
    return profiles.help_for(DemoConfig, PROFILES, name)


@dataclass
class DemoConfig:
    task: str = "calc"
    minutes: float = 6.0
    max_steps: int = 0  # 0: train for ``minutes``; else stop after this many optimiser steps (or the minutes, first)
    group_size: int = 8
    runners: int = 16
    groups_per_step: int = default_of(TrainerSettings, "groups_per_step")
    held_out: int = 150
    demonstrations: int = 2000
    lr: float = default_of(TrainerSettings, "lr")  # the tiny model's; the SQL task's 1e-4 is in PROFILES
    kl_beta: float = 0.05
    sft_epochs: int = 3
    seed: int = 0
    out: Path = Path("demo-output")
    quick: bool = False
    keep_running: bool = False
    dashboard: bool = True
    data_dir: Path | None = None
    model: str = "smollm2-135m-instruct"
    train_layers: int = 10
    temperature: float = 0.7
    algorithm: str = "grpo"
    val_size: int = 30  # --algorithm apo (with --task sql): validation questions per candidate
    apo_rounds: int = default_of(ApoSettings, "apo_rounds")
    apo_beam: int = 1  # a lean search: the demo's beam (ApoSettings' own default keeps more)
    apo_branch: int = default_of(ApoSettings, "apo_branch")
    single_turn: bool = False  # --task sql: one SQL answer per question, no rewrite after an error
    validation: int = 30  # --task sql: validation questions scored for each version (0: none, the last version is kept)
    validate_every: int = 1
    train_questions: int = 0  # --task sql: train on this many of the training questions, a sample by level (0: all)
    sql_reward: str = "match"  # --task sql: the training rollouts' reward, one of rolloutbus.demo.sql.REWARDS
    early_stop_patience: int = 0
    train_minutes_only: bool = False  # set by the learning bench: no evaluation, no report
    engine: str = "torch"  # --task sql: the policy server's engine (torch | vllm)
    production: Any = None  # --production: a ProductionConfig (task-less traffic, late feedback)
    credit: str = default_of(StreamSettings, "credit")  # the stream worker's --credit (a registered credit mode), with --gamma
    gamma: float = default_of(StreamSettings, "gamma")
    reward_rules: Path | None = None  # the stream worker's --reward-rules (None: every automatic rule off)
    advantage_estimator: str = default_of(StreamSettings, "advantage_estimator")
    policy_loss: str = default_of(TrainerSettings, "policy_loss")  # the trainer's --policy-loss
    nproc_per_node: int = default_of(TrainerSettings, "nproc_per_node")  # the trainer's FSDP2 ranks (torchrun)
    lora_rank: int = default_of(TrainerSettings, "lora_rank")  # the trainer's LoRA adapters (0: the demo's full/top-layer training)
    task_selection: str = feeder_default("task_selection")  # the feeder's choices: producers.settings.FeederSettings
    selection_k: int = feeder_default("selection_k")
    selection_explore: float = feeder_default("selection_explore")
    pace: str = feeder_default("pace")
    serve_lag: int = 0  # the policy server follows the version this many behind the newest (the staleness bench)
    backlog: str = default_of(TrainerSettings, "backlog")  # the trainer's --backlog: which waiting groups a step takes
    updates_per_batch: int = default_of(TrainerSettings, "updates_per_batch")  # the trainer's: optimiser updates on each batch
    mini_batches: int = default_of(TrainerSettings, "mini_batches")  # the trainer's: optimiser steps on each pass over a batch

    def serve_args(self) -> list[str]:
        from rolloutbus.runs.live import engine_args

        return engine_args(self.engine)

    def learning_train_args(self) -> list[str]:
        """The trainer's learning flags the demo passes on (policy loss, backlog, updates and mini-batches a batch). Pure."""
        return ["--policy-loss", self.policy_loss, "--backlog", self.backlog, "--updates-per-batch", str(self.updates_per_batch),
                "--mini-batches", str(self.mini_batches)]

    def lora_train_args(self) -> list[str]:
        """The trainer's flags for --lora-rank: adapters on every layer, so no --train-layers (the task's is undone). Pure."""
        return ["--lora-rank", str(self.lora_rank), "--train-layers", "0"] if self.lora_rank else []

    def lora_serve_args(self) -> list[str]:
        """The live policy server's: a LoRA trainer's versions loaded by their adapters alone (merged weights above the
        rank a server loads at run time). The evaluation's servers load each version's merged weights. Pure."""
        from rolloutbus.runs.live import served_lora_rank

        rank = served_lora_rank(self.lora_rank)
        return ["--lora-rank", str(rank)] if rank else []

    def _learning_settings(self, args: argparse.Namespace) -> None:
        """The stream worker's and the trainer's learning settings the demo passes on (credit, gamma, reward rules,
        estimator, policy loss, backlog, updates per batch, mini-batches): a flag, else its ``ROLLOUTBUS_*`` variable, else the
        demo's default; every value checked by the settings that declare it (with the demo's groups a step), before anything
        starts."""
        from streams.rewards import RewardRules

        flags = {"credit": "--credit", "gamma": "--gamma", "reward_rules": "--reward-rules",
                 "advantage_estimator": "--advantage-estimator"}
        given = {k: getattr(args, k) for k in flags if getattr(args, k, None) is not None}
        stream = load_settings(StreamSettings, given, flags)
        train_flags = {"policy_loss": "--policy-loss", "backlog": "--backlog", "updates_per_batch": "--updates-per-batch",
                       "mini_batches": "--mini-batches"}
        given_train = {k: getattr(args, k) for k in train_flags if getattr(args, k, None) is not None}
        train = load_settings(TrainerSettings, {**given_train, "groups_per_step": self.groups_per_step},
                              {**train_flags, "groups_per_step": "--groups-per-step"})
        for name, source in [*((k, stream) for k in flags), *((k, train) for k in train_flags)]:
            if name in given or name in given_train or f"ROLLOUTBUS_{name.upper()}" in os.environ:
                setattr(self, name, getattr(source, name))
        if self.reward_rules is not None:
            try:
                RewardRules.load(self.reward_rules)
            except ValueError as exc:
                raise ConfigError(f"--reward-rules: {exc}") from None

    def _feeder_settings(self, args: argparse.Namespace) -> None:
        """The task feeder's choices: a flag, else its ``ROLLOUTBUS_*`` variable, else FeederSettings' default; checked
        by the model that declares them (a bad --selection-k is one line naming the flag and the variable)."""
        from rolloutbus.demo import FEEDER_FLAGS

        given = {k: getattr(args, k) for k in FEEDER_FLAGS if getattr(args, k, None) is not None}
        feed = load_settings(FeederSettings, given, FEEDER_FLAGS)
        for name in FEEDER_FLAGS:
            setattr(self, name, getattr(feed, name))

    @property
    def serve_start_s(self) -> float:
        from rolloutbus.runs.live import engine_start_s

        return engine_start_s(self.engine)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DemoConfig:
        cfg = cls(seed=args.seed, out=Path(args.out), quick=args.quick, keep_running=args.keep_running,
                  dashboard=not getattr(args, "no_dashboard", False),
                  data_dir=Path(args.data_dir) if getattr(args, "data_dir", None) else None,
                  task=getattr(args, "task", None) or "calc", algorithm=getattr(args, "algorithm", None) or "grpo")
        if cfg.algorithm == "apo" and cfg.task != "sql":
            raise ConfigError("--algorithm apo optimizes the SQL agent's prompt: use it with --task sql")
        profiles.apply(cfg, PROFILES, {"task": cfg.task, "algorithm": cfg.algorithm, "quick": cfg.quick})
        if cfg.task == "sql" and getattr(args, "model", None):
            cfg.model = args.model
        cfg.single_turn = bool(getattr(args, "single_turn", False))
        # --task sql's GRPO run (and --production's) serves with vLLM wherever `make vllm` (or `make test`) installed
        # it; APO keeps torch's server (it was not run on vLLM), as does a machine without it.
        cfg.engine = getattr(args, "engine", None) or (
            "vllm" if cfg.task == "sql" and cfg.algorithm == "grpo" and _vllm_installed() else "torch")
        if cfg.engine == "vllm" and cfg.task != "sql":
            raise ConfigError("--engine vllm serves a Hugging Face model: use it with --task sql (calc's tiny model is the project's own)")
        for name in ("minutes", "max_steps", "group_size", "runners", "groups_per_step", "held_out", "lr", "kl_beta", "sft_epochs",
                     "train_layers", "temperature", "val_size", "apo_rounds", "apo_beam", "apo_branch", "validation",
                     "validate_every", "train_questions", "sql_reward", "early_stop_patience", "credit", "gamma", "reward_rules", "advantage_estimator",
                     "policy_loss", "nproc_per_node", "lora_rank", "serve_lag"):
            value = getattr(args, name, None)
            if value is not None:
                setattr(cfg, name, value)
        cfg._learning_settings(args)
        cfg._feeder_settings(args)
        if getattr(args, "production", False):
            if cfg.algorithm != "grpo":
                raise ConfigError("--production trains the weights on feedback: use it without --algorithm apo")

            cfg.production = ProductionConfig.from_args(args, cfg.task)
        if cfg.group_size < 2:
            raise ConfigError("--group-size must be at least 2: GRPO compares rollouts within a group")
        if cfg.train_questions and cfg.task != "sql":
            raise ConfigError("--train-questions samples the SQL task's training questions: use it with --task sql")
        if cfg.sql_reward != "match" and (cfg.task != "sql" or cfg.algorithm == "apo" or cfg.production):
            raise ConfigError(f"--sql-reward {cfg.sql_reward} grades the SQL agent's training rollouts: use it with --task sql's "
                              "GRPO run (APO trains on none; --production's reward is the simulated user's feedback)")
        if cfg.train_questions and cfg.algorithm == "apo":
            raise ConfigError("--train-questions samples the questions GRPO trains on; --algorithm apo trains on none "
                              "(its validation questions are --val-size)")
        if cfg.task == "sql":  # the held-out, validation and training questions fit the task's: one line, before anything starts
            from rolloutbus.demo import sql

            try:
                sql.demo_split(cfg.held_out, cfg.validation, cfg.train_questions, seed=cfg.seed)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        return cfg


def _vllm_installed() -> bool:
    """vLLM's venv is made (its marker) or ``$ROLLOUTBUS_VLLM_PYTHON`` names one: nothing is installed or imported here."""
    from trainer.vllm_venv import installed

    return installed()


@dataclass
class ProductionConfig:
    """What the simulated deployment does (``rolloutbus demo --production``'s flags)."""

    feedback_fraction: float = 0.5  # of the requests served, the share the user gives feedback on
    rate: float = 8.0  # requests a second, at most (0: as fast as the agents answer): what the demo's 2 cores serve
    # and train on in its minutes (the feedback stage, since it reads for a batch at once, applies hundreds a second)
    delay_min_s: float = 2.0  # the feedback's delay after the answer: log-uniform in [min, max]
    delay_max_s: float = 90.0
    window_s: float = 600.0  # the stream worker's --feedback-window
    baseline: str = "loo"  # the stream worker's --feedback-baseline (loo | prompt | none)
    sft_first: bool = False  # SFT on the positively judged traffic first, then the feedback training (SFTFirst)
    sft_at: float = 0.4  # --sft-first: the share of the training minutes served before the SFT
    sft_epochs: int = 2
    sft_lr: float = 1e-3
    sft_batch_size: int = 16
    groups_per_step: int = 32  # one feedback = one one-rollout batch: rollouts per optimiser step
    max_staleness: int = 8  # feedback trains a rollout served some versions ago

    @classmethod
    def from_args(cls, args: Any, task: str = "calc") -> ProductionConfig:
        """The defaults with PRODUCTION_PROFILES' for the task and mode, then the flags given; ``--groups-per-step`` is the judged
        rollouts per step here."""
        cfg = cls()
        profiles.apply(cfg, PRODUCTION_PROFILES, {"task": task, "quick": bool(getattr(args, "quick", False))})
        if getattr(args, "groups_per_step", None) is not None:
            cfg.groups_per_step = args.groups_per_step
        for name in ("feedback_fraction", "delay_min_s", "delay_max_s", "window_s", "baseline", "sft_first", "rate"):
            value = getattr(args, name, None)
            if value is not None:
                setattr(cfg, name, value)
        if cfg.delay_max_s < cfg.delay_min_s:
            raise ConfigError("--feedback-delay-max must be at least --feedback-delay-min")
        return cfg

    def process_args(self) -> list[str]:
        return ["--feedback-window", f"{self.window_s:g}", "--feedback-baseline", self.baseline]

    @property
    def label(self) -> str:
        return "after SFT, then feedback" if self.sft_first else "after feedback"

    def serve_args(self, base: str) -> list[str]:
        """--sft-first: no trainer publishes version 0 before the SFT, so the server starts on the warm-up itself."""
        return ["--model", base] if self.sft_first else []

    def train_args(self) -> list[str]:
        return ["--groups-per-step", str(self.groups_per_step), "--max-staleness", str(self.max_staleness)]


# ProductionConfig's defaults by task and mode (rolloutbus.demo.profiles; `--help` is written from this table)
PRODUCTION_PROFILES: tuple[profiles.Profile, ...] = (
    # the smoke run's: short delays, a step every few feedbacks
    ("--quick", {"quick": True}, {"feedback_fraction": 0.7, "delay_max_s": 8.0, "groups_per_step": 4, "rate": 10.0}),
    # the SQL task steps every 8: its rollouts are long (schema, worked examples, about 800 tokens), and a step over 32
    # of them took the trainer's one core most of a run
    ("--task sql", {"task": "sql", "quick": False}, {"groups_per_step": 8}),
    # a pretrained 135M model, not the tiny one: its learning rate, and a step every 4 answers (a few dozen are judged
    # right before the SFT)
    ("--task sql", {"task": "sql"}, {"sft_lr": 1e-4, "sft_batch_size": 4}),
)


def production_help(name: str) -> str:
    """A --production flag's defaults as ProductionConfig applies them."""
    return profiles.help_for(ProductionConfig, PRODUCTION_PROFILES, name)


__all__ = ["DemoConfig", "PRODUCTION_PROFILES", "PROFILES", "ProductionConfig", "production_help", "profile_help"]
