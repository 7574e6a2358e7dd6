"""The claim bookkeeping of Agent Lightning's queue on rb.tasks, on plain records (no broker)."""

from __future__ import annotations

import json

import pytest

from producers.ingest.agl.claims import ClaimBook, claim_mark, read_mark
from producers.ingest.agl.v0_3_queue_records import EnqueueError, attempted_rollout, enqueue_requests, rollout_reply, task_from_request
from schemas.models import Task


def task(tid: str, group_size: int = 1, mode: str = "train") -> Task:
    return Task(task_id=tid, input=json.dumps({"q": tid}), mode=mode, group_size=group_size, created_ns=1_000_000_000)


def book(timeout: float = 10.0, max_attempts: int = 2, mark: tuple[int, float] = (-1, 0.0)) -> ClaimBook:
    b = ClaimBook(timeout, max_attempts)
    b.assign(0, mark)
    return b


def test_each_rollout_is_handed_out_once_and_empty_answers_none() -> None:
    b = book()
    b.add(0, 0, task("a"), now=0)
    b.add(0, 1, task("b", group_size=2), now=0)
    b.add(0, 1, task("b", group_size=2), now=0)  # re-delivered: still one
    got = [b.take("w", now=1) for _ in range(3)]
    assert [c.slot.rollout_id for c in got if c] == ["ro-a-p0o0-0", "ro-b-p0o1-0", "ro-b-p0o1-1"]
    assert b.take("w", now=1) is None
    assert all(c.attempt == 1 and c.deadline == 11 for c in got if c)


def test_commit_stops_at_the_lowest_task_not_done() -> None:
    b = book()
    for off in range(3):
        b.add(0, off, task(f"t{off}"), now=0)
    c0, c1, c2 = (b.take("w", now=0) for _ in range(3))
    assert b.committable(0) == 0 and b.mark(0) == (2, 10.0)
    b.end(c1, "succeeded")
    b.end(c2, "succeeded")
    assert b.committable(0) == 0
    b.end(c0, "succeeded")
    assert b.committable(0) == 3


def test_an_expired_claim_is_offered_again_once_then_given_up() -> None:
    b = book(timeout=5, max_attempts=2)
    b.add(0, 0, task("a"), now=0)
    first = b.take("w1", now=0)
    assert b.expired(4) == [] and b.expired(5) == [first]
    assert b.end(first, "timeout") is True
    second = b.take("w2", now=6)
    assert second.slot.rollout_id == first.slot.rollout_id and second.attempt == 2 and second.attempt_id != first.attempt_id
    assert b.take("w3", now=6) is None
    assert b.end(second, "timeout") is False and b.committable(0) == 1
    assert b.end(second, "succeeded") is False, "a claim ends once"


def test_a_failed_attempt_is_retried_a_succeeded_one_is_not() -> None:
    b = book(max_attempts=3)
    b.add(0, 0, task("a"), now=0)
    assert b.end(b.take("w", now=0), "failed") is True
    c = b.take("w", now=0)
    assert c.attempt == 2
    assert b.end(c, "succeeded") is False and b.take("w", now=0) is None


def test_a_new_owner_holds_what_the_last_one_handed_out_until_its_mark() -> None:
    b = book(timeout=10, mark=(1, 50.0))
    for off in range(3):
        b.add(0, off, task(f"t{off}"), now=20)
    free = b.take("w", now=20)
    assert free.slot.offset == 2 and b.take("w", now=20) is None, "offsets 0 and 1 were handed out by the last owner"
    held = [c for c in b.claims() if c.held]
    assert [c.slot.offset for c in held] == [0, 1] and {c.deadline for c in held} == {50.0}
    b.end(held[0], "succeeded")  # its attempt ended (ClickHouse said so)
    assert b.expired(50) == [free, held[1]]
    assert b.end(held[1], "timeout") is True
    again = b.take("w", now=51)
    assert again.slot.offset == 1 and again.attempt == 2


def test_revoke_forgets_the_partition() -> None:
    b = book()
    b.add(0, 0, task("a"), now=0)
    c = b.take("w", now=0)
    b.revoke(0)
    assert b.claims() == [] and b.committable(0) is None and b.claim_of(c.attempt_id) is None


def test_untake_offers_the_same_rollout_first() -> None:
    b = book()
    b.add(0, 0, task("a"), now=0)
    b.add(0, 1, task("b"), now=0)
    c = b.take("w", now=0)
    b.untake(c)
    again = b.take("w", now=0)
    assert again.slot.offset == 0 and again.attempt == 1


def test_claim_mark_round_trips_and_garbage_reads_as_none() -> None:
    assert read_mark(claim_mark(7, 123.5)) == (7, 123.5)
    assert read_mark(None) == (-1, 0.0) and read_mark("") == (-1, 0.0) and read_mark("x") == (-1, 0.0)


