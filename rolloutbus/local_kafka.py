"""A real Apache Kafka 4.x broker on 127.0.0.1: single node, KRaft mode, started and stopped by pid.

The broker's jars come from Maven Central through ``deploy/kafka/pom.xml`` into a cache outside the
repository (``~/.cache/rolloutbus/kafka-<version>`` unless ``ROLLOUTBUS_KAFKA_CACHE`` says otherwise).
Storage is formatted once; the data dir holds ``server.properties``, the log dirs, ``broker.pid`` and
``broker.log``. ``start`` reuses a broker that is already running.

With ``scram=Scram(admin, password)`` the broker is what a secured production cluster looks like to its
clients: its client listener speaks SASL/SCRAM-SHA-512 and the standard KRaft authorizer refuses what
no ACL allows; only the admin is a super user (it creates topics, ACLs and the other SCRAM users through
the Admin API). The controller listener stays PLAINTEXT on loopback (its principal, ANONYMOUS, is a super
user so the broker can register with its own controller): a local test broker, not a production setup.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from foundation.errors import BrokerSetupError, ServiceError
from foundation.paths import DEPLOY_DIR
from rolloutbus.localproc import LocalProcess


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


SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Scram:
    """SASL/SCRAM-SHA-512 with the standard authorizer; ``admin`` is the one super user."""

    admin: str
    password: str = field(repr=False)

    def client_conf(self, username: str, password: str) -> dict[str, Any]:
        """librdkafka settings that authenticate as ``username`` on this broker."""
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SCRAM_MECHANISM,
                "sasl.username": username, "sasl.password": password}


@dataclass
class LocalKafka(LocalProcess):
    """The local broker under ``data_dir/kafka``; with ``scram``, SASL/SCRAM and ACLs enforced."""

    data_dir: Path
    port: int = 19092
    heap: str = "768m"
    scram: Scram | None = None
    _admin: Any = field(default=None, init=False, repr=False, compare=False)
    _jars: Path = field(default=Path(), init=False, repr=False, compare=False)

    subdir: ClassVar[str] = "kafka"
    pid_name: ClassVar[str] = "broker.pid"
    log_name: ClassVar[str] = "broker.log"
    what: ClassVar[str] = "the broker"
    error: ClassVar[type[ServiceError]] = BrokerSetupError

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return self.bootstrap

    def admin_conf(self) -> dict[str, Any]:
        """librdkafka settings of a client with every right: bootstrap, plus the admin's SASL login."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        if self.scram is not None:
            conf.update(self.scram.client_conf(self.scram.admin, self.scram.password))
        return conf

    def _listener_lines(self) -> list[str]:
        if self.scram is None:
            return [
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.port + 1}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            ]
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required '
                f'username="{self.scram.admin}" password="{self.scram.password}";')
        return [
            f"listeners=SASL_PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.port + 1}",
            f"advertised.listeners=SASL_PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=SASL_PLAINTEXT",
            f"sasl.enabled.mechanisms={SCRAM_MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={SCRAM_MECHANISM}",
            f"listener.name.sasl_plaintext.{SCRAM_MECHANISM.lower()}.sasl.jaas.config={jaas}",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            # ANONYMOUS: the broker's own requests to its controller, over the loopback controller listener.
            f"super.users=User:{self.scram.admin};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found=false",
        ]

    def _properties(self) -> Path:
        props = self.home / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.port + 1}",
                    *self._listener_lines(),
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

    def prepare(self) -> None:
        """Fetch the jars (once) and format the storage (once)."""
        self._jars = fetch_jars()
        props = self._properties()
        if not (self.home / "logs" / "meta.properties").exists():
            cluster_id = uuid.uuid4().hex[:22]
            # The admin's SCRAM credentials go into the metadata log at format time: the only way in.
            scram = [] if self.scram is None else [
                "--add-scram", f"{SCRAM_MECHANISM}=[name={self.scram.admin},password={self.scram.password}]"]
            fmt = subprocess.run(
                self._java(self._jars, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
                           "--ignore-formatted", *scram),
                capture_output=True, text=True,
            )
            if fmt.returncode != 0:
                raise BrokerSetupError(f"formatting Kafka storage failed: {fmt.stderr.strip() or fmt.stdout.strip()}")

    def command(self) -> Sequence[str]:
        return self._java(self._jars, "kafka.Kafka", str(self.home / "server.properties"), heap=self.heap)

    def start(self, timeout: float = 90.0, env: dict[str, str] | None = None) -> bool:
        """Start the broker unless one is running. Returns True when this call started it."""
        return super().start(timeout, env)

    def ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({**self.admin_conf(), "log_level": 0})
        try:
            return bool(self._admin.list_topics(timeout=2).brokers)
        except Exception:  # noqa: BLE001 - not ready yet
            return False
