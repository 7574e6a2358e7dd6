"""``agl.VERL(verl_config)``: the write-ups' verl configuration read into this trainer's GRPO, what it cannot honour
refused in one line, what only steers verl's machinery listed once."""

from __future__ import annotations

import pytest

import rolloutbus as agl
from foundation.errors import ConfigError
from rolloutbus.trainer_api.algorithms import GRPO

WRITE_UPS = {  # the SQL write-up's verl_config, as printed there
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "data": {"train_batch_size": 32, "max_prompt_length": 4096, "max_response_length": 2048},
    "actor_rollout_ref": {
        "rollout": {"name": "vllm", "n": 4, "multi_turn": {"format": "hermes"}},
        "actor": {"ppo_mini_batch_size": 32, "optim": {"lr": 1e-6}},
        "model": {"path": "Qwen/Qwen2.5-Coder-1.5B-Instruct"},
    },
    "trainer": {"n_gpus_per_node": 1, "val_before_train": True, "test_freq": 32, "save_freq": 64, "total_epochs": 2},
}


def test_the_write_ups_config_becomes_grpo_settings() -> None:
    algo = agl.VERL(WRITE_UPS)
    assert isinstance(algo, GRPO) and "VERL" in dir(agl)
    assert (algo.advantage_estimator, algo.group_size, algo.groups_per_step, algo.lr) == ("grpo", 4, 32, 1e-6)
    assert algo.train_args == ["--validate-every", "32"]
    assert algo.model == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert algo.ignored == ["actor_rollout_ref.rollout.multi_turn.format", "actor_rollout_ref.rollout.name",
                            "data.max_prompt_length", "data.max_response_length", "trainer.save_freq", "trainer.val_before_train"]
    assert algo.ignored_line().startswith("VERL       6 config key(s) steer only verl's own machinery")
    assert algo.epochs == 2 and algo.steps_for(100) == 7  # two passes over 100 tasks, 32 a step
    assert agl.VERL(WRITE_UPS, max_steps=3).steps_for(100) == 3


def test_losses_clips_and_kl_map_and_keyword_arguments_win() -> None:
    algo = agl.VERL({"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": 0.001,
                     "actor_rollout_ref.actor.clip_ratio_low": 0.2, "actor_rollout_ref.actor.clip_ratio_high": 0.28,
                     "actor_rollout_ref.actor.loss_agg_mode": "token-mean", "algorithm.adv_estimator": "rloo",
                     "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla", "trainer.total_training_steps": 50},
                    minutes=3.0, max_steps=7)
    assert (algo.kl_beta, algo.advantage_estimator, algo.policy_loss, algo.max_steps, algo.minutes) == \
        (0.001, "rloo", "ppo-clip", 7, 3.0)
    assert algo.train_args == ["--clip-eps", "0.2", "--clip-eps-high", "0.28", "--loss-agg", "dapo"]
    assert agl.VERL({"actor_rollout_ref": {"actor": {"use_kl_loss": False}}}).kl_beta == 0.0


