"""The Kubernetes KafkaUsers, for real: a broker that authenticates with SASL/SCRAM-SHA-512 and enforces
ACLs with Kafka's standard authorizer, the users and ACLs of deploy/k8s/base/kafka-user.yaml applied to
it through the Admin API, and every process kind run as the `rolloutbus` command with the user its
manifest gives it.

One round of the loop runs on those users alone — tasks published, a runner taking them in its group and
calling the policy through the LLM proxy, the gateway taking OTLP spans, the stream worker assembling
rollouts and grouping them (its consumer groups, the changelogs and the leader topic faust creates), the
trainer consuming the group and publishing a new version, the policy server loading it — and the
broker's authorizer log shows not one refusal for them. A process run with another kind's user is
refused in one line that names the user, the operation and the resource.

The broker is this module's own (SASL on its client listener), on a free port pair, not the session's.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
K8S_BASE = ROOT / "deploy" / "k8s" / "base"
PREFIX = "rb."  # the prefix the ACLs are written for (config.yaml)


def _free_port(pair: bool = False) -> int:
    taken = {int(os.environ.get("ROLLOUTBUS_TEST_KAFKA_PORT", "0")) + d for d in (0, 1, 500, 501)}
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port in taken or port > 64000:
            continue
        if not pair:
            return port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        if port + 1 not in taken:
            return port
    raise RuntimeError("no free port")


def manifest_user(command: str) -> str:
    """The Kafka user deploy/k8s/base gives the workload that runs ``rolloutbus <command>``."""
    for path in sorted(K8S_BASE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") not in ("Deployment", "StatefulSet"):
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if (c.get("args") or [None])[0] == command:
                    env = {e["name"]: e.get("value") for e in c.get("env", [])}
                    return str(env["ROLLOUTBUS_KAFKA_SASL_USERNAME"])
    raise LookupError(f"no workload in {K8S_BASE} runs `rolloutbus {command}`")


@dataclass
class SecuredKafka:
    broker: Any
    passwords: dict[str, str]
    home: Path

    def env(self, user: str, **extra: str) -> dict[str, str]:
        """What a process of ``user`` gets in its pod: the cluster, SASL/SCRAM, its own password."""
        outer = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTBUS_")}  # this cluster only
        return {
            **outer, "PYTHONUNBUFFERED": "1",
            "ROLLOUTBUS_KAFKA_BOOTSTRAP": self.broker.bootstrap, "ROLLOUTBUS_TOPIC_PREFIX": PREFIX,
            "ROLLOUTBUS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "ROLLOUTBUS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "ROLLOUTBUS_KAFKA_SASL_USERNAME": user, "ROLLOUTBUS_KAFKA_SASL_PASSWORD": self.passwords[user],
            "ROLLOUTBUS_DATA_DIR": str(self.home / user), "ROLLOUTBUS_CLICKHOUSE_DSN": "chdb://",
            # off unless a test gives a port: the defaults (9100/9101) may be taken on this host
            "ROLLOUTBUS_STREAMS_METRICS_PORT": "0", "ROLLOUTBUS_TRAIN_METRICS_PORT": "0",
            **extra,
        }

    def denials(self, since: int = 0) -> list[str]:
        """The authorizer's refusals of the project's users logged after byte ``since`` of the broker log."""
        with open(self.broker.log_file, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return [line for line in text.splitlines() if " is Denied " in line and "User:rolloutbus-" in line]

    def log_size(self) -> int:
        return self.broker.log_file.stat().st_size


@pytest.fixture(scope="module")
def secured() -> Iterator[SecuredKafka]:
    from foundation.config import Topics
    from foundation.kafka_admin import apply_kafka_users, ensure_topics, topic_specs
    from rolloutbus.local_kafka import LocalKafka, Scram

    home = Path(tempfile.mkdtemp(prefix="rolloutbus-acl-"))
    broker = LocalKafka(home / "broker", _free_port(pair=True), heap="512m", scram=Scram("admin", secrets.token_hex(12)))
    broker.start()
    try:
        # What Strimzi's operators do from topics.yaml and kafka-user.yaml, through the Admin API as the admin.
        ensure_topics(broker.admin_conf(), topic_specs(Topics(PREFIX), span_partitions=2))
        users = [d for d in yaml.safe_load_all((K8S_BASE / "kafka-user.yaml").read_text()) if d]
        passwords = {u["metadata"]["name"]: secrets.token_hex(12) for u in users}
        apply_kafka_users(broker.admin_conf(), users, passwords)
        yield SecuredKafka(broker, passwords, home)
    finally:
        broker.stop()
        shutil.rmtree(home, ignore_errors=True)


class Procs:
    """`rolloutbus` subprocesses, output to files; all stopped at the end of the test."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", *args], env=env, cwd=ROOT,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.running[name] = proc
        return proc

    def log(self, name: str, tail: int = 2500) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-tail:]

    def logs_of_all(self) -> str:
        return "\n".join(f"--- {n} (exit {p.poll()}):\n{self.log(n, 1500)}" for n, p in self.running.items())

    def wait(self, name: str, timeout: float) -> int:
        try:
            return self.running[name].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {timeout:.0f}s\n{self.logs_of_all()}") from None

    def stop(self) -> None:
        for p in self.running.values():
            if p.poll() is None:
                p.terminate()
        for p in self.running.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


