"""Agent Lightning 0.3's store semantics through two gateway replicas (``/v1/agl``, the calls its
``LightningStoreClient`` sends, 0.3.0): what one replica answers, the other reads back at once — a rollout enqueued
(before any attempt of it ended), started, dequeued and ended, its attempts; span sequence ids handed out by both
at once; a new attempt (start_attempt), update_rollout, statistics; a worker's heartbeat — through the control records
every replica replays (producers/ingest/agl/control_log.py). ClickHouse is the embedded engine, which the gateway does
not read: every read here is the control records'. A restarted replica replays them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from producers_testkit import start_gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def replicas(test_env: dict[str, str], tmp_path: Path) -> Iterator[list[Any]]:
    started = [list(start_gateway(test_env, tmp_path / f"gw-{n}", TOKEN)) for n in ("a", "b")]
    yield started
    for _, proc in started:
        proc.terminate()
        proc.wait(30)


def _call(base: str, method: str, path: str, **kw: Any) -> Any:
    resp = requests.request(method, f"{base}/v1/agl{path}", headers=AUTH, timeout=30, **kw)
    assert resp.status_code in (200, 201), (method, path, resp.status_code, resp.text[:500])
    return resp.json()


def test_what_one_replica_answers_the_other_reads_back_at_once(replicas: list[Any], test_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    (a, _), (b, _) = replicas
    [queued] = _call(a, "POST", "/queues/rollouts/enqueue", json={"rollouts": [{"input": {"q": "2+2?"}, "mode": "train"}]})
    rid = queued["rollout_id"]
    assert _call(b, "GET", f"/rollouts/{rid}")["status"] == "queuing", "enqueued on a, read on b at once"
    listed = _call(b, "POST", "/rollouts/search", json={"status_in": ["queuing"]})
    assert [r["rollout_id"] for r in listed["items"]] == [rid] and listed["total"] == 1

    # A rollout its caller runs now (start_rollout), readable at once on the other replica.
    started = _call(b, "POST", "/rollouts", json={"input": {"q": "3+3?"}, "mode": "val"})
    assert _call(a, "GET", f"/rollouts/{started['rollout_id']}")["status"] == "preparing"

    # Dequeued on whichever replica owns its task's partition; read as preparing on both at once.
    deadline, got = time.monotonic() + 60, []
    while not got and time.monotonic() < deadline:
        for base in (a, b):
            got += _call(base, "POST", "/queues/rollouts/dequeue", json={"limit": 1, "worker_id": "w-1"})
        time.sleep(0.2)
    assert [g["rollout_id"] for g in got] == [rid]
    assert {_call(base, "GET", f"/rollouts/{rid}")["status"] for base in (a, b)} == {"preparing"}
    aid = got[0]["attempt"]["attempt_id"]
    assert [x["attempt_id"] for x in _call(b, "GET", f"/rollouts/{rid}/attempts")["items"]] == [aid]

    # Span sequence ids: two replicas, concurrent callers, one attempt: each id once, 1 up, no gap.
    def next_id(base: str) -> int:
        return _call(base, "POST", "/spans/next", json={"rollout_id": rid, "attempt_id": aid})["sequence_id"]

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(next_id, [a, b] * 20))
    assert sorted(ids) == list(range(1, 41)), "unique across replicas"
    assert next_id(b) == 41 and next_id(a) == 42, "increasing, whichever replica answers"

    _call(a, "POST", f"/rollouts/{rid}/attempts/{aid}", json={"status": "running", "worker_id": "w-1"})
    assert _call(b, "GET", f"/rollouts/{rid}/attempts/latest")["status"] == "running"
    _call(a, "POST", f"/rollouts/{rid}/attempts/{aid}", json={"status": "succeeded"})
    assert _call(b, "GET", f"/rollouts/{rid}")["status"] == "succeeded"
    latest = _call(b, "GET", f"/rollouts/{rid}/attempts/latest")
    assert (latest["attempt_id"], latest["status"], latest["worker_id"]) == (aid, "succeeded", "w-1")

    # start_attempt on one replica after an attempt failed, numbered 2; both attempts read on the other at once.
    first = started["attempt"]
    _call(a, "POST", f"/rollouts/{started['rollout_id']}/attempts/{first['attempt_id']}", json={"status": "failed"})
    retry = _call(b, "POST", f"/rollouts/{started['rollout_id']}/attempts", json={"worker_id": "w-2"})
    assert retry["attempt"]["sequence_id"] == 2 and retry["status"] == "preparing"
    attempts = _call(a, "POST", f"/rollouts/{started['rollout_id']}/attempts/search",
                     json={"sort_by": "sequence_id", "sort_order": "desc"})
    assert [(x["sequence_id"], x["status"]) for x in attempts["items"]] == [(2, "preparing"), (1, "failed")]
    # update_rollout on one, read on the other; statistics count what the records hold.
    _call(a, "POST", f"/rollouts/{started['rollout_id']}", json={"status": "cancelled", "metadata": {"why": "test"}})
    read = _call(b, "GET", f"/rollouts/{started['rollout_id']}")
    assert (read["status"], read["metadata"]) == ("cancelled", {"why": "test"})
    stats = _call(b, "GET", "/statistics")
    assert (stats["total_rollouts"], stats["total_attempts"]) == (2, 3)

    # A worker's heartbeat on one replica, read on the other; one with no stats keeps the last ones.
    _call(a, "POST", "/workers/w-1", json={"heartbeat_stats": {"cpu": 0.5}})
    _call(b, "POST", "/workers/w-1", json=None)
    worker = _call(a, "GET", "/workers/w-1")
    assert worker["worker_id"] == "w-1" and worker["heartbeat_stats"] == {"cpu": 0.5}
    assert [w["worker_id"] for w in _call(b, "POST", "/workers/search", json={"worker_id_contains": "w-"})["items"]] == [
        "w-1", "w-2"], "w-2 by the attempt it started"
    assert _call(b, "GET", "/workers/w-1")["status"] == "idle", "its attempt succeeded"
    assert requests.get(f"{a}/v1/agl/workers/nobody", headers=AUTH, timeout=10).json() is None

    # A replica that restarts replays the records: it still reads them.
    replicas[0][1].terminate()
    replicas[0][1].wait(30)
    replicas[0][:] = start_gateway(test_env, tmp_path / "gw-a2", TOKEN)
    a2 = replicas[0][0]
    assert _call(a2, "GET", f"/rollouts/{rid}")["status"] == "succeeded"
    assert _call(a2, "GET", "/workers/w-1")["heartbeat_stats"] == {"cpu": 0.5}
    assert next_id(a2) == 43, "the counter replays too"
    assert _call(a2, "GET", f"/rollouts/{started['rollout_id']}/attempts/latest")["sequence_id"] == 2


def test_a_queuing_rollout_leaves_the_queue_by_a_new_attempt_or_a_status_through_either_replica(replicas: list[Any]) -> None:
    """As its store does: start_attempt on a rollout still queuing starts it (``preparing``, attempt 1) and update_rollout
    with a status ends it, through the replica that does not own its task; neither is handed out by a dequeue after
    that, on either replica, while the rollouts enqueued beside them are, each once."""
    (a, _), (b, _) = replicas
    out = _call(a, "POST", "/queues/rollouts/enqueue", json={"rollouts": [{"input": {"q": n}, "mode": "train"} for n in range(2)]})
    started_id, cancelled_id = (r["rollout_id"] for r in out)
    begun = _call(b, "POST", f"/rollouts/{started_id}/attempts", json={"worker_id": "w-9"})
    assert (begun["status"], begun["attempt"]["sequence_id"], begun["attempt"]["worker_id"]) == ("preparing", 1, "w-9")
    ended = _call(b, "POST", f"/rollouts/{cancelled_id}", json={"status": "cancelled"})
    assert ended["status"] == "cancelled" and ended["end_time"]
    assert _call(a, "GET", f"/rollouts/{started_id}")["status"] == "preparing", "read on the other replica at once"
    others = {r["rollout_id"] for r in _call(a, "POST", "/queues/rollouts/enqueue",
                                             json={"rollouts": [{"input": {"q": n}, "mode": "train"} for n in range(2, 8)]})}
    handed: list[str] = []
    deadline = time.monotonic() + 90
    while not others <= set(handed) and time.monotonic() < deadline:
        for base in (a, b):
            handed += [g["rollout_id"] for g in _call(base, "POST", "/queues/rollouts/dequeue", json={"limit": 10, "worker_id": "w-1"})]
        time.sleep(0.2)
    for _ in range(5):  # a few more rounds: nothing else comes
        for base in (a, b):
            handed += [g["rollout_id"] for g in _call(base, "POST", "/queues/rollouts/dequeue", json={"limit": 10, "worker_id": "w-1"})]
        time.sleep(0.2)
    assert sorted(handed) == sorted(others), "the two that left the queue are never handed out; the others once each"
    attempts = _call(a, "GET", f"/rollouts/{started_id}/attempts")["items"]
    assert [(x["sequence_id"], x["attempt_id"]) for x in attempts] == [(1, begun["attempt"]["attempt_id"])]
    assert _call(b, "GET", f"/rollouts/{cancelled_id}")["status"] == "cancelled"


def _dequeue_one(bases: list[str], worker: str, timeout_s: float = 60) -> tuple[str, dict[str, Any]]:
    """Poll both replicas until one hands out a rollout: (the replica, its AttemptedRollout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for base in bases:
            got = _call(base, "POST", "/queues/rollouts/dequeue", json={"limit": 1, "worker_id": worker})
            if got:
                return base, got[0]
        time.sleep(0.2)
    raise AssertionError(f"nothing dequeued in {timeout_s}s")


def test_the_latest_attempt_moves_its_rollout_and_workers_follow_their_attempts_through_either_replica(
        replicas: list[Any]) -> None:
    """As its store does: a failed attempt with attempts left requeues its rollout (offered again, attempt 2); an older
    attempt's status leaves the rollout alone; ``latest`` names the latest attempt; a worker is busy with the attempt it
    dequeued, idle once it ended or when a dequeue finds nothing; a null an update needs, and a page it cannot give, 400
    — each written on one replica and read on the other."""
    (a, _), (b, _) = replicas
    [queued] = _call(a, "POST", "/queues/rollouts/enqueue", json={"rollouts": [{"input": {"q": 1}, "mode": "train", "config": {
        "max_attempts": 2, "retry_condition": ["failed"], "timeout_seconds": 120}}]})
    rid = queued["rollout_id"]
    owner, first = _dequeue_one([a, b], "w-1")
    other = b if owner == a else a
    worker = _call(other, "GET", "/workers/w-1")
    assert (worker["status"], worker["current_rollout_id"], worker["current_attempt_id"]) == ("busy", rid, first["attempt"]["attempt_id"])
    assert worker["last_dequeue_time"] and worker["last_busy_time"]

    _call(owner, "POST", f"/rollouts/{rid}/attempts/latest", json={"metadata": {"step": "plan"}})
    assert _call(other, "GET", f"/rollouts/{rid}/attempts/latest")["metadata"] == {"step": "plan"}
    failed = _call(owner, "POST", f"/rollouts/{rid}/attempts/latest", json={"status": "failed"})
    assert (failed["attempt_id"], failed["status"]) == (first["attempt"]["attempt_id"], "failed")
    assert _call(other, "GET", f"/rollouts/{rid}")["status"] == "requeuing", "attempts left: back in the queue"
    assert _call(other, "GET", "/workers/w-1")["status"] == "idle"

    _, second = _dequeue_one([a, b], "w-2")
    assert (second["rollout_id"], second["attempt"]["sequence_id"]) == (rid, 2), "offered again, attempt 2"
    _call(other, "POST", f"/rollouts/{rid}/attempts/{first['attempt']['attempt_id']}", json={"status": "succeeded"})
    assert _call(owner, "GET", f"/rollouts/{rid}")["status"] == "preparing", "an older attempt leaves its rollout alone"
    _call(other, "POST", f"/rollouts/{rid}/attempts/latest", json={"status": "failed"})
    assert _call(owner, "GET", f"/rollouts/{rid}")["status"] == "failed", "no attempts left"

    _call(other, "POST", "/queues/rollouts/dequeue", json={"limit": 1, "worker_id": "w-3"})
    assert _call(owner, "GET", "/workers/w-3")["status"] == "idle", "a dequeue that found nothing"
    assert {w["worker_id"] for w in _call(owner, "POST", "/workers/search", json={"status_in": ["idle"]})["items"]} >= {
        "w-2", "w-3"}

    for base, path, body, words in (
            (a, f"/rollouts/{rid}", {"status": None}, "status is invalid; it cannot be a null value."),
            (b, f"/rollouts/{rid}/attempts/latest", {"worker_id": None}, "worker_id is invalid"),
            (a, "/workers/w-1", {"heartbeat_stats": None}, "heartbeat_stats is invalid"),
            (b, "/rollouts/search", {"sort_by": "nope"}, "Invalid sort_by: nope, allowed fields are: rollout_id"),
            (a, f"/rollouts/{rid}/attempts/search", {"limit": 0}, "Limit must be greater than 0")):
        resp = requests.post(f"{base}/v1/agl{path}", headers=AUTH, json=body, timeout=30)
        assert resp.status_code == 400 and resp.json()["detail"].startswith(words), (path, resp.status_code, resp.text)
    assert requests.post(f"{a}/v1/agl/rollouts/ro-none/attempts/latest", headers=AUTH, json={"status": "running"},
                         timeout=30).status_code == 404


def test_its_own_client_writes_on_one_replica_and_reads_on_the_other(replicas: list[Any], tmp_path: Path) -> None:
    """The same semantics through Agent Lightning 0.3.0's own ``LightningStoreClient`` (al_replicas_driver.py, in its
    virtualenv), one client per replica."""
    import json
    import os
    import subprocess

    from al_venv import ENV, ALInstallError, ensure_venv

    try:
        python = ensure_venv()
    except ALInstallError as exc:
        pytest.fail(f"Agent Lightning is needed for this test and could not be installed: {exc}")
    (a, _), (b, _) = replicas
    out = tmp_path / "replicas.json"
    al_env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}, **ENV}
    urls = [base.replace("http://", f"http://agl:{TOKEN}@") for base in (a, b)]
    run = subprocess.run([str(python), str(Path(__file__).resolve().parent / "al_replicas_driver.py"), *urls, str(out)],
                         env=al_env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and out.exists(), (run.stdout + run.stderr)[-6000:]
    got = json.loads(out.read_text())
    assert got["latest_on_b"] == [True, 1, "preparing"]
    assert got["ids"] == list(range(1, 21)), "20 concurrent callers on two replicas: each id once"
    assert got["added_id"] == 100 and got["next_after_100"] == 101, "a span's own id moves the counter above it"
    assert got["status_after_failed"] == "failed"
    assert got["retry"] == [2, "preparing", "w-2"]
    assert got["attempts_on_a"] == [[1, "failed"], [2, "preparing"]]
    assert got["status_after_succeeded"] == "succeeded"
    assert got["enqueued_on_a"] == [[True, "queuing"]]
    assert got["update_reply"] == got["update_on_b"] == {"note": "kept"}
    assert got["worker_on_b"] == {"cpu": 0.25}
    assert got["resources"][1] == [got["resources"][0]]
    assert got["resources_by_id_on_b"] == [got["resources"][0], ["main"]], "added on a, read by id on b at once"
    assert got["second_on_a"] == [True, "tiny-2"], "added on b, read by id on a at once"
    ids, total, ours = got["resources_all"]
    assert set(ours) <= set(ids) and total == len(ids) == len(set(ids)) and ids == sorted(ids), "the history, sorted"
    assert got["resources_pages"] == [[ids[:1], 1, 0, total], [ids[1:2], 1, 1, total]], \
        "a page of one at each offset, on either replica, with its server's limit, offset and total"
    assert got["statistics"] == [2, 2, 2], "w-2 (its attempt) and w-9 (its heartbeat), as its store counts them"
