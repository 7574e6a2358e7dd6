"""The experiment trackers a run reports to (``rolloutbus train|process|export --report-to tensorboard,mlflow,wandb``):
the run's configuration once, then its metrics by step — the trainer's every optimiser step (loss, KL, clip fraction,
tokens/s, reward, staleness, ...) and each version's validation score; the stream worker's groups as they are emitted
(:mod:`streams.report`) — named by the run so runs can be compared. ClickHouse stays the source of truth (every step
is in ``train_steps``, every group in ``groups``); a tracker is a view for the tools a team already uses.

Each tracker is a class registered in :data:`TRACKERS` (``@TRACKERS.register("name")``; ``--report-to`` takes the
registry's names): built with the directory the run's files go under, the run's name and its configuration, it
takes ``log(step, metrics)`` and ``close()``. Built in (each from the ``trackers`` extra):

- ``tensorboard``: event files under ``<tracker dir>/tensorboard/<run>`` (``tensorboard --logdir <tracker dir>/tensorboard``);
- ``mlflow``: a run named ``<run>`` in the experiment ``rolloutbus`` (``MLFLOW_EXPERIMENT_NAME``) of the tracking
  server ``MLFLOW_TRACKING_URI`` names, else of a file store under ``<tracker dir>/mlflow``
  (``mlflow ui --backend-store-uri <tracker dir>/mlflow``); the configuration as the run's parameters;
- ``wandb``: a Weights & Biases run named ``<run>`` in the project ``rolloutbus`` (``WANDB_PROJECT``), its files under
  ``<tracker dir>/wandb``; online when ``WANDB_API_KEY`` is set (or ``WANDB_MODE`` says), otherwise offline, which it
  says once (``wandb sync <tracker dir>/wandb/offline-run-*`` uploads it later). Each point carries its
  ``step`` as the x-axis, since W&B's own step only rises and a version's score is logged at an earlier step.

Every tracker names a metric as TensorBoard does (:func:`tag`): ``train/<name>`` unless it has a section already.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from foundation.errors import ConfigError
from foundation.registry import Registry


log = logging.getLogger(__name__)


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


def tag(key: str) -> str:
    """A metric's name in every tracker: ``train/<key>`` unless it names its section already. Pure."""
    return key if "/" in key else f"train/{key}"


def _needs(module: str, tracker: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"--report-to {tracker} needs the {tracker} package: pip install -e '.[trackers]' ({exc})") from None


@TRACKERS.register("tensorboard")
class TensorBoard:
    """TensorBoard event files under <tracker dir>/tensorboard/<run> (torch.utils.tensorboard)"""

    def __init__(self, root: Path, run: str, config: Mapping[str, str]) -> None:
        _needs("tensorboard", "tensorboard")  # torch's writer needs the tensorboard package
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(root) / "tensorboard" / run
        self.writer = SummaryWriter(str(self.dir))
        self.writer.add_text("config", "\n\n".join(f"`{k}`: {v}" for k, v in sorted(config.items())), 0)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in finite(metrics).items():
            self.writer.add_scalar(tag(key), value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@TRACKERS.register("mlflow")
class MLflow:
    """An MLflow run named by the run (MLFLOW_TRACKING_URI, else a file store under <tracker dir>/mlflow)"""

    BATCH = 100  # the most parameters one log_batch takes

    def __init__(self, root: Path, run: str, config: Mapping[str, str]) -> None:
        mlflow = _needs("mlflow", "mlflow")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or (Path(root) / "mlflow").resolve().as_uri()
        if self.uri.startswith("file:"):
            # MLflow 3 keeps its file store in maintenance and refuses it unless asked; a local run asks.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.mlflow = mlflow
        self.client = MlflowClient(tracking_uri=self.uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "rolloutbus")
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment, run_name=run, tags={"rolloutbus.run": run}).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in sorted(config.items())]
        for i in range(0, len(params), self.BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + self.BATCH])

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [Metric(tag(k), v, now, step) for k, v in finite(metrics).items()]
        if points:
            self.client.log_batch(self.run_id, metrics=points)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def wandb_mode(env: Mapping[str, str], reachable: Any) -> tuple[str, str]:
    """W&B's mode and why: ``WANDB_MODE`` as given; else offline without ``WANDB_API_KEY``, or when its server
    (``WANDB_BASE_URL``, default https://api.wandb.ai) cannot be reached — ``reachable(url)`` asks; else online.
    Pure but for ``reachable``."""
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"], "WANDB_MODE"
    if not env.get("WANDB_API_KEY"):
        return "offline", "no WANDB_API_KEY"
    url = env.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    if not reachable(url):
        return "offline", f"{url} cannot be reached"
    return "online", "WANDB_API_KEY"


def _reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to ``url``'s host and port opens within ``timeout`` seconds."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)), timeout):
            return True
    except OSError:
        return False


@TRACKERS.register("wandb")
class WandB:
    """A Weights & Biases run named by the run, files under <tracker dir>/wandb; offline without WANDB_API_KEY or
    without a network to its server"""

    def __init__(self, root: Path, run: str, config: Mapping[str, str]) -> None:
        wandb = _needs("wandb", "wandb")
        self.dir = Path(root) / "wandb"  # wandb.init(dir=root) writes under <root>/wandb
        Path(root).mkdir(parents=True, exist_ok=True)
        mode, why = wandb_mode(os.environ, _reachable)
        settings = wandb.Settings(silent=True, console="off", save_code=False, disable_git=True, x_disable_stats=True)
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rolloutbus"), name=run, dir=str(root),
                              config=dict(config), mode=mode, settings=settings, reinit="create_new")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        if mode == "offline":
            log.warning("W&B runs offline (%s): %s; `wandb sync %s` uploads it", why, self.run.dir,
                        Path(self.run.dir).parent)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        points = {tag(k): v for k, v in finite(metrics).items()}
        if points:
            self.run.log({**points, "step": step})

    def close(self) -> None:
        self.run.finish()
        # finish() can return before wandb-core has flushed the run's file; its teardown waits for that (the
        # next run in this process starts the service again)
        self.wandb.teardown()


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


__all__ = ["TRACKERS", "MLflow", "TensorBoard", "Tracker", "Trackers", "WandB", "check_names", "finite", "tag"]
