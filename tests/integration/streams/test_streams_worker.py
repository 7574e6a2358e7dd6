"""The stream worker against the real broker and the real ClickHouse engine (chDB)."""

from __future__ import annotations

import signal
import time

import pytest

from schemas.models import GroupBatch
from streams.grouping import GroupPolicy, build_batch
from streams.rewards import RewardRules
from streams.rollout import Settings, finish_attempt
from tests.integration.streams.helpers import ROOT, batches, encoded, produce, query, rollout, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

AIR = ROOT / "deploy" / "rewards" / "air.toml"


def test_groups_rewards_and_advantages_match_the_core(kafka_conf, topics, test_env):
    inputs = {f"{task}-r{i}": rollout(f"{task}-r{i}", task, reward=float(i % 2), tool_fail=i == 0)
              for task in ("t1", "t2") for i in range(2)}
    items = [kv for spans, ev in inputs.values() for kv in encoded(spans, ev)]
    items.insert(3, ("garbage", b"\xc3\x01not-avro-at-all"))
    items.insert(5, ("garbage", b"hello"))
    produce(kafka_conf, topics.spans, items)
    # The former default rules (a failed tool call -0.1): the core below computes with the same file.
    proc = start_worker(test_env, "--group-size", "2", "--credit", "discounted", "--gamma", "0.5", "--reward-rules", str(AIR))
    got = batches(kafka_conf, topics.batches, 2, proc)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    assert sorted(b.group_id for b in got) == ["t1@1", "t2@1"]
    # the summaries' topic, made by the worker, takes records as large as rb.spans does (the broker's default
    # is 1 MB: a long rollout's summary, every step's token ids, was refused and the rollout never trained)
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

    from streams.app import done_topic_name

    # and so do the group tables' changelogs (a group-members entry is a whole summary)
    kafka_admin = AdminClient(kafka_conf)
    changelogs = [f"{topics.prefix}streams-{table}-changelog" for table in ("group-state", "group-members")]
    for name in [done_topic_name(topics.prefix), *changelogs]:
        res = ConfigResource(ConfigResource.Type.TOPIC, name)
        setting = kafka_admin.describe_configs([res])[res].result(30)["max.message.bytes"]
        # the topic's own setting: this test broker's default is 16 MB too, a production broker's is 1 MB
        assert (setting.value, setting.source) == (str(16 * 1024 * 1024), ConfigSource.DYNAMIC_TOPIC_CONFIG.value), name

    core = Settings(credit="discounted", gamma=0.5, rules=RewardRules.load(AIR))
    results = {rid: finish_attempt(spans, ev, core) for rid, (spans, ev) in inputs.items()}
    for b in got:
        expected: GroupBatch = build_batch([r for r in results.values() if r.task_id == b.task_id], GroupPolicy(group_size=2), 0, True)
        assert b.rewards == expected.rewards and b.advantages == pytest.approx(expected.advantages)
        assert [(t.rollout_id, t.turn) for t in b.transitions] == [(t.rollout_id, t.turn) for t in expected.transitions]
        assert [x for t in b.transitions for x in (t.reward, t.return_, t.advantage)] == pytest.approx(
            [x for t in expected.transitions for x in (t.reward, t.return_, t.advantage)])

    rows = query(test_env, {
        "spans": "SELECT count(), uniqExact(span_id) FROM spans FINAL",
        "tr": "SELECT rollout_id, turn, reward, return_, advantage, group_id FROM transitions FINAL ORDER BY rollout_id, turn",
        "ro": "SELECT rollout_id, status, final_reward, spans_seen, transition_count, group_id FROM rollouts FINAL ORDER BY rollout_id",
        "groups": "SELECT group_id, rollouts, complete FROM groups FINAL ORDER BY group_id",
        "dlq": "SELECT reason, source_topic FROM dead_letters FINAL ORDER BY dlq_offset",
    })
    assert rows["spans"] == [[16, 16]]
    # each step's advantage is its own (its return under discounted credit, through the group's estimator): the
    # core's build_batch above set it on every step of `results`
    expected_tr = sorted(
        [s.rollout_id, s.turn, s.reward, s.return_, s.advantage, f"{s.task_id}@1"] for r in results.values() for s in r.steps
    )
    assert all(len({s.advantage for s in r.steps}) == 2 for r in results.values())  # a rollout's two steps differ
    assert [[r[0], r[1]] for r in rows["tr"]] == [[e[0], e[1]] for e in expected_tr]
    assert [x for r in rows["tr"] for x in r[2:5]] == pytest.approx([x for e in expected_tr for x in e[2:5]])
    assert [r[5] for r in rows["tr"]] == [e[5] for e in expected_tr]
    assert rows["ro"] == [[rid, "succeeded", results[rid].final_reward, 4, 2, f"{results[rid].task_id}@1"] for rid in sorted(results)]
    assert rows["groups"] == [["t1@1", 2, True], ["t2@1", 2, True]]
    assert [r[1] for r in rows["dlq"]] == [topics.spans, topics.spans]
    assert {r[0] for r in rows["dlq"]} == {"decode.unknown_fingerprint", "decode.not_avro"}


