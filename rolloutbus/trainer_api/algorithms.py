"""The algorithms ``Trainer`` takes: ``GRPO(...)``, the settings of ``rolloutbus train`` and the stream worker's groups;
``SFT(...)``, rejection-sampling fine-tuning by ``rolloutbus train --algorithm sft``; ``APO(...)``, automatic prompt
optimization of a ``prompt_template`` resource by ``rolloutbus optimize-prompt``; ``VERL(config)``, a verl config
read into GRPO.

:data:`ALGORITHMS` names them (``Trainer(algorithm="grpo")``); an algorithm is a class there whose ``fit(trainer,
agent, train, val, test)`` runs it for ``Trainer.fit`` (the training algorithms of ``rolloutbus train`` are
:data:`trainer.algorithms.TRAIN_ALGORITHMS`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from foundation.config import check_values, default_of, setting_bounds
from foundation.errors import ConfigError
from foundation.registry import Registry
from producers.settings import check_feeder, feeder_default
from streams.settings import StreamSettings
from trainer.settings import ApoSettings, SFTSettings, TrainerSettings

ALGORITHMS: Registry[type] = Registry("algorithm")


@ALGORITHMS.register("grpo")
@dataclass
class GRPO:
    """GRPO on the policy the ``main_llm`` resource names (``model``: a local HF directory, a packaged model's
    name for ``rolloutbus model import``, or ``tiny``). Training stops after ``minutes`` or ``max_steps``.
    ``lr`` is 1e-4 here, for the pretrained models ``fit`` trains; ``rolloutbus train``'s own default (5e-4) is the
    tiny demo model's.
    Validation rollouts call the LLMs at ``val_temperature`` (0: greedy, as verl's ``val_kwargs`` and the demo;
    None: the LLM's own sampling parameters), so a version's score does not vary with sampling.

    ``credit`` (with ``gamma``), ``advantage_estimator`` and ``policy_loss`` are names in the registries
    (``streams.credit.CREDIT``, ``streams.grouping.ESTIMATORS``, ``trainer.policy_losses.POLICY_LOSSES``): how a
    rollout's rewards become each step's advantage, and the loss's policy term (``decoupled`` for stale
    batches). ``task_selection="pass-rate"`` passes over the tasks whose last ``selection_k`` rollouts (read from the
    run's ClickHouse database) all earned the same reward, but for ``selection_explore`` of the times they come round
    (:mod:`producers.curriculum`); a task with fewer of its own is judged by its family's (a row's ``task_family``
    field). ``pace="trainer"`` keeps generation a few teaching groups ahead of the trainer
    rather than of itself (:class:`rolloutbus.runs.live.TaskFeeder`)."""

    # the stream worker's and the trainer's defaults where fit shares them (default_of: declared once, there); the
    # others are fit's own for the pretrained models it trains (rolloutbus train's are the tiny demo model's)
    group_size: int = default_of(StreamSettings, "group_size")
    groups_per_step: int = 2
    lr: float = 1e-4
    kl_beta: float = 0.02
    minutes: float = 10.0
    max_steps: int | None = None
    temperature: float = 0.7
    val_temperature: float | None = 0.0
    train_layers: int | None = None
    skip_zero_variance: bool = True
    group_timeout_s: float = default_of(StreamSettings, "group_timeout_s")
    rollout_timeout_s: float = 900.0
    seed: int = 0
    credit: str = default_of(StreamSettings, "credit")
    gamma: float = default_of(StreamSettings, "gamma")
    advantage_estimator: str = default_of(StreamSettings, "advantage_estimator")
    policy_loss: str = default_of(TrainerSettings, "policy_loss")
    updates_per_batch: int = default_of(TrainerSettings, "updates_per_batch")  # GRPO's mu: optimiser updates on each batch
    mini_batches: int = default_of(TrainerSettings, "mini_batches")  # optimiser steps on each pass over a batch
    task_selection: str = feeder_default("task_selection")  # producers.settings.FeederSettings: all | pass-rate
    selection_k: int = feeder_default("selection_k")
    selection_explore: float = feeder_default("selection_explore")
    pace: str = feeder_default("pace")  # generation: runners never wait | trainer: a few groups ahead of the trainer
    train_args: list[str] = field(default_factory=list)  # more ``rolloutbus train`` flags, as given

    def __post_init__(self) -> None:
        from streams.credit import CREDIT
        from streams.grouping import ESTIMATORS
        from trainer.policy_losses import POLICY_LOSSES

        if self.group_size < 2:
            raise ConfigError("GRPO(group_size=...) must be at least 2: GRPO compares rollouts within a group")
        CREDIT.check(self.credit)
        ESTIMATORS.check(self.advantage_estimator)
        POLICY_LOSSES.check(self.policy_loss)
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"GRPO(gamma=...) must be in [0, 1], got {self.gamma}")
        check_values(TrainerSettings, {"updates_per_batch": self.updates_per_batch, "mini_batches": self.mini_batches,
                                       "groups_per_step": self.groups_per_step, "policy_loss": self.policy_loss},
                     "GRPO({}=...)", "GRPO(...)")
        check_feeder({"task_selection": self.task_selection, "selection_k": self.selection_k,
                      "selection_explore": self.selection_explore, "pace": self.pace}, "GRPO({}=...)")

    def fit(self, trainer: Any, agent: Any, train: list[str], val: list[str], test: list[str]) -> Any:
        """``Trainer.fit``'s run: the runners, the stream worker's groups, ``rolloutbus train``."""
        from rolloutbus.trainer_api.fit import run_fit

        return run_fit(trainer, agent, train, val, test)

    def process_args(self) -> list[str]:
        """The stream worker's flags for this algorithm's advantages. Pure."""
        return ["--credit", self.credit, "--gamma", str(self.gamma), "--advantage-estimator", self.advantage_estimator]


@ALGORITHMS.register("sft")
@dataclass
class SFT:
    """Rejection-sampling fine-tuning: the agent runs each task ``samples_per_task`` times on the policy as it is
    for ``collect_minutes``; then ``rolloutbus train --algorithm sft`` fine-tunes on the rollouts that pass the
    filter (final reward >= ``min_reward``, the ``top_k`` best per ``key``, the SQL condition ``where`` over the
    ``rollouts`` columns, alias ``r``) for ``epochs``, publishing a version after each. ``min_reward=None``
    and ``top_k=None`` keep every rollout."""

    samples_per_task: int = 4
    collect_minutes: float = 5.0
    top_k: int | None = 1
    min_reward: float | None = 1.0
    where: str | None = None
    key: str = default_of(SFTSettings, "sft_key")
    epochs: int = default_of(SFTSettings, "sft_epochs")
    lr: float = default_of(SFTSettings, "sft_lr")
    batch_size: int = default_of(SFTSettings, "sft_batch_size")
    temperature: float = 0.7
    group_timeout_s: float = default_of(StreamSettings, "group_timeout_s")
    rollout_timeout_s: float = 900.0
    seed: int = 0
    train_args: list[str] = field(default_factory=list)  # more ``rolloutbus train`` flags, as given

    def __post_init__(self) -> None:
        if self.samples_per_task < 1 or self.epochs < 1 or self.batch_size < 1 or (self.top_k is not None and self.top_k < 1):
            raise ConfigError("SFT(samples_per_task=, epochs=, batch_size=, top_k=) must each be at least 1")
        if self.key not in ("task", "prompt"):
            raise ConfigError(f"SFT(key=...) must be 'task' or 'prompt', got {self.key!r}")
        if self.collect_minutes <= 0 or self.lr <= 0:
            raise ConfigError("SFT(collect_minutes=, lr=) must be greater than 0")

    def fit(self, trainer: Any, agent: Any, train: list[str], val: list[str], test: list[str]) -> Any:
        """``Trainer.fit``'s run: the collection, then ``rolloutbus train --algorithm sft``."""
        from rolloutbus.trainer_api.fit import run_fit

        return run_fit(trainer, agent, train, val, test)

    def command(self, model: str) -> list[str]:
        """The ``rolloutbus train`` command line of the fine-tuning (after the collection)."""
        return ["train", "--algorithm", "sft", "--model", model, "--threads", "1", "--seed", str(self.seed),
                "--sft-epochs", str(self.epochs), "--sft-lr", str(self.lr), "--sft-batch-size", str(self.batch_size),
                "--sft-key", self.key,
                *(["--sft-top-k", str(self.top_k)] if self.top_k is not None else []),
                *(["--sft-min-reward", str(self.min_reward)] if self.min_reward is not None else []),
                *(["--sft-where", self.where] if self.where else []), *self.train_args]


