"""Tasks chosen by what teaches: each task's recent rewards, read from ClickHouse, decide whether it is worth
generating another group for.

A GRPO group teaches only when its rewards differ. A task whose last ``k`` rollouts all earned the same reward (a
task always failed, or always solved) will most likely give another group that teaches nothing, and DAPO's dynamic
sampling can only drop such a group after it was generated, judged and shipped. The feeder asks first: such a task
is skipped, except with probability ``explore`` (it may have become learnable, or been forgotten), and a task with
fewer than ``k`` finished rollouts is taken, unless its *family* says otherwise.

A task's family (``metadata["task_family"]``: the SQL demo's question level, the calculator's keywords, any label a
producer sets) speaks for the task until the task has ``k`` rollouts of its own. In a short run with many tasks
each comes round once or not at all, so its own history never forms; its family's does. A family's recent pass
rate ``p`` (its last ``family_k`` rollouts) gives the chance that a group of ``G`` teaches,
``1 - p^G - (1-p)^G``, and an unknown task of a known family is taken with that chance (at least ``explore``):
generation goes to the families whose groups teach, in proportion to how often they do.

A task is known by its *key*: the task's ``metadata["task_key"]`` when it has one (the feeder sets it to a digest
of the problem, so the same problem published again under a new task id is the same task), else its ``task_id``.
Rollouts keep their task's metadata, so ``rollouts.metadata['task_key']`` carries it to ClickHouse.

The rule (:func:`teaches`, :func:`take`) is pure; :func:`recent_tasks_and_families` is the one query (one scan of
``rollouts`` for the tasks and their families).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

TASK_KEY = "task_key"
TASK_FAMILY = "task_family"


def task_key(problem_json: str) -> str:
    """A stable key for a problem: a digest of its JSON (the same problem, the same key, in any run). Pure."""
    return hashlib.sha1(problem_json.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Recent:
    """A task's last finished rollouts (at most ``k``): how many, their lowest and highest reward, how many passed."""

    rollouts: int
    low: float
    high: float
    passed: int

    @property
    def pass_rate(self) -> float:
        return self.passed / self.rollouts if self.rollouts else 0.0


def teaches(recent: Recent | None, k: int) -> bool | None:
    """True: its recent rewards differ; False: its last ``k`` (or more) all earned the same; None: fewer than ``k``
    known (unknown). Pure."""
    if recent is None or recent.rollouts < k:
        return None
    return recent.high > recent.low


def teach_probability(pass_rate: float, group_size: int) -> float:
    """The chance that a group of ``group_size`` rollouts, each passing with ``pass_rate``, has differing rewards:
    ``1 - p^G - (1-p)^G``. Pure."""
    p = min(max(pass_rate, 0.0), 1.0)
    return max(0.0, 1.0 - p ** group_size - (1.0 - p) ** group_size)


def take(recent: Recent | None, k: int, explore: float, rng: random.Random, family: Recent | None = None,
         group_size: int = 4) -> bool:
    """Whether to generate a group for a task now: teaching, yes; one whose last ``k`` rollouts all earned the same,
    only with probability ``explore``; with fewer than ``k`` of its own that differ, yes; else unknown: yes, or when its
    ``family`` has ``k`` rollouts or more, with the chance that a group of the family teaches (:func:`teach_probability`, at least ``explore``). Pure (given ``rng``)."""
    verdict = teaches(recent, k)
    if verdict is None and recent is not None and recent.high > recent.low:
        return True  # fewer than k of its own, but they already differ: it teaches, whatever its family does
    if verdict is None and family is not None and family.rollouts >= k:
        return rng.random() < max(explore, teach_probability(family.pass_rate, group_size))
    return verdict is not False or rng.random() < explore


BOTH_SQL = """
SELECT kind, key, count() AS rollouts, min(final_reward) AS low, max(final_reward) AS high,
       countIf(final_reward >= {pass_at:Float64}) AS passed
FROM (
    SELECT kind, key, final_reward,
           row_number() OVER (PARTITION BY kind, key ORDER BY finished_ns DESC) AS recency
    FROM (
        SELECT final_reward, finished_ns,
               arrayJoin([('task', if(metadata['task_key'] != '', metadata['task_key'], task_id)),
                          ('family', metadata['task_family'])]) AS kk, kk.1 AS kind, kk.2 AS key
        FROM rollouts FINAL
        WHERE mode = 'train' AND final_reward IS NOT NULL AND finished_ns > 0
    )
    WHERE kind = 'task' OR key != ''
)
WHERE recency <= if(kind = 'task', {k:UInt32}, {family_k:UInt32})
GROUP BY kind, key
"""