def test_sigkill_mid_stream_leaves_every_span_once(kafka_conf, topics, test_env):
    first = {f"k-r{i}": rollout(f"k-r{i}", f"k{i // 2}", reward=float(i % 2)) for i in range(4)}
    second = {f"k-r{i}": rollout(f"k-r{i}", f"k{i // 2}", reward=float(i % 2)) for i in range(4, 8)}
    produce(kafka_conf, topics.spans, [kv for s, e in first.values() for kv in encoded(s, e)])
    proc = start_worker(test_env, "--group-size", "2")
    assert len(batches(kafka_conf, topics.batches, 2, proc)) >= 2
    # more work arrives, and the worker dies without flushing or committing
    produce(kafka_conf, topics.spans, [kv for s, e in second.values() for kv in encoded(s, e)])
    stop_worker(proc, signal.SIGKILL)
    proc = start_worker(test_env, "--group-size", "2")
    got = batches(kafka_conf, topics.batches, 4, proc)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    # every group reached rb.batches; a group may be re-emitted after a crash: consumers dedupe by group_id
    assert sorted({b.group_id for b in got}) == ["k0@1", "k1@1", "k2@1", "k3@1"]
    rows = query(test_env, {
        "spans": "SELECT count(), uniqExact(rollout_id, span_id), countIf(late) FROM spans FINAL",
        "ro": "SELECT count() FROM rollouts FINAL",
        "groups": "SELECT count() FROM groups FINAL",
    })
    assert rows["spans"] == [[32, 32, 0]]
    assert rows["ro"] == [[8]] and rows["groups"] == [[4]]


def test_spans_from_another_producer_after_finished_still_count(kafka_conf, topics, test_env):
    """The LLM proxy and the agent's process produce separately: FINISHED can overtake LLM spans.

    An attempt completes when every sequence id up to span_count is in; one whose span never
    arrives completes after the grace period with the gap visible.
    """
    spans_a, ev_a = rollout("late-a", "t9", reward=1.0)
    spans_b, ev_b = rollout("late-b", "t9", reward=0.0)
    llm_a = [s for s in spans_a if s.kind == "llm"]
    items = encoded([s for s in spans_a if s.kind != "llm"], ev_a) + [(s.rollout_id, codec_encode(s)) for s in llm_a]
    # late-b: its second LLM span never arrives
    items += encoded([s for s in spans_b if s.sequence_id != 3], ev_b)
    produce(kafka_conf, topics.spans, items)
    proc = start_worker(test_env, "--group-size", "2", "--finish-grace", "2")
    got = batches(kafka_conf, topics.batches, 1, proc)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    assert got[0].group_id == "t9@1"
    assert sorted({t.rollout_id for t in got[0].transitions}) == ["late-a", "late-b"]
    assert len([t for t in got[0].transitions if t.rollout_id == "late-a"]) == 2
    rows = query(test_env, {
        "ro": "SELECT rollout_id, spans_seen, transition_count, missing_sequence_ids FROM rollouts FINAL ORDER BY rollout_id",
        "late": "SELECT countIf(late) FROM spans FINAL",
    })
    assert rows["ro"] == [["late-a", 4, 2, []], ["late-b", 3, 1, [3]]]
    assert rows["late"] == [[0]]


def codec_encode(span):  # noqa: ANN001, ANN201
    from schemas import codec

    return codec.encode(span)


def test_a_group_too_large_to_send_is_stored_and_the_worker_goes_on(kafka_conf, topics, test_env):
    """Each rollout's summary fits a record (16 MiB), their group's batch does not. aiokafka refuses such a
    record as faust hands it over, which ended faust's send task and the worker with it; restarted, the
    worker emitted the group again and crashed again. Now the group is stored, logged as not trained, and
    the groups after it go to the trainer."""
    items = []
    for rid in ("big-a", "big-b"):
        spans, ev = rollout(rid, "big", reward=float(rid == "big-a"), turns=1)
        spans[0].llm.prompt_token_ids = list(range(2_400_000))  # 9.6 MB packed: the two make a 19 MB batch
        items += encoded(spans, ev)
    for rid in ("ok-a", "ok-b"):
        items += encoded(*rollout(rid, "t1", reward=float(rid == "ok-a")))
    produce(kafka_conf, topics.spans, items)
    proc = start_worker(test_env, "--group-size", "2")
    got = batches(kafka_conf, topics.batches, 1, proc, timeout=60)
    deadline = time.monotonic() + 60
    while "refused a record for good" not in proc.output() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, proc.output()[-3000:]
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    assert [b.group_id for b in got] == ["t1@1"]
    assert f"{topics.batches} refused a record for good" in out and "that group is stored, not trained" in out
    rows = query(test_env, {
        "groups": "SELECT group_id, rollouts FROM groups FINAL ORDER BY group_id",
        "tr": "SELECT rollout_id, length(prompt_token_ids) FROM transitions FINAL WHERE group_id = 'big@1' ORDER BY rollout_id",
    })
    assert rows["groups"] == [["big@1", 2], ["t1@1", 2]]
    assert rows["tr"] == [["big-a", 2_400_000], ["big-b", 2_400_000]]