def test_an_enqueued_rollout_comes_back_as_its_store_answers() -> None:
    [req] = enqueue_requests({"rollouts": [{"input": {"reward": 1.0}, "mode": "val", "metadata": {"k": 2}}]})
    t = task_from_request(req, rollout_id="ro-abc", resources_id="policy=1", now_ns=2_000_000_000)
    assert t.task_id == "ro-abc" and t.group_size == 1 and t.mode == "val"
    r = rollout_reply(t, "ro-abc")
    assert r == {"rollout_id": "ro-abc", "input": {"reward": 1.0}, "start_time": 2.0, "end_time": None, "mode": "val",
                 "resources_id": "policy=1", "status": "queuing", "metadata": {"k": 2},
                 "config": {"timeout_seconds": None, "unresponsive_seconds": None, "max_attempts": 1, "retry_condition": []}}
    b = book()
    b.add(0, 5, t, now=0)
    c = b.take("worker-1", now=3)
    a = attempted_rollout(c.slot.task, c.slot.rollout_id, attempt_id=c.attempt_id, attempt=c.attempt, worker_id=c.worker_id,
                          now=3.0)
    assert a["rollout_id"] == "ro-abc" and a["status"] == "preparing"
    assert a["attempt"] == {"rollout_id": "ro-abc", "attempt_id": c.attempt_id, "sequence_id": 1, "start_time": 3.0,
                            "end_time": None, "status": "preparing", "worker_id": "worker-1", "last_heartbeat_time": None,
                            "metadata": None}


@pytest.mark.parametrize("body, reason", [
    ([1], "JSON object"),
    ({"rollouts": {}}, "must be a list"),
    ({"rollouts": [{"mode": "train"}]}, "'input'"),
    ({"rollouts": [{"input": 1, "mode": "dev"}]}, "mode"),
    ({"rollouts": [{"input": 1, "config": 3}]}, "config"),
])
def test_bad_enqueue_requests_say_why(body: object, reason: str) -> None:
    with pytest.raises(EnqueueError, match=reason):
        enqueue_requests(body)


def enqueued(rid: str, config: dict | None, b: ClaimBook) -> Task:
    [req] = enqueue_requests({"rollouts": [{"input": 1, "config": config}]})
    return task_from_request(req, rollout_id=rid, resources_id=None, now_ns=0, defaults=b.defaults())


def test_a_rollout_s_own_config_sets_its_attempts_and_its_claim_time() -> None:
    b = book(timeout=10, max_attempts=2)
    b.add(0, 0, enqueued("ro-own", {"max_attempts": 3, "timeout_seconds": 2.5, "retry_condition": ["timeout"]}, b), now=0)
    b.add(0, 1, task("plain"), now=0)  # published by `rolloutbus tasks publish`: no config, the gateway's
    own, plain = b.take("w", now=0), b.take("w", now=0)
    assert (own.deadline, plain.deadline) == (2.5, 10.0)
    assert b.expired(2.5) == [own]
    for n in (1, 2):
        assert b.end(own, "timeout") is True, f"attempt {n} of 3"
        own = b.take("w", now=3)
        assert own.attempt == n + 1 and own.deadline == 5.5
    assert b.end(own, "timeout") is False, "three attempts, as its config says"
    assert b.end(plain, "timeout") is True and b.end(b.take("w", now=11), "timeout") is False, "the gateway's two"


def test_its_retry_condition_says_which_ends_are_offered_again() -> None:
    b = book(max_attempts=2)
    b.add(0, 0, enqueued("ro-t", {"max_attempts": 3, "retry_condition": ["timeout"]}, b), now=0)
    b.add(0, 1, enqueued("ro-none", {"max_attempts": 3, "retry_condition": []}, b), now=0)  # RolloutConfig(max_attempts=3)
    t, none = b.take("w", now=0), b.take("w", now=0)
    assert b.end(t, "failed") is False, "a failed attempt is not in its retry_condition"
    assert b.end(none, "timeout") is False, "an empty retry_condition retries nothing, as its store does"
    assert b.committable(0) == 2


def test_what_a_request_leaves_out_of_its_config_is_the_gateway_s_and_said_so() -> None:
    b = book(timeout=10, max_attempts=2)
    gateway = {"timeout_seconds": 10, "unresponsive_seconds": None, "max_attempts": 2, "retry_condition": ["failed", "timeout"]}
    assert rollout_reply(enqueued("ro-1", None, b), "ro-1")["config"] == gateway
    assert rollout_reply(enqueued("ro-2", {"max_attempts": 4, "timeout_seconds": None}, b), "ro-2")["config"] == {
        **gateway, "max_attempts": 4}


@pytest.mark.parametrize("config", [{"max_attempts": 0}, {"max_attempts": True}, {"max_attempts": "3"},
                                    {"timeout_seconds": -1}, {"timeout_seconds": "1"}, {"retry_condition": "failed"}])
def test_a_config_value_that_cannot_be_used_is_the_gateway_s(config: dict) -> None:
    from producers.ingest.agl.claims import CONFIG

    b = book(timeout=10, max_attempts=2)
    t = task("x")
    t.metadata[CONFIG] = json.dumps(config)
    b.add(0, 0, t, now=0)
    c = b.take("w", now=0)
    assert c.deadline == 10 and c.slot.limits.max_attempts == 2 and c.slot.limits.retry_on == ("failed", "timeout")
