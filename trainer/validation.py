"""Validation of each published version: the runners score it, the trainer keeps the best, not the last.

A validation set (a JSONL file, one task input per line) is published as mode-``test`` tasks each time a
version is published (every ``validate_every``-th version, the initial weights included). Runners run
them like any task — greedily, since they are ``test`` rollouts — on the version serving at that moment,
and the stream processor writes them to ``rollouts`` (never into a training group). A version's score is
read from ClickHouse by the version each rollout *recorded* (the one that answered), one answer per
(version, validation task): a task published for version 3 but answered by version 4 counts for 4.

Pure core: :func:`scores_from_rows`, :func:`best`, :func:`should_stop`. Shell: :class:`Validator`
(publishes the tasks through the trainer's producer, reads the scores through a ClickHouse client).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation.errors import ConfigError

log = logging.getLogger(__name__)

MAX_RESENDS = 3  # times a version's stale validation tasks are published again
RUN_KEY = "validation.run"
TASK_KEY = "validation.task"
FOR_KEY = "validation.for"


@dataclass(frozen=True)
class VersionScore:
    version: int
    answered: int  # distinct validation tasks answered by this version
    mean: float  # mean reward over them


def scores_from_rows(rows: Iterable[tuple[Any, Any, Any]], tasks: int) -> dict[int, VersionScore]:
    """``(version, task index, reward)`` rows → a score per version; one answer per (version, task) (the
    highest, as a re-run of a greedy task gives the same), indices outside ``0..tasks-1`` ignored."""
    by_version: dict[int, dict[int, float]] = {}
    for version, index, reward in rows:
        if version is None or not 0 <= int(index) < tasks:
            continue
        answers = by_version.setdefault(int(version), {})
        r = float(reward or 0.0)
        answers[int(index)] = max(r, answers.get(int(index), r))
    return {v: VersionScore(v, len(a), sum(a.values()) / len(a)) for v, a in by_version.items() if a}


def complete(scores: dict[int, VersionScore], tasks: int) -> list[VersionScore]:
    """The versions every validation task answered, oldest first."""
    return [scores[v] for v in sorted(scores) if scores[v].answered >= tasks]


def best(scores: dict[int, VersionScore], tasks: int) -> VersionScore | None:
    """The fully validated version with the highest mean; a tie goes to the older version."""
    done = complete(scores, tasks)
    return max(done, key=lambda s: (s.mean, -s.version)) if done else None


def should_stop(scores: dict[int, VersionScore], tasks: int, patience: int) -> bool:
    """True once ``patience`` fully validated versions newer than the best have not beaten it (0: never)."""
    winner = best(scores, tasks)
    if patience <= 0 or winner is None:
        return False
    return sum(1 for s in complete(scores, tasks) if s.version > winner.version) >= patience


def load_tasks(path: Path) -> list[str]:
    """The validation set: one task input per non-empty line (kept as text, as ``Task.input`` carries it)."""
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines()]
    except OSError as exc:
        raise ConfigError(f"cannot read the validation tasks {path}: {exc.strerror or exc}") from exc
    inputs = [line for line in lines if line]
    if not inputs:
        raise ConfigError(f"the validation tasks file {path} has no task (one task input per line)")
    return inputs


def _sql_str(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def scores_query(run_id: str) -> str:
    """``(version, task index, reward)`` of one training run's validation rollouts that finished."""
    return (f"SELECT resource_version, toUInt32OrZero(metadata[{_sql_str(TASK_KEY)}]) AS i, max(ifNull(final_reward, 0)) "
            f"FROM rollouts FINAL WHERE mode = 'test' AND metadata[{_sql_str(RUN_KEY)}] = {_sql_str(run_id)} "
            f"AND finished_ns > 0 AND resource_version IS NOT NULL GROUP BY resource_version, i")


def restale(rows: Iterable[tuple[Any, Any]], version: int, tasks: int) -> list[int]:
    """The tasks published for ``version`` that an older version answered (the server had not loaded it yet)
    and ``version`` has not: they are published again. ``rows``: ``(task index, recorded version)`` of the
    finished rollouts of the tasks published for ``version``."""
    by = [(int(i), v) for i, v in rows if 0 <= int(i) < tasks]
    own = {i for i, v in by if v is not None and int(v) >= version}
    return sorted({i for i, v in by if (v is None or int(v) < version) and i not in own})