@ALGORITHMS.register("apo")
@dataclass
class APO:
    """Automatic prompt optimization of the ``prompt_template`` resource (a :class:`~rolloutbus.trainer_api.resources.
    PromptTemplate`; ``resource`` names it when there are several) by ``rolloutbus optimize-prompt``, Agent
    Lightning's names: ``beam_rounds`` rounds of critique and rewrite, ``branch_factor`` rewrites per beam member,
    ``beam_width`` kept. The policy is served as given and does not change. Candidates are scored on the first
    ``val_batch_size`` validation rows (None: all) at ``val_temperature``; before the search the first
    ``gradient_batch_size`` training rows run once under the initial prompt (version 0), so the first critiques
    read training trajectories (later rounds critique the validation rollouts of the candidate they rewrite).
    The optimizer LLM is ``optimizer_url`` / ``optimizer_model`` (None: the policy server fit starts, by the name
    it serves), or, as Agent Lightning's first argument, ``client``: an ``OpenAI`` / ``AsyncOpenAI`` client, whose
    ``base_url`` and ``api_key`` are used (with ``optimizer_model``). ``candidates``: prompts of your own (templates) scored beside the initial one. A candidate is
    published as the next version only when it scores more than ``min_gain`` above the initial prompt."""

    client: Any = None
    beam_width: int = default_of(ApoSettings, "apo_beam_width")
    branch_factor: int = default_of(ApoSettings, "apo_branch")
    beam_rounds: int = default_of(ApoSettings, "apo_rounds")
    val_batch_size: int | None = None
    gradient_batch_size: int = 8
    val_temperature: float | None = 0.0
    optimizer_url: str | None = None
    optimizer_model: str | None = None
    optimizer_temperature: float = default_of(ApoSettings, "apo_llm_temperature")
    candidates: list[str] = field(default_factory=list)
    min_gain: float = default_of(ApoSettings, "apo_min_gain")
    resource: str | None = None
    score_timeout_s: float = default_of(ApoSettings, "apo_score_timeout_s")
    rollout_timeout_s: float = 900.0
    apo_args: list[str] = field(default_factory=list)  # more ``rolloutbus optimize-prompt`` flags, as given

    def __post_init__(self) -> None:
        if self.beam_width < 1 or self.branch_factor < 1 or (self.val_batch_size is not None and self.val_batch_size < 1):
            raise ConfigError("APO(beam_width=, branch_factor=, val_batch_size=) must each be at least 1")
        if self.beam_rounds < 0 or self.gradient_batch_size < 0 or self.min_gain < 0:
            raise ConfigError("APO(beam_rounds=, gradient_batch_size=, min_gain=) must not be negative")
        if self.score_timeout_s <= 0 or self.rollout_timeout_s <= 0:
            raise ConfigError("APO(score_timeout_s=, rollout_timeout_s=) must be greater than 0")
        if self.client is not None:
            if getattr(self.client, "base_url", None) is None:
                raise ConfigError(f"APO's first argument is the optimizer LLM's OpenAI or AsyncOpenAI client, not a "
                                  f"{type(self.client).__name__}")
            if not self.optimizer_model:
                raise ConfigError("APO(client) calls that client's endpoint: name the model, APO(client, optimizer_model=...)")
            self.optimizer_url = self.optimizer_url or str(self.client.base_url).rstrip("/")

    def fit(self, trainer: Any, agent: Any, train: list[str], val: list[str], test: list[str]) -> Any:
        """``Trainer.fit``'s run: the prompt optimized by ``rolloutbus optimize-prompt``, the policy served as given."""
        from rolloutbus.trainer_api.fit_apo import run_apo

        return run_apo(trainer, agent, train, val, test)

    def optimizer_key(self) -> str | None:
        """The ``client``'s API key (given to ``optimize-prompt`` as ``ROLLOUTBUS_APO_LLM_KEY``, not on its command line)."""
        return getattr(self.client, "api_key", None) or None

    def command(self, val_tasks: str, resource: str, llm_url: str, llm_model: str, run_id: str, out: str,
                candidates: str | None = None) -> list[str]:
        """The ``rolloutbus optimize-prompt`` command line: ``val_tasks`` a JSONL file, ``candidates`` the file
        holding :attr:`candidates` (JSON), ``out`` where its summary goes. Pure."""
        return ["optimize-prompt", val_tasks, "--resource", resource, "--llm-url", self.optimizer_url or llm_url,
                "--llm-model", self.optimizer_model or llm_model, "--llm-temperature", str(self.optimizer_temperature),
                "--beam-width", str(self.beam_width), "--branch", str(self.branch_factor), "--rounds", str(self.beam_rounds),
                "--score-timeout", str(self.score_timeout_s), "--min-gain", str(self.min_gain), "--run-id", run_id,
                "--out", out, *(["--max-val-tasks", str(self.val_batch_size)] if self.val_batch_size else []),
                *(["--candidates", candidates] if candidates else []), *self.apo_args]


