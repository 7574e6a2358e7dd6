"""``--feedback-baseline prompt`` on the worker, on the real broker and the real ClickHouse engine (chDB): a
task-less rollout's feedback trains with its reward minus the mean of the earlier feedback on the same prompt."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from schemas import codec
from schemas.models import GroupBatch
from tests.integration.streams.helpers import encoded, produce, query, read_topic, rollout, start_worker, stop_worker
from tests.integration.streams.test_feedback_worker import _committed, _fb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _with_prompt(rid: str, prompt: list[int]) -> list[tuple[str, bytes]]:
    spans, ev = rollout(rid, "", reward=0.0)  # no task: production traffic
    first = spans[0]
    assert first.llm is not None
    spans[0] = first.model_copy(update={"llm": first.llm.model_copy(update={"prompt_token_ids": prompt})})
    return encoded(spans, ev)


def test_prompt_baseline_on_the_worker(kafka_conf, topics, test_env):
    prompt_a, prompt_b = [5, 6, 7], [5, 6, 8]
    inputs = {"q1": prompt_a, "q2": prompt_a, "q3": prompt_b, "q4": prompt_a}
    produce(kafka_conf, topics.spans, [kv for rid, prompt in inputs.items() for kv in _with_prompt(rid, prompt)])
    proc = start_worker(test_env, "--feedback-window", "60", "--feedback-baseline", "prompt")
    try:
        _committed(kafka_conf, f"{topics.prefix}streams.spans", topics.spans, proc)
        # one partition, in this order: the running baseline's window is a partition's
        p = Producer(kafka_conf)
        for fid, rid, value in (("f1", "q1", 1.0), ("f2", "q2", 0.0), ("f3", "q3", 1.0), ("f4", "q4", 1.0)):
            key, val = _fb(fid, rid, value, 5)
            p.produce(topics.feedback, key=key.encode(), value=val, partition=0)
        assert p.flush(30) == 0
        got = read_topic(kafka_conf, topics.batches, 4, 90, proc, distinct=True)
    finally:
        rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    batches = {b.group_id: b for b in (codec.decode(v) for _, v in got) if isinstance(b, GroupBatch)}
    # q1: the prompt's first feedback, no baseline; q2: 0 − 1; q3: another prompt, its first; q4: 1 − mean(1, 0)
    assert {gid: b.advantages for gid, b in batches.items()} == {
        "feedback:q1": [0.0], "feedback:q2": [-1.0], "feedback:q3": [0.0], "feedback:q4": [0.5]}
    rows = query(test_env, {"tr": "SELECT rollout_id, any(advantage) FROM transitions FINAL WHERE startsWith(group_id, 'feedback:') "
                                  "GROUP BY rollout_id ORDER BY rollout_id"})
    assert rows["tr"] == [["q1", 0.0], ["q2", -1.0], ["q3", 0.0], ["q4", 0.5]]
