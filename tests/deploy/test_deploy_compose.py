"""The production topology, for real, in containers on this machine (issue 25).

deploy/docker-compose.yml + deploy/compose.local.yml (images built here; ``clickhouse`` is ``rolloutbus
store``) + tests/deploy/compose.test.yml (sizes), brought up with podman by deploy/containers: 3 KRaft
brokers (replication 3, min ISR 2), the store, init (topics + migrations), 2 gateway and 2 proxy
replicas, the policy server, 3 stream workers, 2 runner replicas with the calculator agent, the trainer.

The tests run in order on one deployment, as a user would see it from outside (Kafka on the published
ports, ClickHouse over HTTP):

1. calculator tasks run through it; every span exactly once (FINAL), every attempt one row, a new
   policy version published and rollouts made with it;
2. ``podman kill`` of the broker leading the most ``rb.spans`` partitions and of a stream worker while
   tasks run: nothing lost, nothing twice;
3. one attempt's spans sent alternately through both gateway replicas arrive once each, numbered apart;
4. ``down`` then ``up`` again: the store, the topics, the consumer offsets and the trainer's checkpoints
   come back from the volumes and the run goes on.

Timings go to ``~/.cache/rolloutbus/containers/deploy-test-timings.json`` (and are printed). Skipped, with
the reason, only when containers cannot run on this host (or ROLLOUTBUS_SKIP_DEPLOY is set).
"""

from __future__ import annotations

import collections
import json
import os
import random
import socket
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.installs import missing

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "deploy" / "containers"))

import host  # noqa: E402
from images import build_all  # noqa: E402

PROJECT = "rbdeploytest"
GROUP_SIZE = 4  # the stream workers' default group size: one train task = one GRPO group
TEST_COMPOSE = Path(__file__).resolve().parent / "compose.test.yml"
TIMINGS: dict[str, Any] = {}
OUTAGE_S = 40  # how long the killed broker and stream worker stay down
pytestmark = [pytest.mark.solo, pytest.mark.timeout(1800)]