def for_version_query(run_id: str, version: int) -> str:
    """``(task index, recorded version)`` of the finished rollouts of the tasks published for ``version``."""
    return (f"SELECT toUInt32OrZero(metadata[{_sql_str(TASK_KEY)}]), resource_version FROM rollouts FINAL "
            f"WHERE mode = 'test' AND metadata[{_sql_str(RUN_KEY)}] = {_sql_str(run_id)} "
            f"AND metadata[{_sql_str(FOR_KEY)}] = {_sql_str(str(version))} AND finished_ns > 0")


def read_scores(client: Any, run_id: str, tasks: int) -> dict[int, VersionScore]:
    """Each version's validation score so far, from ClickHouse."""
    return scores_from_rows(client.query(scores_query(run_id)).result_rows, tasks)


class Validator:
    """Publishes a version's validation tasks; reads the scores back; says when to stop."""

    def __init__(self, inputs: list[str], run_id: str, topic: str, publish: Callable[[str, str, bytes], None],
                 client: Callable[[], Any], every: int = 1, patience: int = 0, poll_s: float = 5.0) -> None:
        self.inputs, self.run_id, self.topic, self.publish = inputs, run_id, topic, publish
        self._client_factory, self._client = client, None
        self.every, self.patience, self.poll_s = max(1, every), patience, poll_s
        self.scores: dict[int, VersionScore] = {}
        self.published: list[int] = []  # versions whose validation tasks were published
        self._resent: dict[int, int] = {}
        self._polled = 0.0

    def on_version(self, version: int) -> int:
        """Publish the validation tasks for a newly published version (every ``every``-th); returns how many."""
        if version % self.every:
            return 0
        self.published.append(version)
        return self._send(version, range(len(self.inputs)), "")

    def _send(self, version: int, indices: Iterable[int], suffix: str) -> int:
        from schemas import Task, encode

        now, sent = time.time_ns(), 0
        for i in indices:
            inp = self.inputs[i]
            meta = {RUN_KEY: self.run_id, TASK_KEY: str(i), FOR_KEY: str(version)}
            try:
                question = json.loads(inp).get("question")
            except (ValueError, AttributeError):
                question = None
            if isinstance(question, str):
                meta["question"] = question[:500]
            task = Task(task_id=f"val-{self.run_id}-v{version}-{i:04d}{suffix}", input=inp, mode="test", group_size=1,
                        created_ns=now, metadata=meta)
            self.publish(self.topic, task.task_id, encode(task))
            sent += 1
        return sent

    def republish_stale(self, version: int) -> int:
        """Publish again the tasks for ``version`` an older version answered (at most ``MAX_RESENDS`` times a version)."""
        done = self._resent.get(version, 0)
        if done >= MAX_RESENDS or self._client is None:
            return 0
        stale = restale(self._client.query(for_version_query(self.run_id, version)).result_rows, version, len(self.inputs))
        if not stale:
            return 0
        self._resent[version] = done + 1
        log.info("validation: %d tasks for version %d were answered by an older version: published again", len(stale), version)
        return self._send(version, stale, f"-r{done + 1}")

    def poll(self, force: bool = False) -> dict[int, VersionScore]:
        """Re-read the scores (at most every ``poll_s``); a store that does not answer keeps the last ones."""
        if not force and time.monotonic() - self._polled < self.poll_s:
            return self.scores
        self._polled = time.monotonic()
        try:
            if self._client is None:
                self._client = self._client_factory()
            self.scores = read_scores(self._client, self.run_id, len(self.inputs))
            if self.published:
                self.republish_stale(self.published[-1])
        except Exception as exc:  # noqa: BLE001 - validation is advisory: training goes on without it
            log.warning("validation scores unreadable (training goes on): %s", str(exc).splitlines()[0] if str(exc) else exc)
            self._client = None
        return self.scores

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def best(self) -> VersionScore | None:
        return best(self.scores, len(self.inputs))

    def should_stop(self) -> bool:
        return should_stop(self.poll(), len(self.inputs), self.patience)

    def summary(self) -> str:
        done = complete(self.scores, len(self.inputs))
        b = self.best
        if b is None:
            return f"validation: no version answered all {len(self.inputs)} tasks yet"
        shown = ", ".join(f"v{s.version} {s.mean:.1%}" for s in done)
        return f"validation on {len(self.inputs)} tasks: {shown}; best version {b.version} ({b.mean:.1%})"


__all__ = ["MAX_RESENDS", "for_version_query", "restale", "FOR_KEY", "RUN_KEY", "TASK_KEY", "Validator", "VersionScore", "best", "complete", "load_tasks", "read_scores",
           "scores_from_rows", "scores_query", "should_stop"]