def _until(what: str, check: Any, timeout: float, procs: Procs) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (OSError, urllib.error.URLError):
            value = None
        if value:
            return value
        dead = {n: p.returncode for n, p in procs.running.items() if p.poll() not in (None, 0)}
        if dead:
            raise AssertionError(f"waiting for {what}: {dead} exited\n{procs.logs_of_all()}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout:.0f}s\n{procs.logs_of_all()}")


def test_every_process_kind_works_with_its_own_user(secured: SecuredKafka, tmp_path: Path) -> None:
    since = secured.log_size()
    procs = Procs(tmp_path)
    serve_port, proxy_port, gateway_port, worker_port = (_free_port() for _ in range(4))
    try:
        procs.start("process", secured.env(manifest_user("process"), ROLLOUTBUS_STREAMS_METRICS_PORT=str(worker_port)),
                    "process", "--group-size", "2", "--group-timeout", "20", "--sink-interval", "0.5")
        procs.start("train", secured.env(manifest_user("train")), "train", "--model", "tiny", "--groups-per-step", "1",
                    "--max-steps", "1", "--threads", "1", "--device", "cpu", "--checkpoint-dir", str(tmp_path / "checkpoints"))
        procs.start("serve", secured.env(manifest_user("serve")), "serve", "--port", str(serve_port), "--threads", "1")
        procs.start("proxy", secured.env(manifest_user("proxy")), "proxy", "--port", str(proxy_port),
                    "--upstream", f"http://127.0.0.1:{serve_port}/v1")
        procs.start("gateway", secured.env(manifest_user("gateway")), "gateway", "--port", str(gateway_port))

        # The trainer publishes its initial weights (version 0); the policy server loads them.
        _until("policy version 0 served", lambda: _get(f"http://127.0.0.1:{serve_port}/healthz")[0] == 200, 180, procs)

        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text(json.dumps({"task_id": "t1", "input": {"numbers": [5, 3], "words": ["gain"]}, "group_size": 2}) + "\n")
        published = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "tasks", "publish", str(tasks)],
                                   env=secured.env("rolloutbus-tasks"), cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert published.returncode == 0 and "published 1 tasks" in published.stdout, published.stderr

        runner_env = secured.env(manifest_user("run-agent"), ROLLOUTBUS_LLM_PROXY_URL=f"http://127.0.0.1:{proxy_port}")
        procs.start("runner", runner_env, "run-agent", "rolloutbus.demo.agent:CalcAgent", "--max-tasks", "1")

        # A span from an agent in another language, through the gateway.
        attrs = [{"key": "agentlightning.rollout_id", "value": {"stringValue": "ro-gateway"}},
                 {"key": "agentlightning.attempt_id", "value": {"stringValue": "at-1"}}]
        body = {"resourceSpans": [{"resource": {"attributes": attrs}, "scopeSpans": [{"spans": [{
            "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "tool-run",
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000500000000"}]}]}]}
        _until("the gateway", lambda: _get(f"http://127.0.0.1:{gateway_port}/healthz")[0] == 200, 60, procs)
        req = urllib.request.Request(f"http://127.0.0.1:{gateway_port}/v1/traces", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        _until("the gateway's span delivered", lambda: _get(f"http://127.0.0.1:{gateway_port}/healthz")[1].get("delivered") == 1, 30, procs)

        assert procs.wait("runner", 120) == 0, procs.log("runner")
        assert "RunnerStats(tasks=1, attempts=2, succeeded=2" in procs.log("runner"), procs.log("runner")
        proxied = _get(f"http://127.0.0.1:{proxy_port}/healthz")[1]
        assert proxied["delivered"] >= 2 and proxied["delivery_failed"] == 0, proxied  # the LLM spans of both attempts

        # The stream worker groups the two rollouts onto rb.batches; the trainer takes the group, steps, and
        # publishes version 1, which the policy server loads.
        assert procs.wait("train", 180) == 0, procs.logs_of_all()
        assert "trained 1 steps; policy is at version 1" in procs.log("train"), procs.log("train")
        _until("policy version 1 served",
               lambda: _get(f"http://127.0.0.1:{serve_port}/healthz")[1].get("resource_version") == 1, 60, procs)
        _until("the stream worker ready", lambda: _get(f"http://127.0.0.1:{worker_port}/readyz")[0] == 200, 60, procs)
    finally:
        procs.stop()
    assert "groups': 1" in procs.log("process", 20000), procs.log("process")
    denied = secured.denials(since)
    assert not denied, "the authorizer refused the processes' own users:\n" + "\n".join(denied[:10])


def _refused(secured: SecuredKafka, user: str, *args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "rolloutbus.cli", *args], env=secured.env(user), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


def test_a_process_with_another_kinds_user_is_refused_in_one_line(secured: SecuredKafka) -> None:
    rc, err = _refused(secured, "rolloutbus-gateway", "process")
    assert rc == 1 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"rolloutbus process: Kafka user 'rolloutbus-gateway' is not authorized to describe topic {re.escape(PREFIX)}\w+ "
        rf"on {re.escape(secured.broker.bootstrap)}: grant it that ACL \(each process kind's ACLs: deploy/k8s/base/kafka-user.yaml\)", last), last
    assert any(f"User:rolloutbus-gateway is Denied operation = DESCRIBE" in line for line in secured.denials())


def test_publishing_tasks_without_write_on_rb_tasks_is_refused(secured: SecuredKafka, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "t-refused", "input": "x"}) + "\n")
    rc, err = _refused(secured, "rolloutbus-runner", "tasks", "publish", str(tasks))
    assert rc == 1 and "Traceback" not in err and "published" not in err, err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"rolloutbus tasks: Kafka user 'rolloutbus-runner' is not authorized to write topic "
                        rf"{re.escape(PREFIX)}tasks on .*", last), last


def _user_without(secured: SecuredKafka, base: str, topic: str, operation: str) -> str:
    """A user with ``base``'s ACLs less ``operation`` on ``topic``: the refusal arrives mid-run, not at start."""
    from foundation.kafka_admin import apply_kafka_users

    doc = next(d for d in yaml.safe_load_all((K8S_BASE / "kafka-user.yaml").read_text()) if d and d["metadata"]["name"] == base)
    name = f"{base}-no-{operation.lower()}"
    doc["metadata"]["name"] = name
    for acl in doc["spec"]["authorization"]["acls"]:
        if acl["resource"].get("type") == "topic" and acl["resource"].get("name") == topic:
            acl["operations"] = [op for op in acl["operations"] if op != operation]
    doc["spec"]["authorization"]["acls"] = [a for a in doc["spec"]["authorization"]["acls"] if a["operations"]]
    if name not in secured.passwords:
        secured.passwords[name] = secrets.token_hex(12)
        apply_kafka_users(secured.broker.admin_conf(), [doc], {name: secured.passwords[name]})
    return name


def _one_refusal_line(rc: int, err: str, command: str, user: str, action: str) -> None:
    assert rc == 1 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"rolloutbus {command}: Kafka user '{re.escape(user)}' is not authorized to {action} on .*: "
                        r"grant it that ACL \(each process kind's ACLs: deploy/k8s/base/kafka-user.yaml\)", last), err


def test_a_trainer_refused_its_version_publish_ends_in_one_line(secured: SecuredKafka, tmp_path: Path) -> None:
    user = _user_without(secured, "rolloutbus-trainer", f"{PREFIX}resources", "Write")
    rc, err = _refused(secured, user, "train", "--model", "tiny", "--max-steps", "1", "--threads", "1", "--device", "cpu",
                       "--checkpoint-dir", str(tmp_path / "checkpoints"))
    _one_refusal_line(rc, err, "train", user, rf"(write topic {re.escape(PREFIX)}resources|publish \(idempotent producer\))")



def test_a_policy_server_refused_rb_resources_ends_in_one_line(secured: SecuredKafka) -> None:
    user = _user_without(secured, "rolloutbus-policy", f"{PREFIX}resources", "Read")
    rc, err = _refused(secured, user, "serve", "--port", str(_free_port()), "--threads", "1")
    _one_refusal_line(rc, err, "serve", user, rf"(describe|read) topic {re.escape(PREFIX)}resources")


def test_a_runner_refused_its_read_of_rb_tasks_ends_in_one_line(secured: SecuredKafka) -> None:
    user = _user_without(secured, "rolloutbus-runner", f"{PREFIX}tasks", "Read")
    rc, err = _refused(secured, user, "run-agent", "rolloutbus.demo.agent:CalcAgent", "--max-tasks", "1")
    _one_refusal_line(rc, err, "run-agent", user, rf"read topic {re.escape(PREFIX)}tasks in group \S+")


def test_a_span_transport_refused_its_write_raises_at_the_next_flush(secured: SecuredKafka, tmp_path: Path) -> None:
    from foundation.errors import KafkaNotAuthorized
    from producers.transport import SpanTransport

    user = _user_without(secured, "rolloutbus-gateway", f"{PREFIX}spans", "Write")
    env = secured.env(user)
    conf = {"bootstrap.servers": env["ROLLOUTBUS_KAFKA_BOOTSTRAP"], "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": secured.passwords[user]}
    transport = SpanTransport(conf, f"{PREFIX}spans", tmp_path / "spool")
    try:
        transport.emit_encoded(b"ro-1", b"not-a-span-but-bytes")
        with pytest.raises(KafkaNotAuthorized, match=rf"Kafka user '{re.escape(user)}' is not authorized to write topic "
                                                    rf"{re.escape(PREFIX)}spans"):
            transport.flush(30)
        assert not transport.accepting()
        with pytest.raises(KafkaNotAuthorized):
            transport.emit_encoded(b"ro-1", b"more")
    finally:
        assert transport.close(1) == 1  # kept in the spool for a process with the right ACL