def say(msg: str) -> None:
    print(f"[deploy {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _free_ports(n: int, consecutive: bool = False) -> list[int]:
    """``n`` ports free on this host now (``consecutive``: a run of n), below the kernel's ephemeral range: a port
    from that range, free when chosen, can be any outgoing connection's own by the time a container publishes it
    (seen: a gateway's host port taken between the choice and the start), as tests/conftest.py's broker ports."""
    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                return False
            return True

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    out: list[int] = []
    for _ in range(500):
        p = random.randrange(10000, low - n) if low - n > 10000 else random.randrange(1024, 10000)
        if not free(p):
            continue
        if consecutive:
            if all(free(p + i) for i in range(n)):
                return list(range(p, p + n))
        elif p not in out:
            out.append(p)
            if len(out) == n:
                return out
    raise RuntimeError("no free host ports")


def wait_for(what: str, cond: Callable[[], Any], timeout: float, every: float = 2.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


@dataclass
class Deployment:
    stack: Any
    bootstrap: str
    ch_port: int
    gateway_ports: list[int]
    proxy_ports: list[int]
    secrets: dict[str, str]
    published: list[str] = field(default_factory=list)
    _producer: Any = None

    # -------------------------------------------------------------- clients

    def ch(self) -> Any:
        import clickhouse_connect

        return clickhouse_connect.get_client(host="127.0.0.1", port=self.ch_port, username="rolloutbus",
                                             password=self.secrets["CLICKHOUSE_PASSWORD"], database="rolloutbus")

    def query(self, sql: str) -> list[tuple]:
        client = self.ch()
        try:
            return client.query(sql).result_rows
        finally:
            client.close()

    def publish_tasks(self, n: int) -> list[str]:
        """``n`` calculator train tasks (one GRPO group each) on rb.tasks."""
        from confluent_kafka import Producer

        from rolloutbus.demo import calc
        from schemas import Task, encode

        problems = calc.problems(200, seed=25)
        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "log_level": 0})
        producer = self._producer
        ids = []
        for _ in range(n):
            i = len(self.published)
            p = problems[i % len(problems)]
            task = Task(task_id=f"deploy-{i:04d}", input=p.to_json(), mode="train", group_size=GROUP_SIZE,
                        created_ns=time.time_ns(), metadata={"question": p.text})
            producer.produce("rb.tasks", key=task.task_id.encode(), value=encode(task))
            self.published.append(task.task_id)
            ids.append(task.task_id)
        assert producer.flush(60) == 0, "tasks not delivered to Kafka"
        return ids

    # -------------------------------------------------------------- what Kafka holds

    def read_topic(self, topic: str) -> list[tuple[str, dict[str, Any]]]:
        """Every record on ``topic`` now, decoded: (record name, fields)."""
        from confluent_kafka import Consumer, TopicPartition

        from schemas import decode_raw

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"deploy-truth-{uuid.uuid4().hex[:8]}",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest", "log_level": 0})
        try:
            parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
            ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in parts}
            c.assign([TopicPartition(topic, p, lo) for p, (lo, hi) in ends.items() if hi > lo])
            left = {p for p, (lo, hi) in ends.items() if hi > lo}
            out = []
            deadline = time.monotonic() + 120
            while left and time.monotonic() < deadline:
                m = c.poll(2)
                if m is None or m.error():
                    continue
                out.append(decode_raw(m.value()))
                if m.offset() + 1 >= ends[m.partition()][1]:
                    left.discard(m.partition())
            assert not left, f"{topic} partitions {sorted(left)} could not be read to their end"
            return out
        finally:
            c.close()

    def kafka_truth(self) -> tuple[collections.Counter, dict[tuple[str, str], dict[str, Any]]]:
        """Every span record on rb.spans (key (rollout, attempt, span) -> copies) and every attempt's events."""
        spans: collections.Counter = collections.Counter()
        attempts: dict[tuple[str, str], dict[str, Any]] = {}
        for name, d in self.read_topic("rb.spans"):
            if name == "rolloutbus.Span":
                spans[(d["rollout_id"], d["attempt_id"], d["span_id"])] += 1
            else:
                a = attempts.setdefault((d["rollout_id"], d["attempt_id"]), {"events": set()})
                a["events"].add(str(d["event"]).rsplit(".", 1)[-1])
                a["task_id"] = d["task_id"]
        return spans, attempts

    # -------------------------------------------------------------- waiting and checking

    def rollouts_done(self, task_ids: list[str]) -> int:
        ids = ",".join(f"'{t}'" for t in task_ids)
        rows = self.query(f"SELECT uniqExact(rollout_id) FROM rollouts FINAL WHERE task_id IN ({ids})")
        return int(rows[0][0])

    def wait_tasks(self, task_ids: list[str], timeout: float) -> None:
        want = len(task_ids) * GROUP_SIZE
        wait_for(f"{want} rollouts of {len(task_ids)} tasks in ClickHouse",
                 lambda: self.rollouts_done(task_ids) >= want, timeout)

    def check_exactly_once(self, settle_s: float = 45.0) -> dict[str, int]:
        """ClickHouse (FINAL) holds exactly what Kafka holds: every span once, every attempt one row, every
        policy version, train step and group. The pipeline may still be storing the last records (a train
        step published a moment ago): compared again until it agrees or ``settle_s`` has passed."""
        end = time.monotonic() + settle_s
        while True:
            try:
                return self._compare()
            except AssertionError:
                if time.monotonic() > end:
                    raise
                time.sleep(3)

    def _compare(self) -> dict[str, int]:
        spans, attempts = self.kafka_truth()
        ch_spans = self.query("SELECT rollout_id, attempt_id, span_id, count() FROM spans FINAL GROUP BY 1, 2, 3")
        in_ch = {(r, a, s) for r, a, s, _ in ch_spans}
        lost = set(spans) - in_ch
        extra = in_ch - set(spans)
        twice = [k for k in ch_spans if k[3] > 1]
        assert not lost, f"{len(lost)} spans on rb.spans are not in ClickHouse, e.g. {sorted(lost)[:3]}"
        assert not extra, f"{len(extra)} spans in ClickHouse are not on rb.spans, e.g. {sorted(extra)[:3]}"
        assert not twice, f"{len(twice)} spans twice in spans FINAL, e.g. {twice[:3]}"
        rows = self.query("SELECT rollout_id, attempt_id, count(), any(status), any(span_count), any(spans_seen), "
                          "any(length(missing_sequence_ids)) FROM rollouts FINAL GROUP BY 1, 2")
        by_key = {(r, a): (n, st, sc, seen, miss) for r, a, n, st, sc, seen, miss in rows}
        finished = {k for k, v in attempts.items() if "FINISHED" in v["events"]}
        missing_rows = finished - set(by_key)
        assert not missing_rows, f"{len(missing_rows)} finished attempts have no rollouts row, e.g. {sorted(missing_rows)[:3]}"
        # Attempts sent through the gateways only (test 3) have no lifecycle events; the sink stores them as timed out.
        unknown = {k for k in by_key if k not in attempts and not k[0].startswith("gw-")}
        assert not unknown, f"{len(unknown)} rollouts rows for attempts never started on rb.spans: {sorted(unknown)[:3]}"
        bad = {k: v for k, v in by_key.items() if k in finished and (v[0] != 1 or v[2] != v[3] or v[4])}
        assert not bad, f"attempts with duplicate rows, unseen spans or missing sequence ids: {dict(list(bad.items())[:3])}"
        raw = self.query("SELECT count() FROM spans")[0][0]
        # What the sink stores from the other topics: policy versions, train steps, GRPO groups.
        for topic, table, key in (("rb.resources", "resource_versions", ("name", "version")),
                                  ("rb.metrics", "train_steps", ("run_id", "step")),
                                  ("rb.batches", "groups", ("group_id",))):
            on_kafka = {tuple(d[k] for k in key) for _, d in self.read_topic(topic)}
            stored = {tuple(r) for r in self.query(f"SELECT {', '.join(key)} FROM {table} FINAL")}
            assert not on_kafka - stored, f"{table} FINAL lacks records of {topic}: {sorted(on_kafka - stored)[:5]}"
            if topic != "rb.resources":  # compacted: Kafka may drop old versions the table keeps
                assert not stored - on_kafka, f"{table} FINAL has records not on {topic}: {sorted(stored - on_kafka)[:5]}"
        return {"spans": len(spans), "span_records_on_kafka": sum(spans.values()), "span_rows_before_final": int(raw),
                "attempts": len(attempts), "finished_attempts": len(finished)}

    def replica_stats(self, ports: list[int]) -> list[dict[str, Any]]:
        """Each replica's /healthz (its span transport's counters), through its published port."""
        out = []
        for port in ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
                out.append(json.loads(resp.read()))
        return out

    def max_version(self) -> int:
        rows = self.query("SELECT max(version) FROM resource_versions FINAL WHERE name = 'policy'")
        return int(rows[0][0] or 0)

    def broker_container(self, node_id: int) -> str:
        for name, svc in self.stack.project.services.items():
            if svc.environment.get("KAFKA_NODE_ID") == str(node_id):
                return self.stack.project.container(name)
        raise AssertionError(f"no service has KAFKA_NODE_ID {node_id}")

    def dump_logs(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name in self.stack.state():
            (directory / f"{name}.log").write_text(self.stack.logs(name, tail=400))


@pytest.fixture(scope="module")
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    if os.environ.get("ROLLOUTBUS_SKIP_DEPLOY"):
        missing("the container topology test (ROLLOUTBUS_SKIP_DEPLOY is set)", "unset ROLLOUTBUS_SKIP_DEPLOY")
    if not sys.platform.startswith("linux"):
        pytest.skip(f"containers run on Linux only with podman; this is {sys.platform}")
    try:
        host.ensure_tools(say)
    except host.HostError as exc:
        missing(f"a container host ({exc})", "make containers-host (podman, runc, debootstrap; as root)")
    why = host.probe()
    if why:
        missing(f"a container host ({why})", "make containers-host (podman, runc, debootstrap; as root)")
    # One run at a time on a host: a second session's run waits here instead of taking the project down
    # under the first (and both would measure a machine twice as busy).
    import fcntl

    host.cache_dir().mkdir(parents=True, exist_ok=True)
    lock = (host.cache_dir() / "deploy-test.lock").open("w")
    t0 = time.monotonic()
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() - t0 > 1200:
                pytest.fail("another session's container test has held the host for 20 minutes (deploy-test.lock)")
            time.sleep(5)
    if time.monotonic() - t0 > 1:
        say(f"waited {time.monotonic() - t0:.0f}s for another session's container test to finish")
    request.addfinalizer(lock.close)
    t0 = time.monotonic()
    images = build_all(say)  # a failed build is a failure, not a skip
    TIMINGS["images_s"] = round(time.monotonic() - t0, 1)
    why = host.probe(images["RB_BASE_IMAGE"])
    if why:
        missing(f"a container host that runs the built images ({why})", "make containers-host")

    from lifecycle import Stack, engine
    from stack import _project_env, local_project

    k1, k2, k3, ch = _free_ports(4)
    gw = _free_ports(2, consecutive=True)
    px = _free_ports(2, consecutive=True)
    env = {**images, "KAFKA_1_PORT": str(k1), "KAFKA_2_PORT": str(k2), "KAFKA_3_PORT": str(k3),
           "CLICKHOUSE_HTTP_PORT": str(ch), "GATEWAY_PORTS": f"{gw[0]}-{gw[1]}", "PROXY_PORTS": f"{px[0]}-{px[1]}",
           "KAFKA_EXTERNAL_HOST": "localhost", "SPAN_PARTITIONS": "6", "STREAM_WORKERS": "3", "RUNNERS": "2",
           "GATEWAY_REPLICAS": "2", "PROXY_REPLICAS": "2"}
    project = local_project(PROJECT, [TEST_COMPOSE], env=env, build=False, say=say)
    with engine():  # podman's Docker API, which testcontainers drives, for as long as the module runs
        stack = Stack(project, say=say)
        stack.down(volumes=True)  # what an interrupted earlier run left
        dep = Deployment(stack, f"localhost:{k1},localhost:{k2},localhost:{k3}", ch, gw, px,
                         _project_env(PROJECT))
        failed_before = request.session.testsfailed
        try:
            t0 = time.monotonic()
            stack.up(timeout=600)
            TIMINGS["up_s"] = round(time.monotonic() - t0, 1)
            say(f"up in {TIMINGS['up_s']}s: {len(stack.state())} containers")
            yield dep
        finally:
            if request.session.testsfailed > failed_before:
                logs = host.cache_dir() / "logs" / "deploy-test"
                dep.dump_logs(logs)
                say(f"containers' logs in {logs}")
            if not os.environ.get("ROLLOUTBUS_DEPLOY_KEEP"):
                t0 = time.monotonic()
                stack.down(volumes=True)
                TIMINGS["down_v_s"] = round(time.monotonic() - t0, 1)
            out = host.cache_dir() / "deploy-test-timings.json"
            out.write_text(json.dumps(TIMINGS, indent=2))
            say(f"timings {json.dumps(TIMINGS)} (also in {out})")


def test_tasks_run_through_the_topology_and_train(deployment: Deployment) -> None:
    dep = deployment
    t0 = time.monotonic()
    first = dep.publish_tasks(8)  # 32 rollouts = 8 groups = 2 optimiser steps
    dep.wait_tasks(first, 300)
    TIMINGS["first_8_tasks_s"] = round(time.monotonic() - t0, 1)
    wait_for("a policy version > 0 on rb.resources (stored by the sink)", lambda: dep.max_version() >= 1, 180)
    TIMINGS["first_new_version_s"] = round(time.monotonic() - t0, 1)
    # Runners pick the new version up: keep a little work flowing until rollouts carry it.
    more = dep.publish_tasks(4)
    wait_for("rollouts made with a policy version > 0",
             lambda: dep.query("SELECT count() FROM rollouts FINAL WHERE resource_version >= 1")[0][0] > 0, 240)
    TIMINGS["first_rollout_on_new_version_s"] = round(time.monotonic() - t0, 1)
    dep.wait_tasks(more, 300)
    counts = dep.check_exactly_once()
    TIMINGS["phase1"] = {**counts, "versions": dep.max_version()}
    say(f"phase 1: {counts}, policy version {dep.max_version()}")
    per_task = dep.query("SELECT task_id, uniqExact(rollout_id) FROM rollouts FINAL GROUP BY 1")
    assert {t: n for t, n in per_task} == {t: GROUP_SIZE for t in dep.published}
    proxies = dep.replica_stats(dep.proxy_ports)
    TIMINGS["proxy_replicas"] = [{k: v for k, v in p.items() if isinstance(v, (int, float))} for p in proxies]
    say(f"proxy replicas: {TIMINGS['proxy_replicas']}")
    # The images carry native/ (a wheel built on this host): the stream workers run the compiled span stage.
    workers = [n for n in dep.stack.state() if "stream-worker" in n]
    assert workers
    for name in workers:
        assert "the compiled decoder is not installed" not in dep.stack.logs(name, tail=100000), f"{name} runs the Python paths"
        probe = dep.stack.exec(name, "python3", "-c", "import rolloutbus_native")
        assert probe.exit_code == 0, probe.output.decode(errors="replace")


def test_broker_and_stream_worker_killed_mid_run(deployment: Deployment) -> None:
    """Tasks keep arriving (one a second) while the broker leading the most rb.spans partitions and a
    stream worker are SIGKILLed; the rest carry on, the two come back, nothing is lost or doubled."""
    import threading

    from confluent_kafka.admin import AdminClient

    dep = deployment
    t0 = time.monotonic()
    stop = threading.Event()
    batch: list[str] = []
    errors: list[BaseException] = []

    def feed() -> None:
        try:
            while not stop.is_set():
                batch.extend(dep.publish_tasks(1))
                stop.wait(1.0)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        wait_for("the first rollouts of the batch", lambda: len(batch) >= 6 and dep.rollouts_done(list(batch)) >= 8, 120, every=1.0)
        admin = AdminClient({"bootstrap.servers": dep.bootstrap, "log_level": 0})
        leaders = collections.Counter(p.leader for p in admin.list_topics("rb.spans", timeout=30).topics["rb.spans"].partitions.values())
        node, led = leaders.most_common(1)[0]
        broker = dep.broker_container(node)
        worker = dep.stack.project.container("stream-worker", 2)
        published_at_kill = len(batch) * GROUP_SIZE
        stored_at_kill = dep.rollouts_done(list(batch))
        dep.stack.kill(broker)
        dep.stack.kill(worker)
        t_kill = time.monotonic()
        say(f"killed {broker} (leader of {led} of {sum(leaders.values())} rb.spans partitions) and {worker} "
            f"with {stored_at_kill}/{published_at_kill} rollouts stored")
        series = []
        while time.monotonic() - t_kill < OUTAGE_S:
            series.append((round(time.monotonic() - t_kill, 1), len(batch) * GROUP_SIZE, dep.rollouts_done(list(batch))))
            time.sleep(2)
        moved = collections.Counter(p.leader for p in admin.list_topics("rb.spans", timeout=30).topics["rb.spans"].partitions.values())
        assert node not in moved, f"broker {node} still leads rb.spans partitions after its kill: {dict(moved)}"
        caught_up = next((t for t, _, stored in series if stored >= published_at_kill), None)
        # The longest time nothing new was stored while rollouts were waiting: failover and rebalance.
        stall, since = 0.0, 0.0
        for (t_prev, _, s_prev), (t, pub, stored) in zip(series, series[1:]):
            since = since + (t - t_prev) if stored == s_prev and stored < pub else 0.0
            stall = max(stall, since)
        assert caught_up is not None and series[-1][2] > published_at_kill, (
            f"with {broker} and {worker} down, the rest did not carry on (seconds, rollouts published, stored): {series}")
        dep.stack.start(broker)
        dep.stack.start(worker)
        time.sleep(6)  # tasks keep arriving while the two rejoin
    finally:
        stop.set()
        feeder.join(60)
    assert not errors, f"publishing tasks failed: {errors[0]!r}"
    dep.wait_tasks(list(batch), 300)
    TIMINGS["faults_batch_s"] = round(time.monotonic() - t0, 1)
    counts = dep.check_exactly_once()
    TIMINGS["phase2"] = {**counts, "killed_broker_led_partitions": led, "tasks": len(batch),
                         "rollouts_published_at_kill": published_at_kill, "rollouts_stored_at_kill": stored_at_kill,
                         "caught_up_after_kill_s": caught_up, "longest_stall_s": round(stall, 1), "outage_series": series}
    say(f"phase 2: {counts}; with {broker} and {worker} down the rest caught up on the rollouts published before "
        f"the kill after {caught_up}s (longest stall {stall:.0f}s) and kept pace: {series}")


def test_one_attempt_through_both_gateway_replicas(deployment: Deployment) -> None:
    dep = deployment
    rollout_id, attempt_id, n = f"gw-{uuid.uuid4().hex[:10]}", "attempt-1", 6
    for i in range(n):
        now = time.time_ns()
        body = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "deploy-test"}}]},
                                   "scopeSpans": [{"scope": {"name": "deploy-test"}, "spans": [{
                                       "traceId": uuid.uuid4().hex, "spanId": uuid.uuid4().hex[:16], "name": f"step-{i}",
                                       "kind": 1, "startTimeUnixNano": str(now), "endTimeUnixNano": str(now + 1000),
                                       "attributes": [{"key": "rolloutbus.rollout_id", "value": {"stringValue": rollout_id}},
                                                      {"key": "rolloutbus.attempt_id", "value": {"stringValue": attempt_id}}]}]}]}]}
        port = dep.gateway_ports[i % 2]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json",
                                              "authorization": f"Bearer {dep.secrets['GATEWAY_TOKEN']}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
    rows = wait_for(f"{n} spans of {rollout_id} in ClickHouse", lambda: (
        r if len(r := dep.query(f"SELECT name, sequence_id FROM spans FINAL WHERE rollout_id = '{rollout_id}'")) >= n else None), 60)
    assert sorted(name for name, _ in rows) == [f"step-{i}" for i in range(n)]
    seqs = sorted(seq for _, seq in rows)
    assert len(set(seqs)) == n, f"one attempt's spans through two gateway replicas share sequence ids: {sorted(rows, key=lambda r: r[0])}"


