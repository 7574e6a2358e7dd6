"""Late feedback's rules (streams/feedback.py) on plain rows."""

from __future__ import annotations

from schemas.models import Feedback
from streams.feedback import (
    ADVANTAGE,
    AFTER_WINDOW,
    AGAIN,
    APPLY,
    DUPLICATE,
    FEEDBACK_ID,
    GROUP_OPEN,
    UNKNOWN,
    StoredRollout,
    agent_of,
    apply,
    verdict,
)

T0 = 1_000_000_000_000


def _rollout(group: str = "", mode: str = "train", **meta: str) -> StoredRollout:
    return StoredRollout({"rollout_id": "r1", "attempt_id": "r1-a1", "task_id": "", "mode": mode, "final_reward": 0.25,
                          "finished_ns": T0, "group_id": group, "metadata": dict(meta), "updated_ns": T0 + 5, "resource_version": 3})


def _steps() -> list[dict]:
    return [{"rollout_id": "r1", "attempt_id": "r1-a1", "turn": t, "task_id": "", "span_id": f"s{t}", "agent_name": "solver",
             "resource_version": 3, "prompt_token_ids": [1, 2], "response_token_ids": [3], "response_logprobs": [-0.5],
             "response_mask": [1], "reward": 0.0, "return_": 0.25, "advantage": 0.0, "trained": True, "group_id": "",
             "credit": "identical", "updated_ns": T0 + 5} for t in range(2)]


def _fb(fid: str = "f1", after_s: float = 10, value: float = 1.0) -> Feedback:
    return Feedback(feedback_id=fid, rollout_id="r1", value=value, time_ns=T0 + int(after_s * 1e9))


def test_verdicts() -> None:
    assert verdict(_fb(), None, None, 60) == UNKNOWN
    assert verdict(_fb(), _rollout(), None, 60) == APPLY
    assert verdict(_fb(after_s=60.5), _rollout(), None, 60) == AFTER_WINDOW
    assert verdict(_fb(after_s=60), _rollout(), None, 60) == APPLY  # the window's end is in it
    assert verdict(_fb(), _rollout(), "f1", 60) == AGAIN
    assert verdict(_fb(), _rollout(**{FEEDBACK_ID: "f1"}), None, 60) == AGAIN  # the row says so (the entry was lost)
    assert verdict(_fb("f2"), _rollout(), "f1", 60) == DUPLICATE
    assert verdict(_fb("f2", after_s=999), _rollout(**{FEEDBACK_ID: "f1"}), None, 60) == DUPLICATE
    # a GRPO group not emitted yet would write the rollout's row again, undoing the feedback
    assert verdict(_fb(), _rollout(group="t@3"), None, 60, group_emitted=False) == GROUP_OPEN
    assert verdict(_fb(), _rollout(group="t@3"), None, 60, group_emitted=True) == APPLY
    assert verdict(_fb(), _rollout(group="feedback:r1"), None, 60, group_emitted=False) == APPLY  # its own group


def test_apply_to_a_taskless_rollout_trains_it_once() -> None:
    done = apply(_fb(value=1.0), _rollout(), _steps(), advantage=0.75)
    row = done.rollout_row
    assert (row["final_reward"], row["group_id"], row["updated_ns"]) == (1.0, "feedback:r1", T0 + 10 * 10**9)
    assert row["metadata"][FEEDBACK_ID] == "f1" and row["metadata"][ADVANTAGE] == "0.75"
    assert [(r["return_"], r["advantage"], r["group_id"]) for r in done.transition_rows] == [(1.0, 0.75, "feedback:r1")] * 2
    b = done.batch
    assert b is not None and (b.group_id, b.rewards, b.advantages, b.group_size) == ("feedback:r1", [1.0], [0.75], 1)
    assert [t.return_ for t in b.transitions] == [1.0, 1.0] and b.resource_version == 3
    # done again from the row it wrote (a replay): the same rows, the same batch, whatever advantage is offered now
    redo = apply(_fb(value=1.0), StoredRollout(row), done.transition_rows, advantage=-9.0)
    assert redo.rollout_row == row and redo.transition_rows == done.transition_rows and redo.batch == b


def test_apply_to_a_grouped_or_test_rollout_only_stores_the_reward() -> None:
    for rollout in (_rollout(group="t@3"), _rollout(mode="test")):
        done = apply(_fb(value=-1.0), rollout, _steps(), advantage=1.0)
        assert done.rollout_row["final_reward"] == -1.0 and done.rollout_row["group_id"] == rollout.row["group_id"]
        assert done.transition_rows == [] and done.batch is None


