"""The production demo's pure parts: when the simulated user gives feedback, and what it sends."""

from __future__ import annotations

import argparse
import random

import pytest

from foundation.errors import ConfigError
from rolloutbus.demo.driver import DemoConfig
from rolloutbus.demo.production import ProductionConfig, ServedAgent, SimulatedUser, feedback_delay


def test_feedback_delay_takes_the_fraction_and_stays_in_its_bounds() -> None:
    rng = random.Random(3)
    delays = [feedback_delay(rng, 0.3, 2.0, 90.0) for _ in range(4000)]
    given = [d for d in delays if d is not None]
    assert 0.27 < len(given) / len(delays) < 0.33
    assert all(2.0 <= d <= 90.0 for d in given)
    # log-uniform: the median is the geometric mean of the bounds (sqrt(180) ≈ 13.4 s), not the midpoint
    median = sorted(given)[len(given) // 2]
    assert 10.0 < median < 17.0
    assert feedback_delay(random.Random(0), 1.0, 5.0, 5.0) == 5.0
    assert all(feedback_delay(rng, 0.0, 1.0, 2.0) is None for _ in range(100))


def test_the_user_sends_what_is_due_once_and_counts_the_rest() -> None:
    sent: list[tuple[str, float]] = []
    user = SimulatedUser(ProductionConfig(feedback_fraction=1.0, delay_min_s=10.0, delay_max_s=10.0), 0,
                         lambda rid, v: sent.append((rid, v)) or "fid")
    user.judged("r1", 1.0)
    user.judged("r2", 0.0)
    assert user.send_due() == 0 and sent == []  # not due yet
    import time

    later = time.monotonic() + 11
    assert user.send_due(later) == 2
    assert sorted(sent) == [("r1", 1.0), ("r2", 0.0)]
    assert user.send_due(later + 100) == 0  # sent once
    user.judged("r3", 1.0)
    user.drop_rest()
    assert (user.stats.served, user.stats.feedback_sent, user.stats.feedback_positive, user.stats.left_unsent) == (3, 2, 1, 1)


def test_a_refused_send_is_not_counted_as_sent() -> None:
    user = SimulatedUser(ProductionConfig(feedback_fraction=1.0, delay_min_s=1.0, delay_max_s=1.0), 0, lambda rid, v: None)
    user.judged("r1", 1.0)
    assert user.send_due(10**12) == 1 and user.stats.feedback_sent == 0


def test_the_served_agent_records_no_reward_and_hands_the_verdict_to_the_user() -> None:
    from rolloutbus import LitAgent

    class Inner(LitAgent):
        name = "inner"

        def rollout(self, task, resources, rollout):  # type: ignore[no-untyped-def]
            return 1.0 if task == "right" else 0.0

    judged: list[tuple[str, float]] = []
    agent = ServedAgent(Inner(), lambda rid, v: judged.append((rid, v)))
    assert agent.name == "inner"

    class Ctx:
        rollout_id = "ro-1"

    assert agent.rollout("right", {}, Ctx()) is None  # type: ignore[arg-type]
    assert agent.rollout("wrong", {}, Ctx()) is None  # type: ignore[arg-type]
    assert judged == [("ro-1", 1.0), ("ro-1", 0.0)]


def _args(**kw: object) -> argparse.Namespace:
    base = dict(seed=0, out="o", quick=False, keep_running=False, task="calc", algorithm="grpo")
    return argparse.Namespace(**{**base, **kw})


def test_demo_config_takes_the_production_flags() -> None:
    assert DemoConfig.from_args(_args()).production is None
    cfg = DemoConfig.from_args(_args(production=True, feedback_fraction=0.25, delay_max_s=30.0))
    assert cfg.production == ProductionConfig(feedback_fraction=0.25, delay_max_s=30.0)
    assert cfg.production.process_args() == ["--feedback-window", "600", "--feedback-baseline", "loo"]
    assert cfg.production.train_args() == ["--groups-per-step", "32", "--max-staleness", "8"]
    assert DemoConfig.from_args(_args(production=True, baseline="prompt")).production.process_args()[-1] == "prompt"
    quick = DemoConfig.from_args(_args(production=True, quick=True))
    assert quick.production == ProductionConfig(feedback_fraction=0.7, delay_max_s=8.0, groups_per_step=4, rate=10.0)
    with pytest.raises(ConfigError, match="feedback-delay-max"):
        DemoConfig.from_args(_args(production=True, delay_min_s=10.0, delay_max_s=5.0))
    with pytest.raises(ConfigError, match="production"):
        DemoConfig.from_args(_args(production=True, task="sql", algorithm="apo"))


def test_production_steps_every_32_judged_rollouts_on_calc_8_on_sql_or_as_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rolloutbus.demo.config._vllm_installed", lambda: False)
    assert DemoConfig.from_args(_args(production=True)).production.groups_per_step == 32
    sql = DemoConfig.from_args(_args(production=True, task="sql"))
    assert sql.production.train_args() == ["--groups-per-step", "8", "--max-staleness", "8"]
    assert DemoConfig.from_args(_args(production=True, task="sql", quick=True)).production.groups_per_step == 4
    told = DemoConfig.from_args(_args(production=True, task="sql", groups_per_step=5))
    assert told.production.groups_per_step == 5
    assert DemoConfig.from_args(_args(production=True, groups_per_step=12)).production.groups_per_step == 12


def test_sql_production_serves_with_vllm_where_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rolloutbus.demo.config._vllm_installed", lambda: True)
    assert DemoConfig.from_args(_args(production=True, task="sql")).engine == "vllm"
    assert DemoConfig.from_args(_args(production=True, task="sql", engine="torch")).engine == "torch"
    monkeypatch.setattr("rolloutbus.demo.config._vllm_installed", lambda: False)
    assert DemoConfig.from_args(_args(production=True, task="sql")).engine == "torch"


def test_the_sft_trains_the_layers_the_feedback_trainer_will_resume_with() -> None:
    from rolloutbus.demo.production import SFTFirst

    sql_train = ["train", "--model", "m", "--groups-per-step", "2", "--train-layers", "10", "--micro-batch-tokens", "2048"]
    cmd = SFTFirst(ProductionConfig(sft_first=True), None, sql_train, "m", 60.0, print).command()
    assert cmd[:2] == ["train", "--algorithm"] and cmd[-2:] == ["--train-layers", "10"]
    sql_prod = DemoConfig.from_args(_args(production=True, task="sql", sft_first=True, engine="torch")).production
    sql_cmd = SFTFirst(sql_prod, None, sql_train, "m", 60.0, print).command()
    assert sql_cmd[sql_cmd.index("--sft-lr") + 1] == "0.0001" and sql_cmd[sql_cmd.index("--sft-batch-size") + 1] == "4"
    calc_cmd = SFTFirst(ProductionConfig(sft_first=True), None, ["train", "--model", "m"], "m", 60.0, print).command()
    assert "--train-layers" not in calc_cmd  # the calculator trains every layer in both


def test_after_the_sft_the_feedback_trainer_skips_what_the_warm_up_answered() -> None:
    from rolloutbus.demo.production import SFTFirst

    said = ["SFT: 12 transitions pass the filter SFTFilter(top_k=1)", "SFT epoch 1: loss 0.3033 → 0.1571 over 3 steps; policy version 1",
            "SFT epoch 2: loss 0.0302 → 0.0601 over 3 steps; policy version 2"]
    assert SFTFirst.first_version(said) == 1
    assert SFTFirst.first_version(said[:1]) is None