__all__ = ["APO", "GRPO", "SFT"]


# verl's names of what GRPO(...) holds: advantage estimators, loss aggregations, policy losses
_VERL_ESTIMATORS = {"grpo": "grpo", "rloo": "rloo"}
_VERL_LOSS_AGG = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
_VERL_POLICY_LOSS = {"vanilla": "ppo-clip"}


def _ranks_args(gpus: Any, nodes: Any, given: list[str]) -> list[str]:
    """``rolloutbus train``'s rank flags for verl's ``trainer.n_gpus_per_node`` and ``trainer.nnodes`` (none for 1);
    several nodes without a rendezvous endpoint among the flags ``given`` is one line. Pure."""
    args: list[str] = []
    if gpus is not None and int(gpus) > 1:
        args += ["--nproc-per-node", str(int(gpus))]
    if nodes is not None and int(nodes) > 1:
        if "--rdzv-endpoint" not in given:
            raise ConfigError(f"VERL: trainer.nnodes={nodes} needs where the ranks meet: "
                              "VERL(config, train_args=['--rdzv-endpoint', 'HOST:PORT']) (torchrun's rendezvous, on the first node)")
        args += ["--nnodes", str(int(nodes))]
    return args


def _verl_bool(key: str, value: Any) -> bool:
    """A verl switch: a bool, or the text of one (dotted keys from a command line). Pure."""
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower()
    if text not in ("true", "false", "1", "0"):
        raise ConfigError(f"VERL: {key} {value!r} is not true or false")
    return text in ("true", "1")


