import dataclasses
import json
import struct

import pytest

from schemas.codec import PACKED_FIELDS, pack_array
from streams.rewards import RewardRules
from streams.rollout import RolloutResult, Settings, finish_attempt
from tests.unit.streams.spans import finished, llm, reward, tool


def test_finish_attempt_end_to_end_discounted():
    spans = [llm(1), tool(2, ok=False), llm(3), reward(4, 1.0), llm(2, span_id="r1-a1-2")]  # last one: duplicate id
    rules = RewardRules(tool_failed=-0.1)  # automatic rules are off by default
    res = finish_attempt(spans, finished(reward_=1.0, span_count=5), Settings(credit="discounted", gamma=0.5, rules=rules))
    assert res.duplicates == 1 and res.missing_sequence_ids == [5]
    assert [s.reward for s in res.steps] == pytest.approx([-0.1, 0.0])
    assert [s.return_ for s in res.steps] == pytest.approx([-0.1 + 0.5 * 1.0, 1.0])
    assert res.status == "succeeded" and res.reward == 1.0 and res.resource_version == 3
    back = RolloutResult.from_bytes(res.to_bytes())  # token sequences come back as arrays over the packed bytes
    assert back.to_bytes() == res.to_bytes()
    assert [(list(s.prompt_token_ids), list(s.response_logprobs)) for s in back.steps] == [
        (s.prompt_token_ids, s.response_logprobs) for s in res.steps]


def test_timed_out_attempt_has_no_final_reward():
    res = finish_attempt([llm(1)], None, Settings(), rollout_id="r1", attempt_id="a1", task_id="t", finished_ns=5)
    assert res.status == "timed_out" and res.final_reward is None and res.reward == 0.0
    assert res.steps[0].return_ == 0.0


@pytest.mark.parametrize("cut", [b"", b"{}", b"RS1", b"RS1\xff\x00\x00\x00{}", b"RS2\x02\x00\x00\x00{}", b"RS3\x02\x00\x00\x00{}"])
def test_a_broken_summary_is_a_value_error(cut):
    with pytest.raises(ValueError):
        RolloutResult.from_bytes(cut)


def rs1(res: RolloutResult) -> bytes:
    """The summary as the span stage wrote it before RS2: a JSON object per step (the old encoder)."""
    head = dataclasses.asdict(res)
    blobs = []
    for sd, step in zip(head["steps"], res.steps, strict=True):
        for name, code in PACKED_FIELDS.items():
            blobs.append(pack_array(code, getattr(step, name)))
            sd[name] = len(blobs[-1])
    header = json.dumps(head).encode()
    return b"".join((b"RS1", struct.pack("<I", len(header)), header, *blobs))


def two_steps() -> RolloutResult:
    return finish_attempt([llm(1, prompt=[7] * 5, response=[9] * 3), llm(2)], finished(span_count=2), Settings())


def test_a_summary_written_before_rs2_still_reads():
    """Summaries stay on the done topic and in the group tables across an upgrade."""
    res = two_steps()
    old = RolloutResult.from_bytes(rs1(res))
    assert old.to_bytes() == res.to_bytes() and old.to_bytes()[:3] == b"RS2"
    assert [list(s.prompt_token_ids) for s in old.steps] == [[7] * 5, [1, 2, 2]]


def test_a_summary_names_the_attempts_ids_once_and_a_steps_own_where_it_differs():
    res = two_steps()
    data = res.to_bytes()
    assert data.count(b'"r1"') == 1 and data.count(b'"task1"') == 1
    res.steps[1].task_id = "other"
    back = RolloutResult.from_bytes(res.to_bytes())
    assert [(s.rollout_id, s.attempt_id, s.task_id) for s in back.steps] == [("r1", "a1", "task1"), ("r1", "a1", "other")]


def test_a_summary_whose_step_columns_disagree_is_a_value_error():
    data = two_steps().to_bytes()
    (n,) = struct.unpack_from("<I", data, 3)
    head = json.loads(data[7:7 + n])
    head["steps"]["turn"].pop()
    header = json.dumps(head).encode()
    with pytest.raises(ValueError, match="differ in length"):
        RolloutResult.from_bytes(b"RS2" + struct.pack("<I", len(header)) + header + data[7 + n:])


def test_a_truncated_or_padded_summary_is_a_value_error():
    data = finish_attempt([llm(1)], finished(span_count=1), Settings()).to_bytes()
    for bad in (data[:-1], data + b"x"):
        with pytest.raises(ValueError):
            RolloutResult.from_bytes(bad)


def test_a_reward_span_is_the_final_reward_when_finished_reports_none():
    spans = [llm(1), reward(2, 0.25), llm(3), reward(4, 0.75)]
    res = finish_attempt(spans, finished(reward_=None, span_count=4), Settings(credit="identical"))
    assert res.final_reward == 0.75 and res.reward == 0.75
    assert res.metadata["rolloutbus.final_reward_span"] == "r1-a1-4"
    # the 0.25 is intermediate (on step 0), the 0.75 final (on the last step), each counted once
    assert [s.reward for s in res.steps] == pytest.approx([0.25, 0.0])
    assert [s.return_ for s in res.steps] == pytest.approx([1.0, 1.0])
    reported = finish_attempt(spans, finished(reward_=0.75, span_count=4), Settings())
    assert reported.final_reward == 0.75 and "rolloutbus.final_reward_span" not in reported.metadata
    assert [s.return_ for s in reported.steps] == pytest.approx([1.0, 1.0])


def test_an_attempt_without_finished_keeps_its_reward_span():
    res = finish_attempt([llm(1), reward(2, 1.0)], None, Settings(), rollout_id="r1", attempt_id="a1", task_id="t", finished_ns=5)
    assert res.status == "timed_out" and res.final_reward == 1.0 and res.reward == 1.0
    assert [s.return_ for s in res.steps] == [1.0]