def test_agent_of() -> None:
    assert agent_of(_steps()) == "solver"
    assert agent_of([]) == ""


def test_the_stage_keeps_a_running_baseline_per_partition_and_agent_in_its_table() -> None:
    from types import SimpleNamespace

    from streams.feedback_stage import FeedbackStage

    table = SimpleNamespace(data={})
    sink = SimpleNamespace(written=0, submitted=0, pending=0, buffered=0)
    stage = FeedbackStage(None, sink=sink, health=None, batches_topic=None, dlq_topic=None, table=table,  # type: ignore[arg-type]
                          flush=lambda: None, submit=lambda: 0, window_s=60, baseline="loo", baseline_window=2)
    got = [stage._advantage(p, agent, "any prompt", r) for p, agent, r in
           [(0, "solver", 1.0), (0, "solver", 0.0), (1, "solver", 1.0), (0, "judge", 0.5), (0, "solver", 1.0), (0, "solver", 0.0)]]
    # partition 0, solver: no baseline; 0 − 1; 1 − mean(1, 0); 0 − mean(0, 1) (window 2). Partition 1 and the judge start afresh.
    assert got == [0.0, -1.0, 0.0, 0.0, 0.5, -0.5]
    assert len(stage._dirty) == 2  # one table entry per partition, sent with the next commit point
    none = FeedbackStage(None, sink=sink, health=None, batches_topic=None, dlq_topic=None, table=table,  # type: ignore[arg-type]
                         flush=lambda: None, submit=lambda: 0, window_s=60, baseline="none")
    assert none._advantage(0, "solver", "any prompt", 0.25) == 0.25


def test_the_prompt_baseline_compares_a_rollout_with_the_earlier_feedback_on_its_prompt() -> None:
    from types import SimpleNamespace

    import pytest

    from streams.baselines import prompt_key
    from streams.feedback_stage import FeedbackStage

    table = SimpleNamespace(data={})
    sink = SimpleNamespace(written=0, submitted=0, pending=0, buffered=0)
    stage = FeedbackStage(None, sink=sink, health=None, batches_topic=None, dlq_topic=None, table=table,  # type: ignore[arg-type]
                          flush=lambda: None, submit=lambda: 0, window_s=60, baseline="prompt", baseline_window=2)
    a, b = prompt_key([{"prompt_token_ids": [1, 2, 3]}]), prompt_key([{"prompt_token_ids": [1, 2, 4]}])
    assert a != b and a == prompt_key([{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [9]}])  # the first turn's
    assert prompt_key([]) == ""
    got = [stage._advantage(p, "solver", key, r) for p, key, r in
           [(0, a, 1.0), (0, a, 0.0), (0, b, 1.0), (0, a, 1.0), (1, a, 0.0), (0, a, 0.0), (0, b, 0.0)]]
    # a on partition 0: no baseline; 0 − 1; then 1 − mean(1, 0); 0 − mean(0, 1) (window 2). b and partition 1 start afresh.
    assert got == [0.0, -1.0, 0.0, 0.5, 0.0, -0.5, -1.0]
    assert len(stage._dirty) == 3  # one table entry per prompt key and partition
    from foundation.errors import ConfigError

    with pytest.raises(ConfigError, match="feedback baseline 'group' is not one of: none, loo, prompt"):
        FeedbackStage(None, sink=sink, health=None, batches_topic=None, dlq_topic=None, table=table,  # type: ignore[arg-type]
                      flush=lambda: None, submit=lambda: 0, window_s=60, baseline="group")


def test_records_wait_for_their_batch_and_their_acks_for_their_decision() -> None:
    """Records are decided in batches, in order (a commit point's drain and the agent's never interleave), and a
    record's ack is released only once it is decided: a commit point never acks a record not yet applied."""
    import asyncio
    from types import SimpleNamespace

    from streams.feedback_stage import FeedbackStage

    async def run() -> None:
        sink = SimpleNamespace(written=0, submitted=0, pending=0, buffered=0)
        stage = FeedbackStage(None, sink=sink, health=None, batches_topic=None, dlq_topic=None,  # type: ignore[arg-type]
                              table=SimpleNamespace(data={}), flush=lambda: None, submit=lambda: 0, window_s=60, batch=3)
        decided: list[list[int]] = []

        async def on_feedbacks(events: list) -> None:
            await asyncio.sleep(0.01)  # its ClickHouse reads
            decided.append([e.n for e in events])

        stage.on_feedbacks = on_feedbacks  # type: ignore[method-assign]
        ev, stream = [SimpleNamespace(n=i) for i in range(5)], object()

        def acked() -> list[int]:
            return [e.n for _, e in stage._pending]

        for e in ev[:2]:
            await stage.on_feedback(e)
            stage.ack_later(stream, e)
        assert decided == [] and acked() == []
        commit_point = asyncio.ensure_future(stage.drain())
        await asyncio.sleep(0)  # it took records 0 and 1 and reads
        await stage.on_feedback(ev[2])
        stage.ack_later(stream, ev[2])
        await commit_point
        assert decided == [[0, 1]] and acked() == [0, 1], "record 2 waits for its own batch, and so does its ack"
        await stage.on_feedback(ev[3])
        stage.ack_later(stream, ev[3])
        await stage.on_feedback(ev[4])  # the third waiting: decided at once
        stage.ack_later(stream, ev[4])
        assert decided == [[0, 1], [2, 3, 4]] and acked() == [0, 1, 2, 3, 4]
        await stage.drain()
        assert decided == [[0, 1], [2, 3, 4]], "nothing waits"

    asyncio.run(run())


