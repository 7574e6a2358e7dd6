"""``rolloutbus train`` probes and metrics on the real broker: /readyz is 503 while the trainer starts and
until it holds rb.batches, 200 once it trains; /metrics carries the names alert rules are written against."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from confluent_kafka import Producer

from schemas.codec import encode
from tests.integration.streams.helpers import WorkerProc
from tests.integration.streams.test_health_worker import first_answer, free_port, metric, probe, wait_for
from trainer.model import build_tiny
from trainer.synthetic import sample_groups

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
torch.set_num_threads(1)


def test_trainer_readyz_and_metrics(kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    started = time.time()
    proc = WorkerProc([sys.executable, "-m", "trainer.cli", "--groups-per-step", "2", "--threads", "1", "--device", "cpu",
                       "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-port", str(port)], test_env)
    try:
        status, reason = first_answer(port, proc, timeout=120)
        assert status == 503 and reason.strip().split(":")[0] in ("starting", "kafka"), reason
        assert probe(port, "/healthz") == (200, "ok\n")
        # Ready with nothing to train on: connected, and no batch waits.
        assert wait_for(port, 200, proc, timeout=120) == "ready\n"
        text = (probe(port, "/metrics") or (0, ""))[1]
        assert metric(text, "rolloutbus_trainer_policy_version") == 0  # the initial weights, published as version 0
        assert metric(text, "rolloutbus_trainer_steps_total") == 0

        model, tok = build_tiny(seed=0)
        groups = sample_groups(model, tok, n_groups=2, group_size=4, max_new_tokens=6, seed=5, resource_version=0)
        producer = Producer(kafka_conf)
        for g in groups:
            producer.produce(topics.batches, key=g.group_id.encode(), value=encode(g))
        assert producer.flush(30) == 0

        deadline = time.monotonic() + 120
        while metric(text, "rolloutbus_trainer_steps_total") < 1:
            assert time.monotonic() < deadline and proc.poll() is None, proc.output()[-3000:]
            time.sleep(0.5)
            text = (probe(port, "/metrics") or (0, ""))[1]
        assert metric(text, "rolloutbus_trainer_batches_consumed_total") == 2
        assert metric(text, "rolloutbus_trainer_policy_version") == 1
        assert metric(text, "rolloutbus_trainer_last_step_timestamp_seconds") >= started
        assert metric(text, "rolloutbus_trainer_last_batch_timestamp_seconds") >= started
        assert wait_for(port, 200, proc) == "ready\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.output()[-3000:]
    assert "training on cpu" in proc.output()
