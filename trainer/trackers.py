"""The experiment trackers a training run reports to (``rolloutbus train --report-to tensorboard``): the run's
configuration once, every optimiser step's metrics (loss, KL, clip fraction, tokens/s, reward, staleness, ...) and
each version's validation score, named by the run so runs can be compared. ClickHouse stays the source of truth
(every step is in ``train_steps``); a tracker is a view for the tools a team already uses.

Each tracker is a class registered in :data:`TRACKERS` (``@TRACKERS.register("name")``; ``--report-to`` takes the
registry's names): built with the directory the run's files go under, the run's name and its configuration, it
takes ``log(step, metrics)`` and ``close()``. Built in: ``tensorboard`` (event files under
``<tracker dir>/tensorboard/<run>``: ``tensorboard --logdir <tracker dir>/tensorboard``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from foundation.errors import ConfigError
from foundation.registry import Registry


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


TRACKERS: Registry[Callable[[Path, str, Mapping[str, str]], Tracker]] = Registry("tracker")


def finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics a tracker can plot: numbers, finite. Pure."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


@TRACKERS.register("tensorboard")
class TensorBoard:
    """TensorBoard event files under <tracker dir>/tensorboard/<run> (torch.utils.tensorboard)"""

    def __init__(self, root: Path, run: str, config: Mapping[str, str]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch's writer needs the tensorboard package
            raise ConfigError(f"--report-to tensorboard needs the tensorboard package: pip install tensorboard ({exc})") from None
        self.dir = Path(root) / "tensorboard" / run
        self.writer = SummaryWriter(str(self.dir))
        self.writer.add_text("config", "\n\n".join(f"`{k}`: {v}" for k, v in sorted(config.items())), 0)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in finite(metrics).items():
            self.writer.add_scalar(key if "/" in key else f"train/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Trackers:
    """The trackers one run reports to, each called in turn."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    @classmethod
    def open(cls, names: str, root: Path, run: str, config: Mapping[str, str]) -> Trackers:
        """The trackers ``names`` names (comma-separated; empty: none); an unknown name is one line."""
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        return cls([TRACKERS.get(name)(root, run, config) for name in wanted])

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for tracker in self.trackers:
            tracker.log(step, metrics)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def check_names(names: str) -> str:
    """A settings validator: each comma-separated name is a registered tracker."""
    unknown = [n.strip() for n in names.split(",") if n.strip() and n.strip() not in TRACKERS]
    if unknown:
        raise ValueError(f"not a registered tracker: {', '.join(unknown)} (registered: {', '.join(TRACKERS.names())})")
    return names


__all__ = ["TRACKERS", "TensorBoard", "Tracker", "Trackers", "check_names", "finite"]
