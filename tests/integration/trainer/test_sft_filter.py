"""SFT's filter on the real ClickHouse engine (chDB): it picks exactly the transitions its rules say — the
operator's WHERE, the reward threshold, the top k per task or per prompt — worked out here in Python from
the same rows."""

from __future__ import annotations

import random
from typing import Any

import pytest

from foundation.clickhouse import open_store
from trainer.sft_data import SFTFilter, read_pairs, sft_sql

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _rows(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rollouts, transitions = [], []
    for i in range(40):
        rid, aid = f"r{i:02d}", f"r{i:02d}-a1"
        task = ["calc", "sql", ""][i % 3]
        mode = "test" if i % 11 == 0 else "train"
        reward = None if i % 13 == 5 else float(rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]))
        prompt0 = [7, i % 4]  # four distinct first prompts: the prompt keys
        rollouts.append({"rollout_id": rid, "attempt_id": aid, "task_id": task, "mode": mode, "attempt": 1,
                         "resource_version": i % 3, "status": "succeeded", "final_reward": reward, "started_ns": i,
                         "finished_ns": 1000 + i, "span_count": 2, "spans_seen": 2, "missing_sequence_ids": [],
                         "transition_count": 2, "group_id": "", "error": None, "metadata": {}, "updated_ns": 1})
        for turn in range(2):
            transitions.append({"rollout_id": rid, "attempt_id": aid, "turn": turn, "task_id": task, "span_id": f"{rid}-{turn}",
                                "agent_name": "a", "resource_version": i % 3,
                                "prompt_token_ids": prompt0 if turn == 0 else [8, i], "response_token_ids": [i, turn],
                                "response_logprobs": [-0.1, -0.1], "response_mask": [1, 1], "reward": 0.0, "return_": 0.0,
                                "advantage": 0.0, "trained": not (i % 7 == 3 and turn == 1), "group_id": "", "credit": "identical",
                                "updated_ns": 1})
    return rollouts, transitions


def _expected(rollouts: list[dict[str, Any]], transitions: list[dict[str, Any]], f: SFTFilter, where: Any) -> list[tuple[list[int], list[int]]]:
    first = {t["rollout_id"]: tuple(t["prompt_token_ids"]) for t in transitions if t["turn"] == 0}
    ok = [r for r in rollouts if r["mode"] == "train" and r["final_reward"] is not None and where(r)
          and (f.min_reward is None or r["final_reward"] >= f.min_reward)]
    by_key: dict[Any, list[dict[str, Any]]] = {}
    for r in ok:
        by_key.setdefault(r["task_id"] if f.key == "task" else first[r["rollout_id"]], []).append(r)
    picked = set()
    for members in by_key.values():
        members.sort(key=lambda r: (-r["final_reward"], r["rollout_id"]))
        picked |= {r["rollout_id"] for r in members[: f.top_k or len(members)]}
    return [(t["prompt_token_ids"], t["response_token_ids"]) for t in sorted(transitions, key=lambda t: (t["rollout_id"], t["turn"]))
            if t["rollout_id"] in picked and t["trained"]]


def test_the_filter_selects_exactly_what_it_says(tmp_path: Any) -> None:
    client = open_store(f"chdb://{tmp_path}/clickhouse", "rolloutbus")
    rollouts, transitions = _rows(random.Random(3))
    for table, rows in (("rollouts", rollouts), ("transitions", transitions)):
        cols = list(rows[0])
        client.insert(table, [[r[c] for c in cols] for r in rows], column_names=cols)
    cases = [
        (SFTFilter(), lambda r: True),
        (SFTFilter(min_reward=0.75), lambda r: True),
        (SFTFilter(top_k=2), lambda r: True),
        (SFTFilter(top_k=1, key="prompt"), lambda r: True),
        (SFTFilter(top_k=3, min_reward=0.25, where="r.task_id = 'calc' OR r.resource_version = 2"),
         lambda r: r["task_id"] == "calc" or r["resource_version"] == 2),
        (SFTFilter(where="finished_ns >= 1020"), lambda r: r["finished_ns"] >= 1020),
    ]
    for f, where in cases:
        want = _expected(rollouts, transitions, f, where)
        assert want, f  # each case picks something
        assert read_pairs(client, f) == want, (f, sft_sql(f))
    with pytest.raises(ValueError):
        SFTFilter(where="1; DROP TABLE rollouts")