def test_tasks_run_once_while_the_worker_waits_for_groups_get_one_line_naming_the_task(kafka_conf, topics, test_env):
    """Tasks published without group_size (Task.group_size defaults to 1): the runners run each once, and the
    worker waits for groups of 4, emitting a timed-out one only with 2. Nothing trains; one line says why."""
    items = [kv for task in ("t1", "t2") for kv in encoded(*rollout(f"{task}-r0", task, reward=1.0))]
    produce(kafka_conf, topics.spans, items)
    proc = start_worker(test_env, "--group-size", "4", "--group-timeout", "2")
    deadline = time.monotonic() + 60
    while "nothing trains on it" not in proc.output() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)  # more timer ticks: still one line
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    lines = [line for line in out.splitlines() if "nothing trains on it" in line]
    assert len(lines) == 1, out[-3000:]
    assert "WARNING" in lines[0] and ("(task 't1') has 1 rollout" in lines[0] or "(task 't2') has 1 rollout" in lines[0])
    assert "needs 2 to be emitted (group size 4)" in lines[0] and "rolloutbus tasks --group-size 4" in lines[0]
    assert query(test_env, {"groups": "SELECT count() FROM groups FINAL"})["groups"] == [[0]]


def test_a_group_split_across_versions_gets_the_line_that_says_so(kafka_conf, topics, test_env):
    """A task's group ran, but a version arrived while it ran: three rollouts at version 1 (emitted at the timeout),
    one at version 2 (short for ever). The line names the split, not group_size."""
    items = [kv for i in range(3) for kv in encoded(*rollout(f"s-r{i}", "s", reward=float(i % 2), rv=1))]
    items += encoded(*rollout("s-r3", "s", reward=1.0, rv=2))
    produce(kafka_conf, topics.spans, items)
    proc = start_worker(test_env, "--group-size", "4", "--group-timeout", "2")
    # the two groups time out in the order their first rollouts finished: wait for s@1's batch as well as
    # s@2's line (stopping at the line alone could stop the worker before s@1 was emitted)
    assert [b.group_id for b in batches(kafka_conf, topics.batches, 1, proc)] == ["s@1"]
    deadline = time.monotonic() + 60
    while "nothing trains on it" not in proc.output() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    lines = [line for line in out.splitlines() if "nothing trains on it" in line]
    assert len(lines) == 1 and "group s@2 (task 's') has 1 rollout" in lines[0], out[-3000:]
    assert "answered by another policy version" in lines[0] and "defaults to 1" not in lines[0]
    assert query(test_env, {"groups": "SELECT group_id, rollouts FROM groups FINAL"})["groups"] == [["s@1", 3]]


def test_offsets_kept_from_an_earlier_topic_of_the_same_name_do_not_hide_the_new_records(kafka_conf, topics, test_env):
    """``rolloutbus demo`` deletes its topics and creates them again; the broker can keep the worker's groups'
    offsets (an old worker committing on its way out recreates a group the reset deleted). Offsets past the new
    partitions' ends made the span stage count every new span as replayed and faust's frontier every finished
    rollout as redelivered: no row, no group, no training step."""
    from confluent_kafka import Consumer, TopicPartition

    from foundation.kafka_admin import ensure_topics
    from streams.app import done_topic_name
    from streams.cli import worker_topics
    from streams.spans_stage import REPLAY_PREFIX, span_group

    app_id = f"{topics.prefix}streams"
    ensure_topics(kafka_conf, worker_topics(topics.prefix, app_id, 4))  # as the worker makes them at its start
    for group, topic in ((span_group(app_id), topics.spans), (app_id, done_topic_name(topics.prefix))):
        c = Consumer({**kafka_conf, "group.id": group, "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(topic, p, 5000, metadata=f"{REPLAY_PREFIX}4000") for p in range(4)],
                 asynchronous=False)
        c.close()
    inputs = [rollout(f"t1-r{i}", "t1", reward=float(i)) for i in range(2)]
    produce(kafka_conf, topics.spans, [kv for spans, ev in inputs for kv in encoded(spans, ev)])
    proc = start_worker(test_env, "--group-size", "2")
    got = batches(kafka_conf, topics.batches, 1, proc)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    assert [b.group_id for b in got] == ["t1@1"]
    assert "past the partition's end" in out and "past the end of" in out
    rows = query(test_env, {"spans": "SELECT count() FROM spans FINAL", "ro": "SELECT count() FROM rollouts FINAL"})
    assert rows == {"spans": [[8]], "ro": [[2]]}
