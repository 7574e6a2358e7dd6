"""Agent Lightning's rollout queue (``/v1/agl/queues/rollouts/*``) served by two gateway replicas against the
real broker: every enqueued rollout is claimed once whichever replica the workers ask, a claim left to
time out is offered again once (attempt 2), and the claims of a replica that stops are offered by the other
one — after their deadline, never while they may still be live."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from producers_testkit import REPO, consume_all, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


class Replica:
    def __init__(self, env: dict[str, str], data_dir: Path) -> None:
        self.log = data_dir / "gateway.log"
        data_dir.mkdir(parents=True)
        port = free_port()
        genv = {**env, "PYTHONPATH": str(REPO), "ROLLOUTBUS_DATA_DIR": str(data_dir)}
        genv.pop("ROLLOUTBUS_GATEWAY_TOKEN", None)
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "producers.ingest.gateway_cli", "--port", str(port)], env=genv,
                                         stdout=log, stderr=subprocess.STDOUT)
        self.agl = f"http://127.0.0.1:{port}/v1/agl"
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{self.agl}/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"gateway did not start: {self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def dequeue(self, worker: str) -> list[dict[str, Any]]:
        resp = requests.post(f"{self.agl}/queues/rollouts/dequeue", json={"limit": 1, "worker_id": worker}, timeout=10)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def enqueue(self, inputs: list[Any]) -> list[dict[str, Any]]:
        resp = requests.post(f"{self.agl}/queues/rollouts/enqueue", json={"rollouts": [{"input": i} for i in inputs]}, timeout=30)
        assert resp.status_code == 201, resp.text
        return resp.json()

    def finish(self, attempt: dict[str, Any], status: str = "succeeded") -> None:
        resp = requests.post(f"{self.agl}/rollouts/{attempt['rollout_id']}/attempts/{attempt['attempt_id']}",
                             json={"status": status, "worker_id": attempt["worker_id"]}, timeout=10)
        assert resp.status_code == 200, resp.text

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()


@pytest.fixture
def replicas(test_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[[float], tuple[Replica, Replica]]]:
    started: list[Replica] = []

    def start(claim_timeout_s: float) -> tuple[Replica, Replica]:
        env = {**test_env, "ROLLOUTBUS_GATEWAY_AGL_CLAIM_TIMEOUT_S": str(claim_timeout_s)}
        a, b = Replica(env, tmp_path / "a"), Replica(env, tmp_path / "b")
        started.extend((a, b))
        # Both join the consumer group (the first dequeue does), then the partitions are shared out.
        assert a.dequeue("probe") == [] and b.dequeue("probe") == []
        time.sleep(8)
        return a, b

    yield start
    for r in started:
        r.stop()


def test_each_rollout_is_claimed_once_across_two_replicas(replicas: Any, kafka_conf: dict[str, Any], topics: Any) -> None:
    a, b = replicas(120.0)
    enqueued = a.enqueue([{"n": n} for n in range(6)]) + b.enqueue([{"n": n} for n in range(6, 12)])
    assert [r["status"] for r in enqueued] == ["queuing"] * 12 and len({r["rollout_id"] for r in enqueued}) == 12
    claims: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        deadline = time.monotonic() + 40
        n = 0
        while time.monotonic() < deadline:
            with lock:
                if len({c["rollout_id"] for _, c in claims}) == 12:
                    break
            first, second = (a, b) if n % 2 else (b, a)
            n += 1
            got = first.dequeue(name)
            if not got:
                time.sleep(0.1)
                continue
            [c] = got
            with lock:
                claims.append((name, c))
            second.finish(c["attempt"])  # the terminal update reaches the other replica: it still counts

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = sorted(c["rollout_id"] for _, c in claims)
    assert ids == sorted(r["rollout_id"] for r in enqueued), "every rollout claimed exactly once"
    assert {_c["attempt"]["sequence_id"] for _, _c in claims} == {1}
    assert all(c["attempt"]["worker_id"] == w and c["status"] == "preparing" for w, c in claims)
    assert {c["rollout_id"]: c["input"] for _, c in claims} == {r["rollout_id"]: r["input"] for r in enqueued}
    # An empty queue answers null at once (no long poll): each reply inside the client's 10 s timeout, which
    # a dequeue that waited for a task would run into (the time is printed, not asserted closer: a busy machine).
    t0 = time.monotonic()
    assert a.dequeue("late") == [] and b.dequeue("late") == [], "an empty queue answers null"
    print(f"FIGURES two empty dequeues: {time.monotonic() - t0:.2f}s")
    bad = requests.post(f"{a.agl}/queues/rollouts/dequeue", json=[1], timeout=5)
    assert bad.status_code == 422 and "limit" in bad.json()["detail"]
    bad = requests.post(f"{a.agl}/queues/rollouts/enqueue", json={"rollouts": [{"mode": "train"}]}, timeout=5)
    assert bad.status_code == 422 and "'input'" in bad.json()["detail"]
    # These replicas have only the embedded engine's DSN: a rollout reads back from the control records (any
    # replica), its attempt too; the reads of spans need a ClickHouse server: 501, saying so.
    got = requests.get(f"{b.agl}/rollouts/{ids[0]}", timeout=5)
    assert got.status_code == 200 and got.json()["rollout_id"] == ids[0], got.text
    attempts = requests.get(f"{a.agl}/rollouts/{ids[0]}/attempts", timeout=5).json()["items"]
    assert [x["attempt_id"] for x in attempts] == [got.json()["attempt"]["attempt_id"]]
    no = requests.get(f"{a.agl}/spans", params={"rollout_id": ids[0]}, timeout=5)
    assert no.status_code == 501 and "GET /v1/agl/spans" in no.json()["detail"]

    # Each claim STARTED its attempt on rb.spans (the span stage's task and attempt number), and ended there.
    records = consume_all(kafka_conf, topics.spans, expect=24, timeout=20)
    events = sorted((r["event"], r["rollout_id"], r["task_id"], r["attempt"]) for _k, name, r, _p in records
                    if name.endswith("RolloutEvent") and r["event"] == "STARTED")
    assert events == sorted(("STARTED", i, i, 1) for i in ids)


def test_a_claim_left_to_time_out_is_offered_again_once(replicas: Any, kafka_conf: dict[str, Any], topics: Any) -> None:
    a, b = replicas(4.0)
    [rollout] = a.enqueue(["solve 2+2"])

    def poll(until: float) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while time.monotonic() < until:
            for r in (a, b):
                got += r.dequeue("w")
            time.sleep(0.2)
        return got

    first = poll(time.monotonic() + 3)
    assert [c["rollout_id"] for c in first] == [rollout["rollout_id"]]
    again = poll(time.monotonic() + 12)  # claim timeout 4s, checked every 2s: offered again, once
    assert [(c["rollout_id"], c["attempt"]["sequence_id"]) for c in again] == [(rollout["rollout_id"], 2)]
    assert again[0]["attempt"]["attempt_id"] != first[0]["attempt"]["attempt_id"]
    assert poll(time.monotonic() + 8) == [], "max attempts 2: after the second times out it is not offered again"

    records = consume_all(kafka_conf, topics.spans, expect=4, timeout=20)
    events = sorted((r["event"], r["attempt"], r["status"]) for _k, name, r, _p in records if name.endswith("RolloutEvent"))
    assert events == [("FINISHED", 1, "timeout"), ("FINISHED", 2, "timeout"), ("STARTED", 1, None), ("STARTED", 2, None)]


def test_the_claims_of_a_stopped_replica_are_offered_by_the_other_after_their_deadline(replicas: Any) -> None:
    a, b = replicas(10.0)
    enqueued = a.enqueue([{"n": n} for n in range(8)])
    on_a: list[dict[str, Any]] = []
    asked_at: dict[str, float] = {}  # rollout id → when a's dequeue that claimed it was called (its deadline is 10s later, or more)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(on_a) < 3:
        asked = time.monotonic()
        for c in a.dequeue("wa"):
            on_a.append(c)
            asked_at[c["rollout_id"]] = asked
    assert on_a, "replica a owns some partitions"
    claimed_at = time.monotonic()
    log = a.stop()  # leaves the group; its partitions go to b with the mark of what a handed out
    assert "Traceback" not in log, log[-3000:]

    a_ids = {c["rollout_id"] for c in on_a}
    got: list[tuple[float, dict[str, Any]]] = []
    while time.monotonic() < claimed_at + 25:
        for c in b.dequeue("wb"):
            got.append((time.monotonic() - claimed_at, c))
            b.finish(c["attempt"])
        if {c["rollout_id"] for _, c in got} >= {r["rollout_id"] for r in enqueued}:
            break
        time.sleep(0.2)
    time.sleep(3)
    assert b.dequeue("wb") == [], "nothing more once every rollout finished"
    again = [(t, c) for t, c in got if c["rollout_id"] in a_ids]
    assert sorted(c["rollout_id"] for _, c in again) == sorted(a_ids), "each of a's claims offered again by b, once"
    since_claim = [(round(claimed_at + t - asked_at[c["rollout_id"]], 1), c["attempt"]["sequence_id"]) for t, c in again]
    assert all(t >= 9.5 and seq == 2 for t, seq in since_claim), f"not before a's claims ran out (10s after each): {since_claim}"
    others = [c["rollout_id"] for _, c in got if c["rollout_id"] not in a_ids]
    assert sorted(others) == sorted({r["rollout_id"] for r in enqueued} - a_ids), "the rest once each"


def test_a_dequeue_right_after_an_enqueue_on_the_same_replica_hands_the_rollout_out(test_env: dict[str, str],
                                                                                      tmp_path: Path) -> None:
    """As its store does (one process: an enqueued rollout is there for the next dequeue): a replica that owns the task's
    partition waits, briefly, for its consumer to read back what it just enqueued instead of answering []."""
    solo = Replica(test_env, tmp_path / "solo")
    try:
        warm, deadline = solo.enqueue(["warm-up"]), time.monotonic() + 60
        while not solo.dequeue("w-0"):  # joined the group, every partition of rb.tasks its own
            assert time.monotonic() < deadline, "the replica never got its partitions"
            time.sleep(0.2)
        for n in range(10):
            [queued] = solo.enqueue([{"n": n}])
            got = solo.dequeue(f"w-{n}")
            assert [g["rollout_id"] for g in got] == [queued["rollout_id"]], (n, got)
        assert warm and solo.dequeue("w-x") == [], "nothing else: an empty queue answers [] (after no wait)"
    finally:
        solo.stop()