@pytest.mark.parametrize(("config", "match"), [
    ({"algorithm": {"adv_estimator": "gae"}}, "adv_estimator 'gae' is not one this trainer implements"),
    ({"algorithm": {"use_kl_in_reward": True}}, "use_kl_in_reward is not implemented here"),
    ({"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "gspo"}}}}, "loss_mode 'gspo'"),
    ({"actor_rollout_ref": {"rollout": {"n": 1}}}, "group_size=...\\) must be at least 2"),
    ({"trainer": {"n_gpus_per_node": 4, "nnodes": 2}}, "trainer.nnodes=2 needs where the ranks meet"),
    ({"data": {"train_batch_size": 32}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 64}}},
     "ppo_mini_batch_size=64 must be between 1 and data.train_batch_size 32: the prompts one optimiser step takes"),
    ({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 256}}},  # verl's default batch (1,024) is not assumed
     r"ppo_mini_batch_size=256 must be between 1 and GRPO's groups_per_step \(data.train_batch_size not given\) 2"),
    ({"data": {"train_batch_size": 4096}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 1}}},
     "data.train_batch_size 4096 / actor_rollout_ref.actor.ppo_mini_batch_size 1 is 4096 mini-batches a batch; this "
     "trainer takes at most 1024"),
])
def test_what_it_cannot_honour_is_one_line(config: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        agl.VERL(config)


def test_gpus_and_nodes_become_the_trainers_ranks() -> None:
    """verl's ``n_gpus_per_node`` and ``nnodes`` are ``rolloutbus train``'s ``--nproc-per-node`` and ``--nnodes``
    (torchrun under FSDP2); one GPU adds no flag; several nodes meet at the endpoint the caller gives."""
    assert "--nproc-per-node" not in agl.VERL({"trainer": {"n_gpus_per_node": 1, "nnodes": 1}}).train_args
    assert agl.VERL({"trainer": {"n_gpus_per_node": 4}}).train_args == ["--nproc-per-node", "4"]
    algo = agl.VERL({"trainer": {"n_gpus_per_node": 8, "nnodes": 2}}, train_args=["--rdzv-endpoint", "node0:29400"])
    assert algo.train_args == ["--nproc-per-node", "8", "--nnodes", "2", "--rdzv-endpoint", "node0:29400"]


def test_verl_s_lora_and_gradient_checkpointing_keys_become_the_trainer_s_flags() -> None:
    """A rank alone adapts every linear layer (verl's target_modules default); alpha, targets (list or string) and
    gradient checkpointing carry over; rank 0 is full fine-tuning."""
    model = {"lora_rank": 32, "lora_alpha": 64, "enable_gradient_checkpointing": True}
    assert agl.VERL({"actor_rollout_ref": {"model": model}}).train_args == [
        "--lora-rank", "32", "--lora-targets", "all-linear", "--lora-alpha", "64.0", "--activation-checkpointing"]
    targets = {"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.target_modules": ["q_proj", "v_proj"]}
    assert agl.VERL(targets).train_args == ["--lora-rank", "8", "--lora-targets", "q_proj,v_proj"]
    assert agl.VERL({"actor_rollout_ref.model.lora_rank": 0}).train_args == []
    assert agl.VERL({"actor_rollout_ref.model.lora_rank": 0}).ignored == []
    # as dotted keys from a command line: text everywhere
    dotted = {"actor_rollout_ref.model.lora_rank": "16", "actor_rollout_ref.model.target_modules": "[q_proj, v_proj]",
              "actor_rollout_ref.model.enable_gradient_checkpointing": "False"}
    assert agl.VERL(dotted).train_args == ["--lora-rank", "16", "--lora-targets", "q_proj,v_proj"]
    for bad, says in (({"actor_rollout_ref.model.lora_rank": "sixteen"}, "not a whole number"),
                      ({"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.target_modules": []}, "module names"),
                      ({"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.target_modules": "all-linear,q_proj"},
                       "module names"),
                      ({"actor_rollout_ref.model.enable_gradient_checkpointing": "maybe"}, "not true or false"),
                      ({"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.exclude_modules": ".*visual.*"},
                       "exclude_modules with LoRA is not implemented")):
        with pytest.raises(ConfigError, match=says):
            agl.VERL(bad)


def test_fit_s_server_serves_a_lora_trainer_s_versions_by_their_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank the trainer runs with (its last --lora-rank, else ROLLOUTBUS_LORA_RANK) goes to the policy server,
    vLLM's or torch's; full fine-tuning gets no flag; and the flags are ones `rolloutbus train` and `serve` take."""
    from rolloutbus.cli import build_parser
    from rolloutbus.trainer_api.fit import lora_rank_of, serve_command, served_lora_rank

    args = agl.VERL({"actor_rollout_ref.model.lora_rank": 16}).train_args
    assert lora_rank_of(args, 0) == 16 and lora_rank_of(["--lr", "1e-5"], 4) == 4 and lora_rank_of([], 0) == 0
    assert serve_command(8000, "vllm", None, 16)[-2:] == ["--lora-rank", "16"]
    assert serve_command(8000, "torch", None, 16)[-2:] == ["--lora-rank", "16"]
    assert "--lora-rank" not in serve_command(8000, "torch", None, 0) + serve_command(8000, "vllm", None, 0)
    assert build_parser().parse_args(serve_command(8000, "vllm", None, 16)).lora_rank == 16
    assert build_parser().parse_args(serve_command(8000, "torch", None, 16)).lora_rank == 16
    assert (served_lora_rank(512), served_lora_rank(1024)) == (512, 0)  # above what the server loads: merged weights
    with pytest.raises(ConfigError, match="train_args: argument --lora-rank: invalid int value: 'abc'"):
        lora_rank_of(["--lora-rank", "abc"], 0)
    train = build_parser().parse_args(["train", *args])
    assert (train.lora_rank, train.lora_targets) == (16, "all-linear")


def test_ppo_epochs_are_the_trainers_updates_per_batch() -> None:
    """verl's ``ppo_epochs`` (passes over each batch) is ``updates_per_batch`` (GRPO's μ), not a key of verl's machinery;
    with the decoupled loss, which has no trust region across a batch's updates, it is refused."""
    algo = agl.VERL({"actor_rollout_ref": {"actor": {"ppo_epochs": 2}}})
    assert algo.updates_per_batch == 2 and not algo.ignored
    assert agl.VERL(WRITE_UPS).updates_per_batch == 1 == GRPO().updates_per_batch
    for loss in ("decoupled", "verl:gpg"):  # the ratio to the policy as it is at each update, or none
        with pytest.raises(ConfigError, match=f"2 updates a batch need a policy loss that clips.*not {loss}"):
            agl.VERL({"actor_rollout_ref": {"actor": {"ppo_epochs": 2}}}, policy_loss=loss)
    assert agl.VERL({"actor_rollout_ref": {"actor": {"ppo_epochs": 2}}}, policy_loss="verl:vanilla").updates_per_batch == 2
    with pytest.raises(ConfigError, match=r"GRPO\(updates_per_batch=\.\.\.\) must be greater than or equal to 1, got 0"):
        GRPO(updates_per_batch=0)
    with pytest.raises(ConfigError, match=r"GRPO\(updates_per_batch=\.\.\.\) must be less than or equal to 16, got 17"):
        GRPO(updates_per_batch=17)  # the bound TrainerSettings declares, read from it


