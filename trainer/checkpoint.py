"""Atomic checkpoints: ``step-N.tmp/`` written in full, fsynced, then renamed to ``step-N/``.

A checkpoint holds the weights (safetensors, via ``save_pretrained``) and the tokenizer, the optimizer
state (``optimizer.pt`` of one device; ``optimizer.dcp/``, each rank's shard, of several:
:func:`trainer.distributed.save_sharded_optimizer`) and ``manifest.json``: the step, the version it publishes as, the offsets of
``rb.batches`` consumed *through* this step, the group ids already trained on (for dedupe), the run
id and the TrainStep record. A directory without ``manifest.json`` or ending in ``.tmp`` is not a
checkpoint (a crash mid-write leaves at most such a directory, removed on the next start).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from foundation.errors import TrainingError
from trainer.model import save_policy
from trainer.tokenizer import Tokenizer

MANIFEST = "manifest.json"
OPTIMIZER = "optimizer.pt"
SHARDED_OPTIMIZER = "optimizer.dcp"  # a torch.distributed.checkpoint directory: one file per rank, and .metadata
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class Manifest:
    step: int
    version: int
    resource_name: str
    base_model: str
    run_id: str
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)  # topic → partition (str) → next offset
    seen_group_ids: list[str] = field(default_factory=list)
    group_ids: list[str] = field(default_factory=list)  # trained on in this step
    metrics: dict[str, float] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    created_ns: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Manifest":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """The checkpoints of one resource in one directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, step: int) -> Path:
        return self.root / f"step-{step}"

    def steps(self) -> list[int]:
        out = []
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and (p / MANIFEST).exists():
                out.append(int(m.group(1)))
        return sorted(out)

    def clean_partial(self) -> list[Path]:
        """Remove ``*.tmp`` leftovers of a crash mid-write."""
        gone = [p for p in self.root.glob("step-*.tmp")]
        for p in gone:
            shutil.rmtree(p, ignore_errors=True)
        return gone

    def latest(self) -> tuple[Path, Manifest] | None:
        steps = self.steps()
        if not steps:
            return None
        path = self.path(steps[-1])
        try:
            return path, Manifest.from_json(json.loads((path / MANIFEST).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise TrainingError(f"checkpoint {path} has an unreadable manifest ({exc}); move it aside to resume from the one before") from exc

    def prepare(self, step: int) -> Path:
        """The empty ``step-N.tmp/`` a checkpoint of ``step`` is written into (before :meth:`save`, when every rank
        writes its optimizer shard there first)."""
        if self.path(step).exists():
            raise TrainingError(f"checkpoint {self.path(step)} already exists: refusing to overwrite a published step")
        tmp = self.root / f"step-{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def save(self, model: Any, tok: Tokenizer, optimizer_state: dict[str, Any] | None, manifest: Manifest,
             state_dict: dict[str, Any] | None = None, tmp: Path | None = None) -> Path:
        """Write the checkpoint of ``manifest.step`` into ``tmp`` (:meth:`prepare`'s; a fresh one when None), fsync
        every file, then rename it to ``step-N/``."""
        final = self.path(manifest.step)
        if final.exists():
            raise TrainingError(f"checkpoint {final} already exists: refusing to overwrite a published step")
        tmp = tmp if tmp is not None else self.prepare(manifest.step)
        save_policy(model, tok, tmp, state_dict)
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / OPTIMIZER)
        (tmp / MANIFEST).write_text(json.dumps(asdict(manifest), indent=1, sort_keys=True))
        for d in [tmp, *(p for p in tmp.rglob("*") if p.is_dir())]:
            for f in d.iterdir():
                if f.is_file():
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
            _fsync_dir(d)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        return final

    def sharded_optimizer(self, path: Path) -> Path | None:
        """The checkpoint's optimizer state as its ranks wrote it (a DCP directory), or None (one device's, or none)."""
        d = path / SHARDED_OPTIMIZER
        return d if (d / ".metadata").exists() else None

    def load_optimizer(self, path: Path) -> dict[str, Any] | None:
        f = path / OPTIMIZER
        if not f.exists():
            return None
        try:
            state: dict[str, Any] = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises several unrelated types for a corrupt file
            raise TrainingError(f"cannot read optimizer state {f}: {exc}") from exc
        return state

    def prune(self, keep: int, protect: frozenset[int] = frozenset()) -> list[Path]:
        """Delete all but the newest ``keep`` checkpoints (servers may still be loading the newest) and the
        steps in ``protect`` (the version validation rates best)."""
        steps = self.steps()
        gone = [self.path(s) for s in steps[:-keep] if s not in protect] if keep > 0 else []
        for p in gone:
            shutil.rmtree(p, ignore_errors=True)
        return gone


__all__ = ["CheckpointStore", "Manifest", "MANIFEST", "OPTIMIZER", "SHARDED_OPTIMIZER"]
