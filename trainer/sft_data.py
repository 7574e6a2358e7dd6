"""What SFT on the bus trains on: the transitions of the rollouts that pass a filter, read from ClickHouse.

The filter (:class:`SFTFilter`) picks *rollouts* (attempts) from ``rollouts FINAL`` — train mode, with a
final reward — in this order:

1. the operator's SQL ``where`` over the ``rollouts`` columns (``task_id = 'calc' AND finished_ns > ...``);
2. ``min_reward``: final reward ≥ it;
3. ``top_k``: the k best by final reward within each ``key`` (ties by rollout id) — ``task`` (the task id)
   or ``prompt`` (the first turn's prompt token ids, hashed: the same request seen more than once, for
   task-less traffic);

and every trained transition (``transitions FINAL``, ``trained``) of a picked attempt becomes one (prompt ids,
response ids) pair. :func:`sft_sql` is the whole filter as one statement: what it returns is what trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEYS = {
    "task": "r.task_id",
    # the first turn's prompt: cityHash64 of its token ids (a rollout with no turn 0 keys by itself)
    "prompt": "if(p.prompt_key = 0, cityHash64(r.rollout_id), p.prompt_key)",
}


@dataclass(frozen=True)
class SFTFilter:
    """Which rollouts' transitions SFT trains on (see the module)."""

    top_k: int | None = None
    min_reward: float | None = None
    where: str | None = None
    key: str = "task"

    def __post_init__(self) -> None:
        if self.key not in KEYS:
            raise ValueError(f"SFT filter key must be one of {sorted(KEYS)}, got {self.key!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.where is not None and ";" in self.where:
            raise ValueError("the SFT filter's WHERE is one condition, without ';'")


def sft_sql(f: SFTFilter) -> str:
    """The statement whose rows are the pairs: (rollout_id, attempt_id, turn, prompt ids, response ids, final reward)."""
    conds = ["r.mode = 'train'", "r.final_reward IS NOT NULL"]
    if f.min_reward is not None:
        conds.append(f"r.final_reward >= {float(f.min_reward)!r}")
    if f.where:
        conds.append(f"({f.where})")
    key = KEYS[f.key]
    ranked = (
        "SELECT r.rollout_id AS rollout_id, r.attempt_id AS attempt_id, r.final_reward AS final_reward, "
        f"row_number() OVER (PARTITION BY {key} ORDER BY r.final_reward DESC, r.rollout_id, r.attempt_id) AS rank "
        "FROM (SELECT * FROM rollouts FINAL) AS r "
        "LEFT JOIN (SELECT rollout_id, attempt_id, cityHash64(prompt_token_ids) AS prompt_key FROM transitions FINAL "
        "WHERE turn = 0) AS p ON p.rollout_id = r.rollout_id AND p.attempt_id = r.attempt_id "
        f"WHERE {' AND '.join(conds)}"
    )
    picked = f"SELECT rollout_id, attempt_id, final_reward FROM ({ranked})" + (f" WHERE rank <= {int(f.top_k)}" if f.top_k else "")
    return (
        "SELECT t.rollout_id, t.attempt_id, t.turn, t.prompt_token_ids, t.response_token_ids, k.final_reward "
        f"FROM (SELECT * FROM transitions FINAL WHERE trained) AS t INNER JOIN ({picked}) AS k "
        "ON t.rollout_id = k.rollout_id AND t.attempt_id = k.attempt_id "
        "ORDER BY t.rollout_id, t.attempt_id, t.turn"
    )


def read_pairs(client: Any, f: SFTFilter) -> list[tuple[list[int], list[int]]]:
    """The (prompt ids, response ids) pairs the filter picks, read with ``client`` (a read-only one: the
    operator's WHERE runs as written)."""
    return [(list(row[3]), list(row[4])) for row in client.query(sft_sql(f)).result_rows if len(row[4])]


__all__ = ["KEYS", "SFTFilter", "read_pairs", "sft_sql"]
