"""`rolloutbus demo --help` states the defaults the code applies, per task."""

from __future__ import annotations

import argparse

from rolloutbus.demo import add_arguments
from rolloutbus.demo.driver import DemoConfig


def _help(flag: str) -> str:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return next(a.help for a in p._actions if flag in a.option_strings)  # type: ignore[return-value]


def _cfg(*argv: str) -> DemoConfig:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return DemoConfig.from_args(p.parse_args(list(argv)))


def test_help_gives_each_tasks_default_as_the_config_applies_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each flag's help is written from the profiles table, and the config applies that table: what --help says for
    each task and mode is the value a run gets."""
    import dataclasses

    from rolloutbus.demo import config

    monkeypatch.setattr(config, "_vllm_installed", lambda: False)
    p = argparse.ArgumentParser()
    add_arguments(p)
    fields = {f.name for f in dataclasses.fields(DemoConfig)}
    prod_fields = {f.name for f in dataclasses.fields(config.ProductionConfig)} - {"groups_per_step", "sft_epochs"}
    derived = 0
    for action in p._actions:
        if action.dest in fields and action.help and "(default " in action.help:
            assert config.profile_help(action.dest) in action.help, action.dest
            derived += 1
        elif action.dest in prod_fields and action.help and "(default " in action.help:
            assert config.production_help(action.dest) in action.help, action.dest
            derived += 1
    assert derived >= 20
    assert config.production_help("groups_per_step") in _help("--groups-per-step")

    modes = {"": (), "--task sql": ("--task", "sql"), "--task sql --algorithm apo": ("--task", "sql", "--algorithm", "apo"),
             "--quick": ("--quick",), "--task sql --quick": ("--task", "sql", "--quick")}
    for label, when, values in config.PROFILES:
        cfg = _cfg(*modes[label])
        assert {k: getattr(cfg, k) for k in values} == values, label
    calc, sql, quick, sql_quick = _cfg(), _cfg(*modes["--task sql"]), _cfg("--quick"), _cfg(*modes["--task sql --quick"])
    assert (calc.minutes, sql.minutes, quick.minutes, sql_quick.minutes) == (6.0, 9.0, 0.6, 1.5)
    assert (calc.lr, sql.lr) == (5e-4, 1e-4) and "default 5e-4; --task sql 1e-4" in _help("--lr")
    assert "default 6; --task sql 9; --quick 0.6; --task sql --quick 1.5" in _help("--minutes")
    assert sql.runners == calc.runners == 16 and _cfg(*modes["--task sql --algorithm apo"]).runners == 32
    assert sql_quick.runners == quick.runners == 8 and sql_quick.validation == 8 and sql.validation == 30
    sql_prod = _cfg("--task", "sql", "--production").production
    assert (sql_prod.groups_per_step, sql_prod.sft_lr) == (8, 1e-4)
    assert _cfg("--task", "sql", "--production", "--quick").production.groups_per_step == 4


def test_the_trainers_backlog_policy_reaches_the_demo_from_its_flag_or_its_variable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """--backlog (the learning bench's knob for a trainer behind generation): the flag, else ROLLOUTBUS_BACKLOG, else
    the trainer's own default; a bad variable is one line naming the flag and the variable."""
    import pytest

    from foundation.errors import SettingError

    assert _cfg().backlog == "oldest" and _cfg("--backlog", "newest").backlog == "newest"
    monkeypatch.setenv("ROLLOUTBUS_BACKLOG", "sample")
    assert _cfg().backlog == "sample" and _cfg("--backlog", "oldest").backlog == "oldest"
    monkeypatch.setenv("ROLLOUTBUS_BACKLOG", "latest")
    with pytest.raises(SettingError, match="--backlog.*ROLLOUTBUS_BACKLOG"):
        _cfg()


def test_updates_per_batch_reach_the_trainer_from_the_flag_or_the_variable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """--updates-per-batch (GRPO's μ): the flag, else ROLLOUTBUS_UPDATES_PER_BATCH, else the trainer's default (1), checked
    by the trainer's settings before anything starts: beside the decoupled loss it is one line naming both flags."""
    import pytest

    from foundation.errors import SettingError

    assert _cfg().updates_per_batch == 1 and _cfg("--updates-per-batch", "2").updates_per_batch == 2
    monkeypatch.setenv("ROLLOUTBUS_UPDATES_PER_BATCH", "3")
    assert _cfg().updates_per_batch == 3
    with pytest.raises(SettingError, match="3 updates a batch need a policy loss that clips"):
        _cfg("--policy-loss", "decoupled")
    with pytest.raises(SystemExit):
        _cfg("--updates-per-batch", "0")


def test_the_trainers_learning_flags_reach_rolloutbus_train_as_given(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """--mini-batches, --updates-per-batch, --backlog and --policy-loss: what the demo starts the trainer with reads back,
    through rolloutbus train's own flags, as the values given; more mini-batches than the demo's groups a step (the SQL
    task's 2) is one line before anything starts."""
    import pytest

    from foundation.errors import SettingError
    from rolloutbus.cli import build_parser
    from trainer.cli import settings_from_args

    cfg = _cfg("--task", "sql", "--mini-batches", "2", "--updates-per-batch", "3", "--backlog", "newest")
    s = settings_from_args(build_parser().parse_args(["train", "--model", "tiny", *cfg.learning_train_args()]))
    assert (s.mini_batches, s.updates_per_batch, s.backlog, s.policy_loss) == (2, 3, "newest", "ppo-clip")
    assert _cfg().mini_batches == 1
    with pytest.raises(SettingError, match="3 mini-batches of a batch of 2 groups"):
        _cfg("--task", "sql", "--mini-batches", "3")
    monkeypatch.setenv("ROLLOUTBUS_MINI_BATCHES", "4")
    assert _cfg().mini_batches == 4  # the calculator's 8 groups a step


def test_lora_rank_reaches_the_trainer_on_every_layer_and_the_live_server(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """demo --lora-rank R: the trainer trains rank-R adapters on every layer (the SQL task's --train-layers undone,
    which the trainer refuses beside a rank), the live policy server loads them alone; without it, neither changes."""
    from rolloutbus.demo import config
    from rolloutbus.demo.driver import sql_task
    from trainer.cli import add_arguments as train_arguments, settings_from_args

    monkeypatch.setattr(config, "_vllm_installed", lambda: False)
    monkeypatch.setattr("trainer.model_import.import_model", lambda name, root: root / name)
    plain, lora = _cfg("--task", "sql"), _cfg("--task", "sql", "--lora-rank", "8")
    assert (plain.lora_rank, plain.lora_train_args(), plain.lora_serve_args()) == (0, [], [])
    assert lora.lora_rank == 8 and lora.lora_serve_args() == ["--lora-rank", "8"]
    assert _cfg("--lora-rank", "1024").lora_serve_args() == []  # above what a server loads: merged weights
    from foundation.config import CommonSettings

    task = sql_task(lora, CommonSettings(), lambda line: None)
    p = argparse.ArgumentParser()
    train_arguments(p)
    s = settings_from_args(p.parse_args(["--model", "tiny", *task.train_args, *lora.lora_train_args()]))
    assert (s.lora_rank, s.train_layers) == (8, 0)
    s = settings_from_args(p.parse_args(["--model", "tiny", *task.train_args, *plain.lora_train_args()]))
    assert (s.lora_rank, s.train_layers) == (0, plain.train_layers) and plain.train_layers > 0


def test_train_questions_trains_the_sql_task_on_a_sample_of_its_questions(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """--train-questions N: the SQL task publishes N of its training questions (so each comes round more often in a
    short run); held-out and validation questions stay as they were; the calculator task refuses it in one line."""
    import pytest

    from foundation.config import CommonSettings
    from foundation.errors import ConfigError
    from rolloutbus.demo import config
    from rolloutbus.demo.driver import sql_task

    monkeypatch.setattr(config, "_vllm_installed", lambda: False)
    monkeypatch.setattr("trainer.model_import.import_model", lambda name, root: root / name)
    every, few = (sql_task(_cfg("--task", "sql", *extra), CommonSettings(), lambda line: None)
                  for extra in ([], ["--train-questions", "32"]))
    assert len(few.train) == 32 and {q.qid for q in few.train} < {q.qid for q in every.train} and len(every.train) > 300
    assert (few.held_out, few.validation) == (every.held_out, every.validation)
    with pytest.raises(ConfigError, match="--train-questions.*--task sql"):
        _cfg("--train-questions", "32")
    with pytest.raises(ConfigError, match="--train-questions.*--algorithm apo"):
        _cfg("--task", "sql", "--algorithm", "apo", "--train-questions", "32")
    pool = len(every.train)
    assert _cfg("--task", "sql", "--train-questions", str(pool)).train_questions == pool, "all of them, named"
    with pytest.raises(ConfigError, match=f"--train-questions {pool + 1}: the SQL task has {pool} training questions"):
        _cfg("--task", "sql", "--train-questions", str(pool + 1))
    with pytest.raises(ConfigError, match="--held-out 900 and --validation 30 do not fit the SQL task's questions"):
        _cfg("--task", "sql", "--held-out", "900")
    assert _cfg("--held-out", "900").held_out == 900, "the calculator's held-out problems are its own"


def test_sql_reward_reaches_the_sql_agents_runners_and_is_refused_where_it_cannot_act(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from foundation.config import CommonSettings
    from foundation.errors import ConfigError
    from rolloutbus.demo import config
    from rolloutbus.demo.driver import sql_task

    monkeypatch.setattr(config, "_vllm_installed", lambda: False)
    monkeypatch.setattr("trainer.model_import.import_model", lambda name, root: root / name)
    said: dict[str, list[str]] = {"match": [], "graded": []}
    plain, graded = (sql_task(_cfg("--task", "sql", "--sql-reward", kind), CommonSettings(), said[kind].append)
                     for kind in ("match", "graded"))
    assert (plain.env["ROLLOUTBUS_AGENT_REWARD"], graded.env["ROLLOUTBUS_AGENT_REWARD"]) == ("match", "graded")
    assert _cfg("--task", "sql").sql_reward == "match", "execution match by default"
    task_line = [line for line in said["graded"] if line.startswith("task")]
    assert len(task_line) == 1 and "training rollouts rewarded graded (1 if the query returns" in task_line[0]
    assert not any("rewarded" in line for line in said["match"])
    for argv in (["--sql-reward", "graded"], ["--task", "sql", "--algorithm", "apo", "--sql-reward", "graded"],
                 ["--task", "sql", "--production", "--sql-reward", "graded"]):
        with pytest.raises(ConfigError, match="--sql-reward graded grades the SQL agent's training rollouts"):
            _cfg(*argv)
