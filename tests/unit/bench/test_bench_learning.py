"""The learning bench's rows: which engine serves each rolloutbus row, and version 0 scored once per engine and form."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bench import bench_learning as bl

ARGS = argparse.Namespace(minutes=1.0, held_out=9, validation=3, validate_every=1, backlog="newest")


@pytest.mark.parametrize(("system", "engine", "single", "key"), [
    ("rolloutbus-single", "torch", True, "single"), ("rolloutbus-multi", "torch", False, "multi"),
    ("rolloutbus-vllm-single", "vllm", True, "single-vllm"), ("rolloutbus-vllm-multi", "vllm", False, "multi-vllm")])
def test_each_row_runs_the_demo_on_its_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, system: str, engine: str,
                                              single: bool, key: str) -> None:
    seen: dict[str, Any] = {}

    class Result:
        first_scores, chosen_scores, subsets, chosen, final, validation = [0.0, 1.0], [1.0, 1.0], {}, 1, 1, {}
        steps, rollouts, train_s, step_time_s, cpu_s, early_stopped = 2, 32, 60.0, 10.0, {"train": 40.0}, False
        tokens, samples, groups, groups_teaching, staleness, skipped_backlog = 4000.0, 16.0, 8, 3, 1.25, 6.0

    def fake_run(cfg: Any, first_scores: list[float] | None = None) -> Result:
        seen.update(cfg=cfg, first=first_scores)
        return Result()

    monkeypatch.setattr("rolloutbus.demo.driver.run_demo_result", fake_run)
    first = {"single": [0.5, 0.5]}  # torch's single-turn version 0, scored by an earlier row
    row = bl.run_rolloutbus(ARGS, system, 0, tmp_path, first)
    cfg = seen["cfg"]
    assert (cfg.engine, cfg.single_turn, cfg.backlog) == (engine, single, "newest")
    assert cfg.serve_args() == (["--engine", "vllm"] if engine == "vllm" else [])
    # Version 0 is reused only when the same engine scored the same form: vLLM samples in bfloat16, torch in float32.
    assert seen["first"] == ([0.5, 0.5] if key == "single" else None)
    assert first[key] == ([0.5, 0.5] if key == "single" else [0.0, 1.0])
    assert row["rollouts"] == 32 and row["trained_rollouts"] == 2 * 2 * 4 and row["tokens"] == 4000.0
    shown = bl.where_time_goes({system: [row]})
    assert "trained on 16 of them (50%), 4000 tokens, 100 per trainer CPU-second" in shown
    assert "3 of 8 groups generated taught (38%, task selection all)" in shown
    assert "batches 1.25 versions old on average, 6 waiting groups skipped (backlog newest)" in shown
    assert bl.label(system, row).endswith(", backlog newest")
    # the SQL credit table's rows: the credit settings asked for are recorded and named
    asked = bl.run_rolloutbus(argparse.Namespace(**{**vars(ARGS), "credit": "discounted", "gamma": 1.0,
                                                    "reward_rules": Path("deploy/rewards/sql.toml")}), system, 0, tmp_path, first)
    assert (seen["cfg"].credit, seen["cfg"].gamma, seen["cfg"].reward_rules) == ("discounted", 1.0, Path("deploy/rewards/sql.toml"))
    assert bl.label(system, asked).endswith(", backlog newest, credit discounted (γ 1), rules sql.toml")
    # groups of 8, one a step: the demo is asked for them, and what the row counts follows
    big = bl.run_rolloutbus(argparse.Namespace(**{**vars(ARGS), "group_size": 8, "groups_per_step": 1}), system, 0, tmp_path, first)
    assert (seen["cfg"].group_size, seen["cfg"].groups_per_step) == (8, 1)
    assert big["trained_rollouts"] == 2 * 1 * 8 and bl.teaching_groups(big) == 2.0
    assert bl.label(system, big).endswith(", groups of 8, 1 a step, backlog newest")
    assert seen["cfg"].temperature == bl.DEMO_TEMPERATURE and big["temperature"] == bl.DEMO_TEMPERATURE
    hot = bl.run_rolloutbus(argparse.Namespace(**{**vars(ARGS), "temperature": 1.0}), system, 0, tmp_path, first)
    assert seen["cfg"].temperature == 1.0 and bl.label(system, hot).endswith(", temperature 1, backlog newest")
    assert seen["cfg"].train_questions == 0 and "training questions" not in bl.label(system, hot)
    few = bl.run_rolloutbus(argparse.Namespace(**{**vars(ARGS), "train_questions": 32}), system, 0, tmp_path, first)
    assert seen["cfg"].train_questions == 32 and bl.label(system, few).endswith(", 32 training questions, backlog newest")
    assert seen["cfg"].sql_reward == "match" and "reward" not in bl.label(system, few)
    graded = bl.run_rolloutbus(argparse.Namespace(**{**vars(ARGS), "sql_reward": "graded"}), system, 0, tmp_path, first)
    assert seen["cfg"].sql_reward == "graded" and graded["sql_reward"] == "graded"
    assert bl.label(system, graded).endswith(", reward graded, backlog newest")
    assert seen["cfg"].updates_per_batch == 1 and graded["updates_per_batch"] == 1 and "updates" not in bl.label(system, graded)
    twice = bl.run_rolloutbus(argparse.Namespace(**{**vars(ARGS), "updates_per_batch": 2}), system, 0, tmp_path, first)
    assert seen["cfg"].updates_per_batch == 2 and bl.label(system, twice).endswith(", backlog newest, 2 updates a batch")
    minis = bl.run_rolloutbus(argparse.Namespace(**{**vars(ARGS), "mini_batches": 2}), system, 0, tmp_path, first)
    assert seen["cfg"].mini_batches == 2 and minis["mini_batches"] == 2
    assert bl.label(system, minis).endswith(", backlog newest, 2 mini-batches a batch") and "mini" not in bl.label(system, graded)


def test_train_questions_above_the_pool_are_refused_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bl.main(["--systems", "rolloutbus-vllm-single", "--sql-reward", "graded", "--train-questions", "100000"])
    assert exc.value.code == 2 and "--train-questions 100000: the SQL task has" in capsys.readouterr().err
    for flags, words in ((["--held-out", "900"], "--held-out 900 and --validation 20 do not fit the SQL task's questions "
                                                 "(600 of the held-out from the databases never trained on): test_unseen=600"),
                         (["--validation", "900"], "--held-out 90 and --validation 900 do not fit")):
        with pytest.raises(SystemExit) as exc:  # without --train-questions too: one line, not a traceback in the first run
            bl.main(["--systems", "rolloutbus-vllm-single", *flags])
        assert exc.value.code == 2 and words in capsys.readouterr().err


def test_the_vllm_rows_are_asked_for_by_name() -> None:
    args = bl.SYSTEMS
    assert set(bl.DEFAULT_SYSTEMS) == {"rolloutbus-single", "trl-single", "rolloutbus-multi"}
    assert {"rolloutbus-vllm-single", "rolloutbus-vllm-multi"} <= set(args) and set(bl.LABELS) == set(args)


def test_the_trl_row_trains_with_the_rows_settings_and_counts_its_groups(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The TRL row is run with the group size, groups per step, temperature and training questions the bench's flags
    give every row (they were fixed at 4, 2 and 0.7), and counts its teaching groups by its own groups per step."""
    import json
    import subprocess

    seen: dict[str, Any] = {}

    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen["cmd"] = cmd
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        steps = [{"step": 1, "reward": 0.5, "frac_reward_zero_std": 0.0}, {"step": 2, "reward": 0.5, "frac_reward_zero_std": 1.0}]
        (out / "summary.json").write_text(json.dumps({"steps": 2, "rollouts": 16, "wall_s": 60.0, "reward_by_step": steps}))
        seen["train"] = Path(cmd[cmd.index("--train") + 1]).read_text().splitlines()
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr("bench.trl_venv.ensure_trl_venv", lambda: Path("/venv/bin/python"))
    monkeypatch.setattr("trainer.model_import.import_model", lambda name, root: root / name)
    monkeypatch.setattr("rolloutbus.demo.driver.evaluate_model", lambda cfg, model, tag: ([0.0, 1.0], [], {}))
    monkeypatch.setattr(subprocess, "run", fake_run)
    args = argparse.Namespace(**{**vars(ARGS), "group_size": 8, "groups_per_step": 1, "temperature": 1.0, "train_questions": 32})
    row = bl.run_trl(args, 0, tmp_path, {})
    flags = dict(zip(seen["cmd"][2::2], seen["cmd"][3::2]))
    assert (flags["--group-size"], flags["--groups-per-step"], flags["--temperature"]) == ("8", "1", "1.0")
    assert (flags["--lr"], flags["--beta"], flags["--train-layers"]) == ("0.0001", "0.02", "10") and len(seen["train"]) == 32
    assert bl.teaching_groups(row) == 1.0 and bl.label("trl-single", row).endswith(
        ", groups of 8, 1 a step, temperature 1, 32 training questions")