def _verl_targets(value: Any) -> str:
    """verl's ``target_modules`` as ``--lora-targets``: ``all-linear`` (its default, also when not given), a list (or
    an OmegaConf ``ListConfig``), or a string of names (``"q_proj,v_proj"``, ``"[q_proj, v_proj]"``). Pure."""
    if value is None:
        return "all-linear"
    if isinstance(value, str):
        names = [n.strip().strip("'\"") for n in value.strip().strip("[]").split(",")]
    elif hasattr(value, "__iter__"):
        names = [str(n).strip() for n in value]
    else:
        names = [str(value)]
    names = [n for n in names if n]
    if not names or any(not re.fullmatch(r"[A-Za-z0-9_.]+|all-linear", n) for n in names) or ("all-linear" in names and len(names) > 1):
        raise ConfigError(f"VERL: actor_rollout_ref.model.target_modules {value!r}: module names (q_proj, ...) or all-linear")
    return ",".join(names)


def _lora_args(rank: Any, alpha: Any, targets: Any, checkpointing: Any, unsupported: dict[str, Any]) -> list[str]:
    """``rolloutbus train``'s LoRA and activation-checkpointing flags for verl's ``actor_rollout_ref.model.lora_rank``,
    ``lora_alpha``, ``target_modules`` (verl's default all-linear, so a rank alone adapts every linear layer, as in
    verl) and ``enable_gradient_checkpointing``; LoRA keys this trainer has no counterpart for (``unsupported``, given
    with a rank) are one line. Pure."""
    args: list[str] = []
    try:
        lora_rank = int(rank) if rank is not None else 0
    except (TypeError, ValueError):
        raise ConfigError(f"VERL: actor_rollout_ref.model.lora_rank {rank!r} is not a whole number") from None
    if lora_rank > 0:
        given = sorted(k for k, v in unsupported.items() if v not in (None, "", [], "null"))
        if given:
            raise ConfigError(f"VERL: {', '.join(given)} with LoRA is not implemented here (adapters start fresh on the "
                              "named modules); drop it, or GRPO(train_args=['--lora-targets', ...])")
        args += ["--lora-rank", str(lora_rank), "--lora-targets", _verl_targets(targets)]
        if alpha is not None:
            args += ["--lora-alpha", str(float(alpha))]
    if _verl_bool("actor_rollout_ref.model.enable_gradient_checkpointing", checkpointing):
        args += ["--activation-checkpointing"]
    return args