def test_a_registered_feedback_baseline_is_a_choice_of_the_worker_and_keys_its_own_window() -> None:
    """A baseline is one function under @FEEDBACK_BASELINES.register: the settings take its name, and the stage keeps
    the window the function names (here one per partition and agent, across prompts)."""
    from types import SimpleNamespace

    from foundation.config import load_settings
    from streams.baselines import FEEDBACK_BASELINES
    from streams.feedback_stage import FeedbackStage
    from streams.settings import StreamSettings

    @FEEDBACK_BASELINES.register("per-agent-across-partitions")
    def everywhere(partition: int, agent: str, prompt: str) -> tuple[str, str]:
        """one window per agent, whatever the partition"""
        return "\x1fall", agent

    try:
        assert load_settings(StreamSettings, {"feedback_baseline": "per-agent-across-partitions"}).feedback_baseline == \
            "per-agent-across-partitions"
        table = SimpleNamespace(data={})
        sink = SimpleNamespace(written=0, submitted=0, pending=0, buffered=0)
        stage = FeedbackStage(None, sink=sink, health=None, batches_topic=None, dlq_topic=None, table=table,  # type: ignore[arg-type]
                              flush=lambda: None, submit=lambda: 0, window_s=60, baseline="per-agent-across-partitions")
        stage.table.data.update({})
        got = [stage._advantage(p, "solver", "x", r) for p, r in [(0, 1.0), (1, 0.0)]]
        assert got == [0.0, -1.0]  # partition 1 sees partition 0's reward: one window
    finally:
        FEEDBACK_BASELINES.unregister("per-agent-across-partitions")


def test_a_batch_the_feedback_stage_sends_is_reported_as_the_group_stage_s_are() -> None:
    """``rolloutbus process --report-to`` counts the one-rollout batches of late feedback with the groups: the stage
    hands each batch it sends to ``on_emit``, and one it only stores (a grouped rollout) is not handed on."""
    import asyncio
    from types import SimpleNamespace

    from streams.feedback_stage import FeedbackStage, _Known
    from streams.report import StreamReport

    async def run() -> None:
        report = StreamReport(now=0.0)
        sent: list[bytes] = []
        sink = SimpleNamespace(add=lambda *a, **k: None, add_many=lambda *a, **k: None)
        topic = SimpleNamespace(send_soon=lambda key, value: sent.append(key))

        def stage_reporting() -> FeedbackStage:
            return FeedbackStage(None, sink=sink, health=None, batches_topic=topic, dlq_topic=None,  # type: ignore[arg-type]
                                 table=SimpleNamespace(data={}), flush=lambda: None, submit=lambda: 0, window_s=60,
                                 on_emit=report.add)

        stage = stage_reporting()
        event = SimpleNamespace(message=SimpleNamespace(topic="rb.feedback", partition=0, offset=7))
        await stage._decide(event, _fb(value=1.0), _Known(rollouts={"r1": _rollout()}, steps={"r1": _steps()}))
        assert sent == [b"feedback:r1"]
        step, metrics = report.take(now=60.0, spans=0.0)  # type: ignore[misc]
        assert step == 1 and metrics["stream/groups"] == 1 and metrics["stream/rollouts"] == 1
        assert metrics["stream/reward_mean"] == 1.0
        grouped = stage_reporting()
        await grouped._decide(event, _fb(value=1.0), _Known(rollouts={"r1": _rollout(group="t@3")}, emitted={"t@3"}))
        assert sent == [b"feedback:r1"] and report.take(now=120.0, spans=0.0) is None

    asyncio.run(run())
