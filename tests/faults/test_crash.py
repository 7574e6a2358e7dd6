"""SIGKILL the gateway, the stream worker and the task runner at seeded random points under a steady
workload; restart them; after draining, nothing is lost or doubled as a ClickHouse FINAL reader sees it."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import Producer

from faultkit import LONG, check_store, emitter, free_port, kill, py, rng, stop_worker, wait_drained, worker
from producers.tasks_cli import parse_tasks
from schemas.codec import encode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600 if LONG else 240)]


def otlp_body(spans: list[tuple[str, str, int, str]]) -> dict[str, Any]:
    """OTLP/JSON export request of (rollout id, attempt id, sequence id, span id hex) spans."""
    def attr(k: str, v: Any) -> dict[str, Any]:
        return {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}

    return {"resourceSpans": [{"resource": {"attributes": [attr("service.name", "faults")]}, "scopeSpans": [{"spans": [
        {"traceId": "ab" * 16, "spanId": sid, "name": "step", "startTimeUnixNano": str(seq), "endTimeUnixNano": str(seq + 1),
         "attributes": [attr("rolloutbus.rollout_id", rid), attr("rolloutbus.attempt_id", att), attr("rolloutbus.sequence_id", seq)]}
        for rid, att, seq, sid in spans]}]}]}


class Poster(threading.Thread):
    """An OTLP client: posts small batches at a steady rate; retries a batch until it gets a 200."""

    def __init__(self, url: str, batches: int) -> None:
        super().__init__(daemon=True)
        self.url, self.batches = url, batches
        self.acked: set[tuple[str, str, str]] = set()
        self.retries = 0
        self.bad: list[str] = []

    def run(self) -> None:
        for b in range(self.batches):
            rid = f"gw-{b}"
            spans = [(rid, f"{rid}-a1", s, uuid.uuid4().hex[:16]) for s in range(1, 4)]
            while True:
                try:
                    r = requests.post(self.url, json=otlp_body(spans), timeout=5)
                except requests.RequestException:
                    self.retries += 1
                    time.sleep(0.2)
                    continue
                if r.status_code == 200:
                    self.acked.update((rid, att, sid) for rid, att, _s, sid in spans)
                    break
                self.bad.append(f"{r.status_code} {r.text[:200]}")
                self.retries += 1
                time.sleep(0.2)
            time.sleep(0.05)


class SidePublisher(threading.Thread):
    """The trainer's and other processes' records the worker stores besides spans: a resource version, a
    train step and a dead letter every 0.2 s until stopped (each must have its row however the worker dies)."""

    def __init__(self, conf: dict[str, Any], topics: Any) -> None:
        super().__init__(daemon=True)
        self.producer, self.topics = Producer(conf), topics
        self.stopped = threading.Event()
        self.sent = 0

    def run(self) -> None:
        from schemas.models import DeadLetter, ResourceVersion, TrainStep

        n = 0
        while not self.stopped.is_set():
            n += 1
            now = time.time_ns()
            self.producer.produce(self.topics.resources, encode(ResourceVersion(name="policy", version=n, uri=f"/ckpt/{n}", created_ns=now)),
                                  b"policy")
            self.producer.produce(self.topics.metrics, encode(TrainStep(run_id="crash", step=n, time_ns=now, metrics={"loss": 1.0 / n})),
                                  b"crash")
            self.producer.produce(self.topics.dlq, encode(DeadLetter(source_topic=self.topics.spans, reason="test", detail=str(n), time_ns=now)),
                                  b"x")
            self.producer.poll(0)
            self.sent = n
            self.stopped.wait(0.2)
        assert self.producer.flush(10) == 0


def test_sigkill_gateway_worker_and_runner_mid_workload(kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path) -> None:
    r = rng("crash")
    scale = 3 if LONG else 1
    # tasks for the runner: group size 2
    tasks = parse_tasks([json.dumps({"task_id": f"rt{i}", "input": {"x": i}, "group_size": 2}) for i in range(12 * scale)])
    p = Producer(kafka_conf)
    for t in tasks:
        p.produce(topics.tasks, encode(t), t.task_id.encode())
    assert p.flush(10) == 0

    gw_port = free_port()
    gw_env = {**test_env, "ROLLOUTBUS_DATA_DIR": str(tmp_path / "gw"), "ROLLOUTBUS_GATEWAY_PORT": str(gw_port)}
    run_env = {**test_env, "ROLLOUTBUS_DATA_DIR": str(tmp_path / "runner"), "ROLLOUTBUS_RUNNER_GROUP": f"runners-{topics.prefix}",
               "ROLLOUTBUS_RUNNER_HEARTBEAT_S": "60"}
    em_env = {**test_env, "ROLLOUTBUS_DATA_DIR": str(tmp_path / "emitter")}
    logs = tmp_path / "logs"
    logs.mkdir()

    def start_gw() -> Any:
        return py(gw_env, "-m", "producers.ingest.gateway_cli", log=logs / "gateway.log")

    def start_runner() -> Any:
        return py(run_env, "-m", "producers.runner_cli", "tests.faults.fault_agents:Steady", "--concurrency", "4", log=logs / "runner.log")

    wk = worker(test_env, rollout_timeout=20)
    gw = start_gw()
    rn = start_runner()
    em_out = tmp_path / "emitted.jsonl"
    em = emitter(em_env, em_out, "--rollouts", str(120 * scale), "--rate", "8", "--tasks", str(30 * scale), log=logs / "emitter.log")
    url = f"http://127.0.0.1:{gw_port}/v1/traces"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(url.replace("/v1/traces", "/healthz"), timeout=1).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.3)
    poster = Poster(url, 150 * scale)
    poster.start()
    side = SidePublisher(kafka_conf, topics)
    side.start()

    # Seeded kill points (seconds into the workload), each followed by a restart a moment later.
    plan = sorted([(r.uniform(2, 10) * scale, "worker"), (r.uniform(2, 10) * scale, "gateway"), (r.uniform(2, 10) * scale, "runner")])
    print("kill plan:", [(round(t, 2), what) for t, what in plan])
    t0 = time.monotonic()
    for at, what in plan:
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        if what == "worker":
            kill(wk)
            (logs / "worker-killed.log").write_text(wk.output())  # its output lives in memory only
            wk = worker(test_env, rollout_timeout=20)
        elif what == "gateway":
            kill(gw)
            time.sleep(0.5)
            gw = start_gw()
        else:
            kill(rn)
            rn = start_runner()

    poster.join(120)
    assert not poster.is_alive(), "the OTLP client did not finish"
    side.stopped.set()
    side.join(20)
    assert em.wait(120) == 0, (logs / "emitter.log").read_text()[-2000:]
    wait_drained(kafka_conf, test_env, wk, timeout=120)
    rc, out = stop_worker(wk)
    (logs / "worker.log").write_text(out)
    assert rc == 0, out[-3000:]
    rn.terminate()
    gw.terminate()
    rn.wait(30)
    gw.wait(30)

    res = check_store(test_env, kafka_conf, "crash")
    stored = set(res["truth"]["spans"])
    # Ground truth on the producer side: what the agent emitted and what the gateway answered 200 for.
    emitted = [json.loads(line) for line in em_out.read_text().splitlines()]
    per_attempt: dict[tuple[str, str], int] = {}
    for rid, att, _sid in stored:
        per_attempt[(rid, att)] = per_attempt.get((rid, att), 0) + 1
    short = [e for e in emitted if per_attempt.get((e["rid"], e["att"]), 0) != e["n"]]
    gw_lost = poster.acked - stored
    finished_runner = [k for k, v in res["truth"]["finished"].items() if v["task_id"].startswith("rt")]
    runner_tasks = {v["task_id"] for v in res["truth"]["finished"].values() if v["task_id"].startswith("rt") and v["status"] == "succeeded"}
    print("FIGURES " + json.dumps({"test": "crash/producers", "emitter_rollouts": len(emitted), "emitter_spans": sum(e["n"] for e in emitted),
                                   "emitter_rollouts_short": len(short), "gateway_spans_acked": len(poster.acked),
                                   "gateway_spans_lost": len(gw_lost), "gateway_client_retries": poster.retries,
                                   "runner_attempts_finished": len(finished_runner), "runner_tasks_succeeded": len(runner_tasks)}))
    assert not poster.bad or all(b.startswith("503") for b in poster.bad), poster.bad[:3]
    assert not short, f"{len(short)} emitted rollouts not complete in ClickHouse, e.g. {short[:2]}"
    assert not gw_lost, f"{len(gw_lost)} spans the gateway answered 200 for are missing, e.g. {sorted(gw_lost)[:3]}"
    assert runner_tasks == {t.task_id for t in tasks}, "every task ran to a succeeded rollout despite the runner's crash"
