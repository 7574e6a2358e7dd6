"""A real Apache Kafka 4.x broker on 127.0.0.1: single node, KRaft mode, started and stopped by pid.

The broker's jars come from Maven Central through ``deploy/kafka/pom.xml`` into a cache outside the
repository (``~/.cache/rolloutbus/kafka-<version>`` unless ``ROLLOUTBUS_KAFKA_CACHE`` says otherwise).
Storage is formatted once; the data dir holds ``server.properties``, the log dirs, ``broker.pid`` and
``broker.log``. ``start`` reuses a broker that is already running.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from rolloutbus.errors import BrokerSetupError

DEPLOY_DIR = Path(os.environ.get("ROLLOUTBUS_DEPLOY_DIR") or Path(__file__).resolve().parents[1] / "deploy")


def kafka_version() -> str:
    pom = (DEPLOY_DIR / "kafka" / "pom.xml").read_text()
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    if not match:
        raise BrokerSetupError(f"{DEPLOY_DIR / 'kafka' / 'pom.xml'} names no <kafka.version>")
    return match.group(1)


def cache_dir() -> Path:
    base = os.environ.get("ROLLOUTBUS_KAFKA_CACHE") or Path.home() / ".cache" / "rolloutbus"
    return Path(base) / f"kafka-{kafka_version()}"


def _need(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise BrokerSetupError(f"{tool} not found on PATH: {hint}")
    return path


def fetch_jars(quiet: bool = True) -> Path:
    """Fetch the broker's jars into the cache (once). Returns the jar directory."""
    target = cache_dir() / "libs"
    marker = cache_dir() / ".complete"
    if marker.exists():
        return target
    mvn = _need("mvn", "install Maven (apt-get install -y maven) or set ROLLOUTBUS_KAFKA_BOOTSTRAP to an existing cluster")
    _need("java", "install Java 17+ (apt-get install -y openjdk-17-jre-headless)")
    tmp = cache_dir() / f"libs.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        mvn, "-B", "-f", str(DEPLOY_DIR / "kafka" / "pom.xml"),
        "dependency:copy-dependencies", f"-DoutputDirectory={tmp}", "-DincludeScope=runtime",
    ]
    if quiet:
        cmd.insert(1, "-q")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise BrokerSetupError(
            "could not fetch Kafka's jars from Maven Central (is the registry reachable?): "
            + " | ".join(tail)
        )
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    marker.write_text(kafka_version())
    return target


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie counts as dead.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return True


@dataclass
class LocalKafka:
    """The local broker under ``data_dir/kafka``."""

    data_dir: Path
    port: int = 19092
    heap: str = "768m"

    @property
    def home(self) -> Path:
        return self.data_dir / "kafka"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def _properties(self) -> Path:
        props = self.home / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.port + 1}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.port + 1}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    f"log.dirs={self.home / 'logs'}",
                    "num.partitions=4",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=8",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=true",
                    "log.retention.hours=-1",
                    "log.segment.bytes=268435456",
                    "message.max.bytes=16777216",
                    "",
                ]
            )
        )
        return props

    def _java(self, jars: Path, *args: str, heap: str | None = None) -> list[str]:
        java = _need("java", "install Java 17+ (apt-get install -y openjdk-17-jre-headless)")
        cmd = [java]
        if heap:
            cmd += [f"-Xmx{heap}", f"-Xms{heap}"]
        cmd += [
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={DEPLOY_DIR / 'kafka' / 'log4j2.properties'}",
            "-cp", f"{jars}/*",
            *args,
        ]
        return cmd

    def start(self, timeout: float = 90.0) -> bool:
        """Start the broker unless one is running. Returns True when this call started it."""
        if self.pid() is not None:
            self.wait_ready(timeout)
            return False
        jars = fetch_jars()
        self.home.mkdir(parents=True, exist_ok=True)
        props = self._properties()
        if not (self.home / "logs" / "meta.properties").exists():
            cluster_id = uuid.uuid4().hex[:22]
            fmt = subprocess.run(
                self._java(jars, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props), "--ignore-formatted"),
                capture_output=True, text=True,
            )
            if fmt.returncode != 0:
                raise BrokerSetupError(f"formatting Kafka storage failed: {fmt.stderr.strip() or fmt.stdout.strip()}")
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                self._java(jars, "kafka.Kafka", str(props), heap=self.heap),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives the `rolloutbus up` that started it
            )
        self.pid_file.write_text(str(proc.pid))
        try:
            self.wait_ready(timeout, proc=proc)
        except BrokerSetupError:
            self.stop()
            raise
        return True

    def wait_ready(self, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise BrokerSetupError(f"the broker exited with {proc.returncode}; see {self.log_file}")
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers:
                    return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.3)
        raise BrokerSetupError(f"the broker did not answer on {self.bootstrap} within {timeout:.0f}s; see {self.log_file}")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker this data dir's pid file names. Returns True when one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> None:
        """SIGKILL the broker (fault tests)."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)