def _flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``: verl's dotted keys (as ``main_ppo`` takes them on its command line). Pure."""
    out: dict[str, Any] = {}
    items = config.items() if hasattr(config, "items") else []
    for key, value in items:
        name = f"{prefix}{key}"
        if hasattr(value, "items"):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


@ALGORITHMS.register("verl")
@dataclass
class VERL(GRPO):
    """The write-ups' ``agl.VERL(verl_config)``: a verl PPO/GRPO configuration (the nested dict, or dotted keys as
    ``verl.trainer.main_ppo`` takes them) read into :class:`GRPO`, trained by this project's trainer. What it maps:

    ==========================================================  ===============================================
    verl key                                                    GRPO(...)
    ==========================================================  ===============================================
    ``algorithm.adv_estimator`` (grpo, rloo)                    ``advantage_estimator``
    ``actor_rollout_ref.rollout.n``                             ``group_size``
    ``data.train_batch_size`` (prompts per step)                ``groups_per_step``
    ``actor_rollout_ref.actor.optim.lr``                        ``lr``
    ``actor_rollout_ref.actor.use_kl_loss`` / ``kl_loss_coef``  ``kl_beta`` (0 without the KL loss)
    ``actor_rollout_ref.actor.clip_ratio`` (``_low``/``_high``) ``--clip-eps`` / ``--clip-eps-high``
    ``actor_rollout_ref.actor.loss_agg_mode``                   ``--loss-agg`` (token-mean: dapo, seq-mean-token-mean:
                                                                grpo, seq-mean-token-sum-norm: dr_grpo)
    ``actor_rollout_ref.actor.policy_loss.loss_mode`` (vanilla) ``policy_loss`` ppo-clip
    ``actor_rollout_ref.rollout.temperature``                   ``temperature``
    ``actor_rollout_ref.rollout.val_kwargs.temperature``        ``val_temperature``
    ``trainer.total_training_steps``                            ``max_steps``
    ``trainer.total_epochs``                                    ``max_steps`` = epochs × tasks / groups per step
                                                                (fit counts the training tasks)
    ``trainer.test_freq``                                       ``--validate-every``
    ``trainer.n_gpus_per_node``                                 ``--nproc-per-node`` (ranks on each machine, FSDP2)
    ``trainer.nnodes``                                          ``--nnodes`` (more than 1 needs ``--rdzv-endpoint
                                                                HOST:PORT`` in ``train_args``: verl's Ray cluster
                                                                has no counterpart here)
    ``actor_rollout_ref.actor.ppo_epochs``                      ``updates_per_batch``: each update clipped against the
                                                                log-probs the batch was sampled with (verl recomputes
                                                                them with the actor before the first update)
    ``actor_rollout_ref.actor.ppo_mini_batch_size``             ``mini_batches`` = ⌈``data.train_batch_size`` / it⌉
                                                                (both count prompts): a step on each run of about that
                                                                many groups (verl's last run is the shorter; here the
                                                                runs are near-equal); one above the batch is refused
    ``actor_rollout_ref.model.path``                            ``model`` (the policy when ``main_llm`` names none)
    ``actor_rollout_ref.model.lora_rank`` / ``lora_alpha``      ``--lora-rank`` / ``--lora-alpha`` (0: full
                                                                fine-tuning); with ``engine="vllm"`` fit's server
                                                                loads each version's adapters alone
    ``actor_rollout_ref.model.target_modules``                  ``--lora-targets`` (verl's default, all-linear,
                                                                when a rank is given without it)
    ``actor_rollout_ref.model.enable_gradient_checkpointing``   ``--activation-checkpointing``
    ==========================================================  ===============================================

    A value this trainer has no counterpart for (an estimator or loss it does not implement, ``use_kl_in_reward``)
    is refused in one line; keys that only steer verl's own machinery (GPUs, vLLM's memory, save frequency,
    lengths) are listed in :attr:`ignored`, which ``fit`` says once. ``GRPO``'s own fields given as keyword
    arguments win over the config."""

    config: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    epochs: int | None = None
    ignored: list[str] = field(default_factory=list)

    def __init__(self, config: Any = None, **grpo: Any) -> None:
        flat = _flatten(config or {})
        mapped: dict[str, Any] = {}
        extra: list[str] = []
        used: set[str] = set()

        def take(key: str) -> Any:
            used.add(key)
            return flat.get(key)

        def choose(key: str, table: dict[str, str], hint: str = "") -> str | None:
            """The project's name for the config's value at ``key`` (None: not given); one this trainer lacks is one line."""
            value = take(key)
            if value is not None and value not in table:
                raise ConfigError(f"VERL: {key} {value!r} is not one this trainer implements ({', '.join(table)}{hint})")
            return None if value is None else table[value]

        if (est := choose("algorithm.adv_estimator", _VERL_ESTIMATORS)) is not None:
            mapped["advantage_estimator"] = est
        if take("algorithm.use_kl_in_reward"):
            raise ConfigError("VERL: algorithm.use_kl_in_reward is not implemented here: the KL term is in the loss "
                              "(actor_rollout_ref.actor.use_kl_loss with kl_loss_coef)")
        for key, name, kind in (("actor_rollout_ref.rollout.n", "group_size", int),
                                ("data.train_batch_size", "groups_per_step", int),
                                ("actor_rollout_ref.actor.optim.lr", "lr", float),
                                ("actor_rollout_ref.rollout.temperature", "temperature", float),
                                ("actor_rollout_ref.rollout.val_kwargs.temperature", "val_temperature", float),
                                ("trainer.total_training_steps", "max_steps", int),
                                ("actor_rollout_ref.actor.ppo_epochs", "updates_per_batch", int)):
            value = take(key)
            if value is not None:
                mapped[name] = kind(value)
        use_kl, coef = take("actor_rollout_ref.actor.use_kl_loss"), take("actor_rollout_ref.actor.kl_loss_coef")
        if use_kl is False:
            mapped["kl_beta"] = 0.0
        elif coef is not None:
            mapped["kl_beta"] = float(coef)
        train_args: list[str] = []
        low = take("actor_rollout_ref.actor.clip_ratio_low")
        clip = take("actor_rollout_ref.actor.clip_ratio")
        if low is not None or clip is not None:
            train_args += ["--clip-eps", str(float(low if low is not None else clip))]
        high = take("actor_rollout_ref.actor.clip_ratio_high")
        if high is not None:
            train_args += ["--clip-eps-high", str(float(high))]
        if (agg := choose("actor_rollout_ref.actor.loss_agg_mode", _VERL_LOSS_AGG)) is not None:
            train_args += ["--loss-agg", agg]
        mode = choose("actor_rollout_ref.actor.policy_loss.loss_mode", _VERL_POLICY_LOSS,
                      "; or GRPO(policy_loss=...) with its own names")
        if mode is not None:
            mapped["policy_loss"] = mode
        freq = take("trainer.test_freq")
        if freq is not None and int(freq) > 0:
            train_args += ["--validate-every", str(int(freq))]
        model = take("actor_rollout_ref.model.path")
        train_args += _ranks_args(take("trainer.n_gpus_per_node"), take("trainer.nnodes"), grpo.get("train_args", []))
        train_args += _lora_args(take("actor_rollout_ref.model.lora_rank"), take("actor_rollout_ref.model.lora_alpha"),
                                 take("actor_rollout_ref.model.target_modules"),
                                 take("actor_rollout_ref.model.enable_gradient_checkpointing"),
                                 {k: take(k) for k in ("actor_rollout_ref.model.exclude_modules",
                                                       "actor_rollout_ref.model.lora_adapter_path")})
        if (mini := take("actor_rollout_ref.actor.ppo_mini_batch_size")) is not None:
            given = "groups_per_step" in grpo or "groups_per_step" in mapped
            batch = int(grpo.get("groups_per_step", mapped.get("groups_per_step", GRPO.groups_per_step)))
            whose = "data.train_batch_size" if given else "GRPO's groups_per_step (data.train_batch_size not given)"
            if not 1 <= int(mini) <= batch:
                raise ConfigError(f"VERL: actor_rollout_ref.actor.ppo_mini_batch_size={mini} must be between 1 and {whose} "
                                  f"{batch}: the prompts one optimiser step takes, of the batch's")
            mapped["mini_batches"] = -(-batch // int(mini))
            if mapped["mini_batches"] > (most := setting_bounds(TrainerSettings, "mini_batches")["le"]):
                raise ConfigError(f"VERL: data.train_batch_size {batch} / actor_rollout_ref.actor.ppo_mini_batch_size {mini} "
                                  f"is {mapped['mini_batches']} mini-batches a batch; this trainer takes at most {most:g}")
        epochs = take("trainer.total_epochs")
        extra = sorted(k for k in flat if k not in used)
        GRPO.__init__(self, **{**mapped, **grpo, "train_args": [*train_args, *grpo.get("train_args", [])]})
        self.config, self.model, self.ignored = dict(config or {}), model, extra
        self.epochs = int(epochs) if epochs is not None else None

    def steps_for(self, tasks: int) -> int | None:
        """``max_steps`` when given, else ``total_epochs`` passes over ``tasks`` training tasks at ``groups_per_step``
        tasks a step (None: neither given: ``minutes`` bounds the run). Pure."""
        if self.max_steps or not self.epochs:
            return self.max_steps
        return max(1, -(-self.epochs * tasks // self.groups_per_step))

    def ignored_line(self) -> str | None:
        """The line fit says once: the config's keys this trainer does not use. Pure."""
        if not self.ignored:
            return None
        return (f"VERL       {len(self.ignored)} config key(s) steer only verl's own machinery and are not used here: "
                + ", ".join(self.ignored))