def test_down_then_up_continues_from_the_volumes(deployment: Deployment) -> None:
    dep = deployment
    before_rows = dep.query("SELECT count() FROM rollouts FINAL")[0][0]
    before_version = dep.max_version()
    before_tasks = list(dep.published)
    dep.dump_logs(host.cache_dir() / "logs" / "deploy-test" / "before-down")  # what `down` removes
    t0 = time.monotonic()
    took = dep.stack.down()
    TIMINGS["down_s"] = round(time.monotonic() - t0, 1)
    TIMINGS["stop_s"] = took
    t0 = time.monotonic()
    dep.stack.up(timeout=600)
    TIMINGS["up_again_s"] = round(time.monotonic() - t0, 1)
    assert dep.query("SELECT count() FROM rollouts FINAL")[0][0] == before_rows, "the store lost rows across down/up"
    t0 = time.monotonic()
    batch = dep.publish_tasks(8)  # 2 more optimiser steps
    dep.wait_tasks(batch, 300)
    wait_for(f"a policy version after {before_version} (the trainer resumes from its checkpoint volume)",
             lambda: dep.max_version() > before_version, 180)
    TIMINGS["after_restart_batch_s"] = round(time.monotonic() - t0, 1)
    versions = dep.query("SELECT version FROM resource_versions FINAL WHERE name = 'policy' ORDER BY version")
    assert [v for (v,) in versions] == list(range(len(versions))), f"versions restarted or skipped: {versions}"
    per_task = dict(dep.query("SELECT task_id, uniqExact(rollout_id) FROM rollouts FINAL GROUP BY 1"))
    assert all(per_task[t] == GROUP_SIZE for t in before_tasks), "tasks consumed before down ran again after up"
    counts = dep.check_exactly_once()
    TIMINGS["phase4"] = {**counts, "versions": dep.max_version()}
    say(f"phase 4: {counts}, policy version {before_version} -> {dep.max_version()}")
