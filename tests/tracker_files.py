"""What an experiment tracker holds, read back from its files as its own tools read them: each metric's series as
``{name: [(step, value), ...]}`` and the run's configuration, for TensorBoard event files, an MLflow file store and a
W&B offline run (``--report-to``, foundation/trackers.py)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.installs import installed

Series = dict[str, list[tuple[int, float]]]


def tensorboard(root: Path, run: str) -> tuple[Series, dict[str, str]]:
    """The scalars under ``<root>/tensorboard/<run>`` (TensorBoard's EventAccumulator); the config is text, not read."""
    accumulator = installed("tensorboard.backend.event_processing.event_accumulator", "pip install -e '.[all]'")
    ea = accumulator.EventAccumulator(str(Path(root) / "tensorboard" / run))
    ea.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}, {}


def mlflow(root: Path, run: str) -> tuple[Series, dict[str, str]]:
    """The run named ``run`` in the file store under ``<root>/mlflow`` (MlflowClient): its metrics and parameters."""
    import os

    installed("mlflow", "pip install -e '.[trackers]'")
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(Path(root) / "mlflow").resolve().as_uri())
    experiment = client.get_experiment_by_name("rolloutbus")
    assert experiment is not None, f"no experiment 'rolloutbus' under {root}/mlflow"
    (found,) = client.search_runs([experiment.experiment_id], filter_string=f"attributes.run_name = '{run}'")
    assert found.info.status == "FINISHED", found.info.status
    series = {key: [(m.step, round(m.value, 6)) for m in sorted(client.get_metric_history(found.info.run_id, key),
                                                                 key=lambda m: (m.step, m.timestamp))]
              for key in found.data.metrics}
    return series, dict(found.data.params)


def _records(path: Path) -> Iterator[bytes]:
    """The records of a W&B ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then LevelDB-log blocks of
    32 KiB, each record a 7-byte header (crc32, length, type: full 1, first 2, middle 3, last 4) and its bytes."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, parts = 7, 32768, []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if length == 0 and kind == 0:
            break
        parts.append(data[pos:pos + length])
        pos += length
        if kind in (1, 4):
            yield b"".join(parts)
            parts = []


def wandb(root: Path, run: str) -> tuple[Series, dict[str, Any]]:
    """The offline W&B run named ``run`` under ``<root>/wandb``: each logged row's metrics at its ``step``, and the
    run's config, from the protobuf records of its ``run-*.wandb`` file."""
    installed("wandb", "pip install -e '.[trackers]'")
    from wandb.proto import wandb_internal_pb2 as pb

    for path in sorted((Path(root) / "wandb").glob("offline-run-*/run-*.wandb")):
        series: Series = {}
        config: dict[str, Any] = {}
        name = None
        for data in _records(path):
            record = pb.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                name = record.run.display_name
                config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                for key, value in row.items():
                    if key != "step" and not key.startswith("_"):
                        series.setdefault(key, []).append((int(row["step"]), round(float(value), 6)))
        if name == run:
            return series, {k: v.get("value", v) if isinstance(v, dict) else v for k, v in config.items()
                            if not k.startswith("_")}
    raise AssertionError(f"no W&B run named {run} under {root}/wandb")


READERS = {"tensorboard": tensorboard, "mlflow": mlflow, "wandb": wandb}
