"""``rolloutbus train --algorithm sft`` end to end: the filtered transitions read from the embedded ClickHouse
store, the tiny policy fine-tuned on them, one version per epoch published on rb.resources."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from schemas import codec
from schemas.models import ResourceVersion
from tests.integration.streams.helpers import ROOT, read_topic
from tests.integration.trainer.test_sft_filter import _rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_FILL = """
import json, sys
from foundation.clickhouse import open_store
c = open_store(sys.argv[1], "rolloutbus")
for table, rows in json.loads(sys.argv[2]).items():
    cols = list(rows[0])
    c.insert(table, [[r[k] for k in cols] for r in rows], column_names=cols)
"""


def _fill(test_env: dict[str, str]) -> None:
    """The filter test's rollouts and transitions, in the run's store."""
    rollouts, transitions = _rows(random.Random(3))
    dsn = f"chdb://{test_env['ROLLOUTBUS_DATA_DIR']}/clickhouse"
    fill = subprocess.run([sys.executable, "-c", _FILL, dsn, json.dumps({"rollouts": rollouts, "transitions": transitions})],
                          env=test_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert fill.returncode == 0, fill.stderr[-3000:]


def test_sft_trains_on_the_filtered_transitions_and_publishes_versions(kafka_conf: dict[str, Any], topics: Any,
                                                                       test_env: dict[str, str]) -> None:
    _fill(test_env)
    run = subprocess.run([sys.executable, "-m", "trainer.cli", "--algorithm", "sft", "--sft-top-k", "1", "--sft-key", "prompt",
                          "--sft-epochs", "2", "--sft-lr", "3e-3", "--metrics-port", "0"],
                         env=test_env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "SFT: 8 transitions pass the filter" in run.stdout  # the filter test's top-1 per prompt: 4 rollouts × 2 turns
    versions = [codec.decode(v) for _, v in read_topic(kafka_conf, topics.resources, 3, 30)]
    assert all(isinstance(v, ResourceVersion) for v in versions)
    assert [(v.name, v.version, v.step, v.config.get("algorithm")) for v in versions] == [
        ("policy", 0, 0, None), ("policy", 1, 1, "sft"), ("policy", 2, 2, "sft")]
    # the loss fell over the two epochs (the same eight pairs)
    losses = [line for line in run.stdout.splitlines() if line.startswith("SFT epoch")]
    first = float(losses[0].split("loss ")[1].split(" ")[0])
    last = float(losses[-1].split("→ ")[1].split(" ")[0])
    assert last < first, losses
    # GRPO goes on from the SFT's checkpoint training fewer layers (the SQL task's --train-layers): the weights carry
    # over, AdamW's moments (per trained parameter) cannot, so it starts them afresh instead of stopping
    grpo = subprocess.run([sys.executable, "-m", "trainer.cli", "--train-layers", "1", "--idle-exit", "3", "--metrics-port", "0"],
                          env=test_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert grpo.returncode == 0, (grpo.stdout + grpo.stderr)[-3000:]
    assert "trained --train-layers 0, this run --train-layers 1: its optimizer state does not carry over" in grpo.stderr
    assert "resuming from" in grpo.stderr and "step-2 " in grpo.stderr
    # a bad WHERE is one line and a non-zero exit, nothing published
    bad = subprocess.run([sys.executable, "-m", "trainer.cli", "--algorithm", "sft", "--sft-where", "1; DROP TABLE rollouts",
                          "--metrics-port", "0"], env=test_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "SFT filter" in bad.stderr and "Traceback" not in bad.stderr


def test_sft_with_lora_publishes_the_adapters_merged_into_full_weights(kafka_conf: dict[str, Any], topics: Any,
                                                                       test_env: dict[str, str]) -> None:
    """--algorithm sft --lora-rank 4: each version is full weights a policy server loads (the adapters merged, only
    the adapted projections moved), with the adapters beside them, as a GRPO run with LoRA publishes."""
    from trainer.model import load_policy

    _fill(test_env)
    run = subprocess.run([sys.executable, "-m", "trainer.cli", "--algorithm", "sft", "--lora-rank", "4", "--sft-epochs", "1",
                          "--sft-lr", "3e-2", "--metrics-port", "0"], env=test_env, cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    versions = [codec.decode(v) for _, v in read_topic(kafka_conf, topics.resources, 2, 30)]
    assert [(v.version, v.config.get("algorithm")) for v in versions] == [(0, None), (1, "sft")]
    before, after = (dict(load_policy(v.uri)[0].named_parameters()) for v in versions)
    moved = sorted(n for n in before if not (before[n] == after[n]).all())
    assert moved and all(n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")) for n in moved), moved
    assert (Path(versions[1].uri) / "adapter" / "adapter_model.safetensors").is_file()