def recent_tasks_and_families(client: Any, k: int, family_k: int, pass_at: float = 1.0) -> tuple[dict[str, Recent], dict[str, Recent]]:
    """:func:`recent_rewards` of the tasks (last ``k``) and of the families (last ``family_k``) in one scan of
    ``rollouts``: what a curriculum refresh reads."""
    rows = client.query(BOTH_SQL, parameters={"k": k, "family_k": family_k, "pass_at": pass_at}).result_rows
    out: dict[str, dict[str, Recent]] = {"task": {}, "family": {}}
    for kind, key, n, lo, hi, p in rows:
        out[str(kind)][str(key)] = Recent(int(n), float(lo), float(hi), int(p))
    return out["task"], out["family"]


def recent_rewards(client: Any, k: int, pass_at: float = 1.0, families: bool = False) -> dict[str, Recent]:
    """Each task key's last ``k`` finished train rollouts in the client's database (``rollouts``): their count, lowest
    and highest final reward, and how many reached ``pass_at``; with ``families``, each task family's instead."""
    tasks, fams = recent_tasks_and_families(client, k, k, pass_at)
    return fams if families else tasks


@dataclass
class Curriculum:
    """The feeder's view of what teaches: the recent rewards per task key (and per task family, with
    ``read_families``), refreshed from ClickHouse at most every ``refresh_s``; :meth:`take` decides one task. Counts
    what it skipped and why, for the run's report."""

    read: Callable[[], dict[str, Recent]]
    k: int = 8
    explore: float = 0.1
    refresh_s: float = 10.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    read_families: Callable[[], dict[str, Recent]] | None = None
    group_size: int = 4  # the groups generated: a family's chance of teaching is a group's
    recent: dict[str, Recent] = field(default_factory=dict)
    families: dict[str, Recent] = field(default_factory=dict)
    skipped_solved: int = 0
    skipped_unsolved: int = 0
    skipped_family: int = 0  # unknown tasks passed over on their family's chance of teaching
    _read_at: float = -1e18
    _failing: bool = False

    def refresh(self, now: float | None = None) -> None:
        """Read the recent rewards again when ``refresh_s`` has passed. A failed read keeps what was read before (every
        task taken, before the first), said once until a read succeeds again."""
        now = time.monotonic() if now is None else now
        if now - self._read_at < self.refresh_s:
            return
        self._read_at = now
        try:
            recent = self.read()
            self.families = self.read_families() if self.read_families is not None else {}
            self.recent = recent
            self._failing = False
        except Exception as exc:  # noqa: BLE001 - ClickHouse unreachable or not yet migrated: choose with what we have
            if not self._failing:
                log.warning("task selection: cannot read the tasks' recent rewards (%s); choosing with what was read before",
                            str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            self._failing = True

    def take(self, key: str, family: str | None = None, group_size: int | None = None) -> bool:
        r = self.recent.get(key)
        f = self.families.get(family) if family else None
        if take(r, self.k, self.explore, self.rng, f, group_size or self.group_size):
            return True
        if teaches(r, self.k) is None:
            self.skipped_family += 1
        elif r is not None and r.passed == r.rollouts:
            self.skipped_solved += 1
        else:
            self.skipped_unsolved += 1
        return False

    def next_of(self, keys: Iterable[tuple[int, str, str | None]]) -> int | None:
        """The first index whose task :meth:`take` accepts, of ``(index, key, family)`` in the order offered; None
        when it accepts none of them (every task decided: the caller takes the next one anyway)."""
        for i, key, family in keys:
            if self.take(key, family):
                return i
        return None


def pass_rate_curriculum(settings: Any, k: int = 8, explore: float = 0.1, refresh_s: float = 10.0, seed: int = 0,
                         group_size: int = 4, family_k: int | None = None) -> Curriculum:
    """A curriculum reading the run's own ClickHouse database (``settings``: a CommonSettings), connecting on first
    use and again after a failure; task families judged over their last ``family_k`` rollouts (default ``4 * k``)."""
    from foundation.clickhouse import connect

    client: dict[str, Any] = {}
    families: dict[str, dict[str, Recent]] = {}

    def read() -> dict[str, Recent]:  # one scan for both; read_families hands over the families half
        if "c" not in client:
            client["c"] = connect(settings.dsn, database=settings.clickhouse_database, password=settings.clickhouse_password,
                                  create_database=False)
        try:
            tasks, families["last"] = recent_tasks_and_families(client["c"], k, family_k or 4 * k)
        except Exception:
            client.pop("c").close()
            raise
        return tasks

    return Curriculum(read, k=k, explore=explore, refresh_s=refresh_s, rng=random.Random(seed),
                      read_families=lambda: families.pop("last", {}), group_size=group_size)


__all__ = ["BOTH_SQL", "pass_rate_curriculum", "Curriculum", "Recent", "TASK_FAMILY", "TASK_KEY",
           "recent_rewards", "recent_tasks_and_families", "take", "task_key", "teach_probability", "teaches"]