def test_ppo_mini_batches_are_the_trainers_mini_batches() -> None:
    """verl's ``ppo_mini_batch_size`` (prompts an optimiser step takes) divides ``train_batch_size`` (prompts a batch)
    into ``mini_batches``; the write-ups' (32 of 32) is one; any policy loss takes them (a sample is used once a pass);
    fit hands them to the trainer."""
    from rolloutbus.cli import build_parser

    verl_default = agl.VERL({"data": {"train_batch_size": 1024}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 256}}})
    assert (verl_default.groups_per_step, verl_default.mini_batches, verl_default.ignored) == (1024, 4, [])
    assert agl.VERL(WRITE_UPS).mini_batches == 1 == GRPO().mini_batches
    assert agl.VERL({"actor_rollout_ref.actor.ppo_mini_batch_size": 1}).mini_batches == GRPO().groups_per_step
    assert agl.VERL({"actor_rollout_ref.actor.ppo_mini_batch_size": 2}, groups_per_step=8).mini_batches == 4
    uneven = agl.VERL({"data": {"train_batch_size": 32}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 12}}})
    assert uneven.mini_batches == 3, "12 + 12 + 8 in verl; near-equal runs here"
    with pytest.raises(ConfigError, match=r"GRPO\(\.\.\.\): 4 mini-batches of a batch of 2 groups"):
        GRPO(mini_batches=4)
    assert agl.VERL({"actor_rollout_ref.actor.ppo_mini_batch_size": 1}, policy_loss="decoupled").mini_batches == 2
    assert build_parser().parse_args(["train", "--mini-batches", "4"]).mini_batches == 4


def test_fits_trainer_gets_the_algorithms_learning_settings() -> None:
    """The command fit starts reads, through ``rolloutbus train``'s own flags and settings, what the algorithm says:
    μ, the mini-batches, the loss, the batch (the write-ups' config, and verl's defaults of 1024 / 256 prompts)."""
    from rolloutbus.cli import build_parser
    from rolloutbus.trainer_api.fit import train_command
    from trainer.cli import settings_from_args

    algo = agl.VERL({"data": {"train_batch_size": 8}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4, "ppo_epochs": 2}}})
    s = settings_from_args(build_parser().parse_args(train_command(algo, "tiny", ["--validate-every", "3"])))
    assert (s.updates_per_batch, s.mini_batches, s.groups_per_step, s.policy_loss) == (2, 2, 8, "ppo-clip")
    assert s.validate_every == 3
    s = settings_from_args(build_parser().parse_args(train_command(agl.VERL(WRITE_UPS), "tiny", [])))
    assert (s.updates_per_batch, s.mini_batches, s.groups_per_step, s.lr) == (1, 1, 32, 1e-6)
