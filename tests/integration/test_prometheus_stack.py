"""A real Prometheus (Debian's 2.42) scrapes the local stack — stream worker, trainer, gateway and the
consumer-lag exporter, each a real process on the real broker — with deploy/prometheus's rules and
dashboard; then one fault: the stream worker stops while spans keep arriving, and the lag alert fires.

The rules are loaded as written except their time windows and `for:` durations, scaled from minutes to
seconds (10m → 20 s) so the fault shows within a minute; promtool's unit tests
(tests/unit/deploy/test_prometheus_rules.py) check the rules at their real durations."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.streams.helpers import ROOT, WorkerProc, encoded, produce, rollout, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

PROM = ROOT / "deploy" / "prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scaled_rules(text: str) -> str:
    """The rules with every window and `for:` in minutes turned into twice as many seconds."""
    text = re.sub(r"\[(\d+)m\]", lambda m: f"[{int(m.group(1)) * 2}s]", text)
    return re.sub(r"(for:\s*)(\d+)m\b", lambda m: f"{m.group(1)}{int(m.group(2)) * 2}s", text)


def test_scaled_rules_keep_their_shape() -> None:
    assert scaled_rules("delta(x[10m]) > 0\n        for: 10m\n rate(y[5m])") == "delta(x[20s]) > 0\n        for: 20s\n rate(y[10s])"


def wait_for(what: str, check: Callable[[], Any], timeout: float, procs: list[WorkerProc]) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args} exited: {p.output()[-3000:]}"
        try:
            last = check()
            if last:
                return last
        except requests.RequestException as exc:
            last = exc
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f}s (last: {str(last)[:2000]})")


class Prometheus:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert r["status"] == "success", (expr, r)
        return list(r["data"]["result"])

    def targets(self) -> dict[str, str]:
        active = requests.get(f"{self.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        return {t["labels"]["job"]: t["health"] for t in active}

    def firing(self, name: str) -> list[dict[str, str]]:
        alerts = requests.get(f"{self.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return [a["labels"] for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_prometheus_scrapes_the_stack_and_a_stopped_worker_fires_the_lag_alert(
        tmp_path: Path, test_env: dict[str, str], kafka_conf: dict[str, Any], topics: Any) -> None:
    ports = {job: free_port() for job in ("streams", "trainer", "gateway", "kafka", "prometheus")}
    env = {**test_env, "ROLLOUTBUS_STREAMS_METRICS_PORT": str(ports["streams"])}
    procs: list[WorkerProc] = []

    def start(args: list[str], env_: dict[str, str] = env) -> WorkerProc:
        proc = WorkerProc(args, env_)
        procs.append(proc)
        return proc

    worker = start_worker(env, "--metrics-port", str(ports["streams"]))
    procs.append(worker)
    start([sys.executable, "-m", "rolloutbus.cli", "gateway", "--port", str(ports["gateway"])])
    start([sys.executable, "-m", "rolloutbus.cli", "train", "--metrics-port", str(ports["trainer"]), "--threads", "1"],
          {**env, "ROLLOUTBUS_DATA_DIR": str(tmp_path / "trainer")})
    start([sys.executable, str(PROM / "kafka_lag_exporter.py"), "--port", str(ports["kafka"]), "--interval", "1"])

    config = tmp_path / "prometheus.yml"
    (tmp_path / "rolloutbus-rules.yml").write_text(scaled_rules((PROM / "rolloutbus-rules.yml").read_text()))
    jobs = {"rolloutbus-streams": "streams", "rolloutbus-trainer": "trainer", "rolloutbus-gateway": "gateway", "rolloutbus-kafka": "kafka"}
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rolloutbus-rules.yml"],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{ports[p]}"]}]} for job, p in jobs.items()],
    }))
    subprocess.run(["bash", str(PROM / "install-tools.sh")], check=True, capture_output=True, timeout=600)
    start(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
           f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--log.level=warn"], dict(os.environ))
    prom = Prometheus(ports["prometheus"])

    # 1. Healthy: every process answers its scrape; spans flow through the worker and its lag closes.
    def all_up() -> dict[str, str] | None:
        t = prom.targets()
        return t if set(t) == set(jobs) and set(t.values()) == {"up"} else None

    def spans_read() -> bool:
        r = prom.query("sum(rolloutbus_streams_spans_total)")
        return bool(r) and float(r[0]["value"][1]) >= 24 * 4  # two LLM and two tool spans each

    def lag_closed() -> list[dict[str, Any]] | None:
        r = prom.query(f'rolloutbus:kafka_consumergroup_lag:sum{{topic="{topics.spans}"}}')
        return r if r and all(float(x["value"][1]) == 0 for x in r) else None

    print("targets", wait_for("every target up", all_up, 240, procs))
    items = []
    for i in range(24):
        spans, ev = rollout(f"ro-prom-{uuid.uuid4().hex[:8]}-{i}", f"task-{i % 3}", reward=1.0)
        items += encoded(spans, ev)
    produce(kafka_conf, topics.spans, items)
    requests.post(f"http://127.0.0.1:{ports['gateway']}/v1/traces", data=b"not protobuf", timeout=10,
                  headers={"Content-Type": "application/x-protobuf"})
    wait_for("the worker read every span", spans_read, 120, procs)
    lag = wait_for("the broker's lag of the worker's group is 0", lag_closed, 120, procs)
    group = lag[0]["metric"]["consumergroup"]
    assert prom.query('rolloutbus_gateway_requests_total{code="400"}'), "the gateway's requests are scraped"
    assert prom.query("rolloutbus_trainer_policy_version"), "the trainer's metrics are scraped"
    # Reported at the worker's next health tick and seen at Prometheus's next scrape: waited for, not assumed.
    wait_for("the worker reports progress", lambda: prom.query("rolloutbus_streams_last_progress_timestamp_seconds > 0"), 60, procs)
    assert not prom.firing("RolloutbusConsumerLagGrowing")
    # Every panel of the dashboard is a query Prometheus accepts.
    dash = json.loads((PROM / "grafana" / "rolloutbus-dashboard.json").read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            prom.query(target["expr"].replace("$__rate_interval", "1m"))

    # 2. The fault: the worker stops, spans keep arriving.
    stop_worker(worker)
    stop = threading.Event()

    def keep_producing() -> None:
        n = 0
        while not stop.is_set():
            spans, ev = rollout(f"ro-fault-{n}", "task-fault", reward=0.0)
            produce(kafka_conf, topics.spans, encoded(spans, ev))
            n += 1
            stop.wait(0.5)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    try:
        started = time.monotonic()
        firing = wait_for("RolloutbusConsumerLagGrowing fires", lambda: prom.firing("RolloutbusConsumerLagGrowing"), 180,
                          [p for p in procs if p is not worker])
        print(f"lag alert firing {time.monotonic() - started:.0f}s after the worker stopped: {firing}")
        assert {"consumergroup": group, "topic": topics.spans} in [{k: a[k] for k in ("consumergroup", "topic")} for a in firing]
        down = wait_for("RolloutbusTargetDown fires for the worker", lambda: prom.firing("RolloutbusTargetDown"), 60,
                        [p for p in procs if p is not worker])
        assert {a["job"] for a in down} == {"rolloutbus-streams"}, down
    finally:
        stop.set()
        producer.join(10)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
