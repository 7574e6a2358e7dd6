"""The trainer's metrics (names other parts write alert rules against) and what its /readyz means."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainer.health import TrainerHealth

CONTRACT = {
    "rolloutbus_trainer_steps_total": "counter",
    "rolloutbus_trainer_last_step_timestamp_seconds": "gauge",
    "rolloutbus_trainer_policy_version": "gauge",
    "rolloutbus_trainer_last_batch_timestamp_seconds": "gauge",
    "rolloutbus_trainer_batches_consumed_total": "counter",
}


def _samples(h: TrainerHealth) -> dict[str, float]:
    text = generate_latest(h.registry).decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_metric_names_and_types_are_the_contract() -> None:
    h = TrainerHealth()
    text = generate_latest(h.registry).decode()
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")}
    for name, kind in CONTRACT.items():
        assert types.get(name, types.get(name.removesuffix("_total"))) == kind, (name, types)
        assert name in _samples(h), name


def test_batches_and_steps_move_the_metrics() -> None:
    h = TrainerHealth()
    h.published(4)
    assert _samples(h)["rolloutbus_trainer_policy_version"] == 4
    for _ in range(3):
        h.batch_read()
    h.step_done(5)
    s = _samples(h)
    assert s["rolloutbus_trainer_batches_consumed_total"] == 3 and s["rolloutbus_trainer_steps_total"] == 1
    assert s["rolloutbus_trainer_policy_version"] == 5
    assert s["rolloutbus_trainer_last_step_timestamp_seconds"] > 1e9 and s["rolloutbus_trainer_last_batch_timestamp_seconds"] > 1e9


def test_two_trainers_in_one_process_do_not_share_metrics() -> None:
    a, b = TrainerHealth(), TrainerHealth()
    a.step_done(1)
    assert _samples(b)["rolloutbus_trainer_steps_total"] == 0


def test_ready_when_assigned_and_not_stalled() -> None:
    h = TrainerHealth(stall_s=300)
    assert h.verdict(now=0) == (False, "starting")  # loading the model, publishing the initial version
    h.start(now=0)
    ok, reason = h.verdict(now=0)
    assert not ok and reason.startswith("kafka: no partition of the batches topic assigned")
    h.assignment(1, now=10)
    assert h.verdict(now=11) == (True, "ready")
    h.backlog = 16  # batches wait while a step runs
    h.beat(now=299)  # the loop polls between steps
    assert h.verdict(now=300)[0]
    h.beat(now=310)
    ok, reason = h.verdict(now=311)
    assert not ok and reason.startswith("stalled: no progress for 301s with 16 records waiting")
    h.batch_read(now=320)
    assert h.verdict(now=321)[0]
    h.assignment(0, now=330)  # revoked, or lost with the broker
    assert not h.verdict(now=331)[0]


def test_a_step_that_hangs_makes_the_trainer_unready() -> None:
    """The loop reports between polls; a step (or a publish) stuck past stall_s is a stall even with no backlog."""
    h = TrainerHealth(stall_s=600)
    h.start(now=0)
    h.assignment(1, now=0)
    h.batch_read(now=5)  # the last batch of a step; the step starts
    assert h.verdict(now=600)[0]
    assert h.verdict(now=606) == (False, "stalled: the consumer loop has not run for 606s")


@pytest.mark.parametrize(("argv", "env", "want"), [
    ([], {}, (9100, "127.0.0.1", "auto")),
    (["--metrics-port", "9300", "--metrics-host", "0.0.0.0", "--device", "cuda:1"], {}, (9300, "0.0.0.0", "cuda:1")),
    ([], {"ROLLOUTBUS_TRAIN_METRICS_PORT": "0", "ROLLOUTBUS_TRAIN_DEVICE": "cpu"}, (0, "127.0.0.1", "cpu")),
])
def test_train_reads_port_host_and_device(argv: list[str], env: dict[str, str], want: tuple,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from trainer.cli import add_arguments, settings_from_args

    for key in ("ROLLOUTBUS_TRAIN_METRICS_PORT", "ROLLOUTBUS_TRAIN_METRICS_HOST", "ROLLOUTBUS_TRAIN_DEVICE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    s = settings_from_args(parser.parse_args(argv))
    assert (s.train_metrics_port, s.train_metrics_host, s.train_device) == want
