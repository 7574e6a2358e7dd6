"""`rolloutbus train` on the real broker: groups → steps → versions, and kill -9 at each crash point.

After the crash and a restart, every group is trained on exactly once (TrainStep records on rb.metrics
name the groups of each step), and the versions on rb.resources are 0, 1, 2, ... without repeats or gaps.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from schemas.codec import decode, encode
from schemas.models import DeadLetter, GroupBatch, ResourceVersion, TrainStep
from trainer.model import build_tiny
from trainer.synthetic import sample_groups

pytestmark = pytest.mark.integration
torch.set_num_threads(1)
N_GROUPS = 6  # → 3 steps of 2 groups


@pytest.fixture(scope="module")
def groups() -> list[GroupBatch]:
    model, tok = build_tiny(seed=0)
    return sample_groups(model, tok, n_groups=N_GROUPS, group_size=4, max_new_tokens=8, seed=7, resource_version=0)


def _produce(conf: dict[str, Any], topic: str, values: list[bytes]) -> None:
    p = Producer(conf)
    for v in values:
        p.produce(topic, key=b"k", value=v)
    assert p.flush(30) == 0


def _read_all(conf: dict[str, Any], topic: str) -> list[Any]:
    c = Consumer({**conf, "group.id": f"check-{time.time_ns()}", "enable.auto.commit": False})
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if hi <= lo:
            return []
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out.append(decode(m.value()))
            if m.offset() + 1 >= hi:
                break
        return out
    finally:
        c.close()


def _train(env: dict[str, str], ckpt: Path, crash: str | None = None, max_steps: int = 3) -> subprocess.CompletedProcess[str]:
    run_env = dict(env)
    if crash:
        run_env["ROLLOUTBUS_TRAINER_CRASH_AT"] = crash
    # trainer.cli is `rolloutbus train` without importing the other components (so their state cannot break this test)
    cmd = [sys.executable, "-m", "trainer.cli", "--groups-per-step", "2", "--idle-exit", "20", "--max-steps", str(max_steps),
           "--threads", "1", "--checkpoint-dir", str(ckpt), "--lr", "1e-3"]
    return subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("crash", ["before_step:2", "after_checkpoint:2", "after_publish:2"])
def test_kill_9_and_resume_trains_each_group_once(
    crash: str, groups: list[GroupBatch], kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path
) -> None:
    values = [encode(g) for g in groups]
    # a redelivered group (same group_id) and bytes that are not a GroupBatch
    _produce(kafka_conf, topics.batches, values[:3] + [values[1], b"not avro at all"] + values[3:])
    ckpt = tmp_path / "ckpt"

    first = _train(test_env, ckpt, crash)
    assert first.returncode == -9, first.stderr[-3000:]
    second = _train(test_env, ckpt)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "version 3 (step 3)" in second.stdout

    versions = [r for r in _read_all(kafka_conf, topics.resources) if isinstance(r, ResourceVersion)]
    assert [v.version for v in versions] == [0, 1, 2, 3]  # strictly increasing, no gap, none reused
    assert [v.step for v in versions] == [0, 1, 2, 3]
    assert all(v.name == "policy" and v.kind == "model" and Path(v.uri).name == f"step-{v.step}" for v in versions)
    assert Path(versions[-1].uri, "model.safetensors").exists()

    steps = [r for r in _read_all(kafka_conf, topics.metrics) if isinstance(r, TrainStep)]
    assert [s.step for s in steps] == [1, 2, 3]
    trained = [gid for s in steps for gid in s.group_ids]
    assert sorted(trained) == sorted(g.group_id for g in groups)  # each group exactly once, none skipped
    assert all(len(s.group_ids) == 2 for s in steps)
    for s in steps:
        for key in ("loss", "kl", "clip_fraction", "reward_mean", "advantage_mean", "tokens_per_s", "data_time_fraction"):
            assert key in s.metrics
    assert sum(s.metrics["batches_duplicate"] for s in steps) == 1

    dlq = [r for r in _read_all(kafka_conf, topics.dlq) if isinstance(r, DeadLetter)]
    assert len(dlq) == 1 and dlq[0].value == b"not avro at all" and dlq[0].offset == 4

    manifest = json.loads((ckpt / "step-3" / "manifest.json").read_text())
    assert manifest["offsets"][topics.batches] == {"0": N_GROUPS + 2}
    assert manifest["version"] == 3


def test_restart_never_reuses_a_version(
    groups: list[GroupBatch], kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path
) -> None:
    """A fresh checkpoint dir against a topic that already has versions continues after the latest."""
    _produce(kafka_conf, topics.batches, [encode(g) for g in groups[:2]])
    assert _train(test_env, tmp_path / "a", max_steps=1).returncode == 0
    env = {**test_env, "ROLLOUTBUS_TRAIN_GROUP": "another-trainer"}
    out = _train(env, tmp_path / "b", max_steps=1)
    assert out.returncode == 0, out.stderr[-2000:]
    versions = [r.version for r in _read_all(kafka_conf, topics.resources) if isinstance(r, ResourceVersion)]
    assert versions == [0, 1, 2, 3]
