"""``rolloutbus export``: a finished run's metrics replayed from ClickHouse (the source of truth) to the experiment
trackers (``--report-to``, :data:`foundation.trackers.TRACKERS`), for a run that was not reported live or a tracker
added afterwards. What a live ``rolloutbus train --report-to`` writes, under the same run name
(``<resource>-<run id>``) and at the same steps:

* every optimiser step's metrics (``train_steps.metrics``: loss, KL, clip fraction, tokens/s, reward, staleness);
* each version's validation score (``validation/mean_reward``: the mean final reward of its ``val``/``test``
  rollouts but the held-out evaluation's), and, beyond what the trainer sees, the training rollouts' mean reward and
  success rate by the version that made them (``rollouts/reward_mean``, ``rollouts/success``, ``rollouts/count``)
  and the held-out evaluation of ``fit``'s ``test_dataset`` and the demo (their ``heldout-*`` tasks:
  ``heldout/mean_reward``, ``heldout/success``, ``heldout/count``, version 0's and the version kept), each at the
  step that published the version (version 0 at step 0).

The row → series functions are pure; :func:`export` is the shell (a ClickHouse client in, trackers out).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

STEPS_SQL = ("SELECT run_id, step, resource_version, metrics FROM train_steps FINAL {where} ORDER BY run_id, step")
# kind: 0 training rollouts, 1 validation, 2 the held-out evaluation (rolloutbus.runs.evaluation's heldout-* tasks)
VERSIONS_SQL = (
    "SELECT resource_version AS version, multiIf(mode NOT IN ('val', 'test'), 0, startsWith(task_id, 'heldout-'), 2, 1) "
    "AS kind, avg(final_reward) AS reward, avg(final_reward > 0) AS success, count() AS n FROM rollouts FINAL "
    "WHERE resource_version IS NOT NULL AND final_reward IS NOT NULL GROUP BY version, kind ORDER BY version, kind"
)


def step_series(rows: Iterable[Sequence[Any]]) -> dict[str, list[tuple[int, dict[str, float]]]]:
    """``train_steps`` rows (run_id, step, resource_version, metrics) → each run's (step, metrics), in step order.
    Pure."""
    out: dict[str, list[tuple[int, dict[str, float]]]] = defaultdict(list)
    for run_id, step, _version, metrics in rows:
        out[str(run_id)].append((int(step), {str(k): float(v) for k, v in dict(metrics).items()}))
    return {run: sorted(steps, key=lambda s: s[0]) for run, steps in out.items()}


def version_steps(rows: Iterable[Sequence[Any]]) -> dict[int, int]:
    """``train_steps`` rows → the step that published each version (the first, where a version had several). Pure."""
    out: dict[int, int] = {}
    for _run, step, version, _metrics in rows:
        if version is not None:
            out[int(version)] = min(int(step), out.get(int(version), int(step)))
    return out


def version_series(rows: Iterable[Sequence[Any]], steps: Mapping[int, int]) -> list[tuple[int, dict[str, float]]]:
    """``VERSIONS_SQL`` rows (version, kind, reward, success, n) → (step, metrics) per version, at the step that
    published it (0 for a version no step made: the first). Pure."""
    by_version: dict[int, dict[str, float]] = defaultdict(dict)
    for version, kind, reward, success, n in rows:
        metrics = by_version[int(version)]
        if int(kind) == 2:
            metrics.update({"heldout/mean_reward": float(reward), "heldout/success": float(success), "heldout/count": float(n)})
        elif int(kind) == 1:
            metrics["validation/mean_reward"] = float(reward)
            metrics["validation/version"] = float(version)
        else:
            metrics.update({"rollouts/reward_mean": float(reward), "rollouts/success": float(success),
                            "rollouts/count": float(n)})
    return [(steps.get(v, 0), m) for v, m in sorted(by_version.items())]


def export(client: Any, report_to: str, root: Path, resource: str, run_id: str | None = None,
           database: str = "") -> dict[str, int]:
    """Replay the runs in ``client``'s database (or the one ``run_id`` names) to the trackers ``report_to`` names,
    under ``root``; returns the steps written per run name."""
    from foundation.trackers import Trackers

    where, params = ("WHERE run_id = {run:String}", {"run": run_id}) if run_id else ("", {})
    step_rows = client.query(STEPS_SQL.format(where=where), parameters=params).result_rows
    per_run = step_series(step_rows)
    # the rollouts' versions belong to the run when the database holds one (a fit run's, a deployment's)
    versions = version_series(client.query(VERSIONS_SQL).result_rows, version_steps(step_rows)) if len(per_run) == 1 else []
    written: dict[str, int] = {}
    for run, steps in per_run.items():
        name = f"{resource}-{run}"
        trackers = Trackers.open(report_to, root, name, {"source": "clickhouse", "database": database, "run_id": run})
        try:
            for step, metrics in steps:
                trackers.log(step, metrics)
            for step, metrics in versions:
                trackers.log(step, metrics)
        finally:
            trackers.close()
        written[name] = len(steps)
    return written


__all__ = ["STEPS_SQL", "VERSIONS_SQL", "export", "step_series", "version_series", "version_steps"]
