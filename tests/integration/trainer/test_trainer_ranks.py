"""`rolloutbus train --nproc-per-node 2` on the real broker: two FSDP2 ranks (gloo, this CPU) train steps of the
groups on rb.batches and publish versions the policy servers load; killed with -9 after a step's publication,
the run resumes with one rank from the two ranks' checkpoint (full weights, each rank's optimizer shard), and every
group is trained exactly once, the versions 0, 1, 2, 3 without a gap or a repeat."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from schemas.codec import encode
from schemas.models import GroupBatch, ResourceVersion, TrainStep
from tests.integration.trainer.test_trainer_crash import N_GROUPS, _produce, _read_all, groups  # noqa: F401 - the fixture
from tests.tracker_files import READERS
from trainer.model import load_policy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _model_dir(tmp_path: Path) -> Path:
    """The tiny model as a model directory (`--model DIR`): what ranks other than 0 build on the meta device."""
    from trainer.model import build_tiny, save_policy

    return save_policy(*build_tiny(seed=0), tmp_path / "base")


def _train(env: dict[str, str], ckpt: Path, ranks: int, max_steps: int, crash: str | None = None,
           model: Path | None = None) -> subprocess.CompletedProcess[str]:
    run_env = dict(env, **({"ROLLOUTBUS_TRAINER_CRASH_AT": crash} if crash else {}))
    cmd = [sys.executable, "-m", "trainer.cli", "--nproc-per-node", str(ranks), "--groups-per-step", "2", "--idle-exit", "20",
           "--max-steps", str(max_steps), "--threads", "1", "--checkpoint-dir", str(ckpt), "--lr", "1e-3",
           *(["--model", str(model)] if model is not None else [])]
    return subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=300)


def test_two_ranks_train_and_one_rank_resumes_their_checkpoint(
        groups: list[GroupBatch], kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path) -> None:
    _produce(kafka_conf, topics.batches, [encode(g) for g in groups])
    ckpt = tmp_path / "ckpt"
    first = _train(test_env, ckpt, ranks=2, max_steps=3, crash="after_publish:2", model=_model_dir(tmp_path))
    assert first.returncode != 0, first.stderr[-3000:]
    assert "rank 1 of 2: the model sharded by FSDP2, its shard from rank 0's weights (built on the meta device)" \
        in first.stderr, first.stderr[-3000:]
    assert (ckpt / "step-2" / "model.safetensors").exists()
    # the optimizer state as each rank held it (DCP), nothing gathered on rank 0
    assert sorted(p.name for p in (ckpt / "step-2" / "optimizer.dcp").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (ckpt / "step-2" / "optimizer.pt").exists()
    second = _train(test_env, ckpt, ranks=1, max_steps=3)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from" in second.stderr and "version 3 (step 3)" in second.stdout, second.stderr[-2000:]
    assert "optimizer state: 2 ranks' shards" in second.stderr and "resharded to 1" in second.stderr, second.stderr[-2000:]

    versions = [r for r in _read_all(kafka_conf, topics.resources) if isinstance(r, ResourceVersion)]
    assert [v.version for v in versions] == [0, 1, 2, 3]
    steps = [r for r in _read_all(kafka_conf, topics.metrics) if isinstance(r, TrainStep)]
    assert sorted(gid for s in steps for gid in s.group_ids) == sorted(g.group_id for g in groups)  # each once
    assert steps[0].metrics["samples"] == 8.0  # both groups' samples, over the two ranks
    # the two ranks' published weights load as the policy servers load them, and differ from version 1's
    v1, v2 = (load_policy(next(v.uri for v in versions if v.version == n))[0] for n in (1, 2))
    assert any(not (a == b).all() for a, b in zip(v1.parameters(), v2.parameters()))


def test_two_ranks_train_lora_adapters_and_publish_them_merged(
        groups: list[GroupBatch], kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path,
        ch: Any) -> None:
    """--lora-rank 4 --activation-checkpointing --kl-beta on two ranks: versions are full HF weights (the adapters
    merged) that load as any version does; only the adapted projections moved; the KL to the reference, sharded as
    the policy, is in the loss once the policy moved."""
    _produce(kafka_conf, topics.batches, [encode(g) for g in groups])
    env = dict(test_env, ROLLOUTBUS_LORA_RANK="4", ROLLOUTBUS_ACTIVATION_CHECKPOINTING="true", ROLLOUTBUS_KL_BETA="0.05",
               ROLLOUTBUS_REPORT_TO="tensorboard,mlflow,wandb", ROLLOUTBUS_TRACKER_DIR=str(tmp_path / "trackers"))
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        env.pop(var, None)
    run = _train(env, tmp_path / "ckpt", ranks=2, max_steps=3, model=_model_dir(tmp_path))  # the reference on meta too
    assert run.returncode == 0, run.stderr[-3000:]
    assert "rank 1 of 2: the model sharded by FSDP2, its shard from rank 0's weights" in run.stderr, run.stderr[-3000:]
    steps = [r for r in _read_all(kafka_conf, topics.metrics) if isinstance(r, TrainStep)]
    assert len(steps) == 3 and steps[-1].metrics["kl"] > 0, [s.metrics.get("kl") for s in steps]
    # --report-to: rank 0 alone reports, every step's loss and KL as train_steps has them, in each tracker
    (run_dir,) = (tmp_path / "trackers" / "tensorboard").iterdir()
    live = {name: read(tmp_path / "trackers", run_dir.name)[0] for name, read in READERS.items()}
    for name, series in live.items():
        assert series["train/kl"] == [(s.step, round(s.metrics["kl"], 6)) for s in steps], name
        assert [step for step, _ in series["train/loss"]] == [1, 2, 3], name
    # rolloutbus export from the steps as ClickHouse holds them gives the live report's series, under its run name
    from rolloutbus.runs.export import export

    ch.insert("train_steps", [[s.run_id, s.step, s.time_ns, s.resource_version, s.group_ids, s.metrics] for s in steps],
              column_names=["run_id", "step", "time_ns", "resource_version", "group_ids", "metrics"])
    assert export(ch, "tensorboard,mlflow,wandb", tmp_path / "exported", "policy") == {run_dir.name: 3}
    for name, read in READERS.items():
        again = read(tmp_path / "exported", run_dir.name)[0]
        train = {tag: points for tag, points in live[name].items() if tag.startswith("train/")}
        assert train and train == again, name
    versions = [r for r in _read_all(kafka_conf, topics.resources) if isinstance(r, ResourceVersion)]
    assert [v.version for v in versions] == [0, 1, 2, 3] and versions[-1].config["lora_rank"] == "4"
    first, last = (dict(load_policy(versions[i].uri)[0].named_parameters()) for i in (1, -1))
    moved = sorted(n for n in first if not (first[n] == last[n]).all())
    assert moved and all(n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")) for n in moved), moved
    # beside the merged weights, the adapters alone (what vLLM's server loads at run time), on version 0's checkpoint,
    # which pruning keeps (3 kept, and it): peft loads them onto it and gets the version's weights
    import json

    import torch
    from peft import PeftModel

    adapter = Path(versions[-1].uri) / "adapter"
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(base) == Path(versions[0].uri).resolve() and Path(base).is_dir()
    merged = dict(PeftModel.from_pretrained(load_policy(base)[0], str(adapter)).merge_and_unload().named_parameters())
    assert merged.keys() == last.keys()
    assert all(torch.allclose(merged[n], last[n], atol=1e-5) for n in last)
    # the torch server with --lora-rank follows the versions as rb.resources lists them: version 0's weights once, then
    # each version's adapters alone on that model, which then holds the version's weights
    from trainer.serve import PolicyServer

    server = PolicyServer(None, lora_rank=4)
    server.load_version(versions[0].uri, 0)
    server._swap()
    held = server.policy.model
    for v in versions[1:]:
        server.load_version(v.uri, v.version)
        server._swap()
        assert (server.policy.version, server.policy.model is held) == (v.version, True)
    served = dict(held.named_parameters())
    assert all(torch.allclose(served[n], last[n], atol=1e-5) for n in last)
