"""Settings shared by every process kind, read from ``ROLLOUTBUS_*`` environment variables.

Each process kind (stream worker, trainer, gateway, proxy, runner) has its own settings class that
derives from :class:`CommonSettings`; it is read once, at the entry point, and library code takes
plain typed arguments. Explicit argument beats environment variable beats documented default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "ROLLOUTBUS_"


def default_data_dir() -> Path:
    """Where local state lives: the broker's log dirs, the embedded ClickHouse store, checkpoints."""
    return Path(os.environ.get("ROLLOUTBUS_DATA_DIR") or Path.home() / ".rolloutbus")


@dataclass(frozen=True)
class Topics:
    """Topic names under one prefix (default ``rb.``)."""

    prefix: str = "rb."

    @property
    def spans(self) -> str:
        return f"{self.prefix}spans"

    @property
    def tasks(self) -> str:
        return f"{self.prefix}tasks"

    @property
    def batches(self) -> str:
        return f"{self.prefix}batches"

    @property
    def resources(self) -> str:
        return f"{self.prefix}resources"

    @property
    def metrics(self) -> str:
        """Trainer step metrics; the sink stores them so ClickHouse keeps one writer."""
        return f"{self.prefix}metrics"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}dlq"

    def all(self) -> list[str]:
        return [self.spans, self.tasks, self.batches, self.resources, self.metrics, self.dlq]


@dataclass(frozen=True)
class KafkaSecurity:
    """How clients authenticate to Kafka. Secrets stay in SecretStr until handed to librdkafka."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None

    def librdkafka(self) -> dict[str, Any]:
        """The librdkafka configuration keys for this security setup."""
        conf: dict[str, Any] = {"security.protocol": self.protocol}
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        return conf

    def faust(self) -> Any:
        """The same setup as faust ``broker_credentials`` (None for PLAINTEXT); the password is handed
        over only here, and faust's credential objects do not print it."""
        import ssl

        import faust

        protocol = self.protocol.upper()
        if protocol == "PLAINTEXT":
            return None
        ctx = None
        if protocol in ("SSL", "SASL_SSL"):
            ctx = ssl.create_default_context(cafile=self.ssl_ca_location)
        if protocol == "SSL":
            return faust.SSLCredentials(ctx)
        if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            return faust.SASLCredentials(
                username=self.sasl_username,
                password=self.sasl_password.get_secret_value() if self.sasl_password is not None else None,
                ssl_context=ctx,
                mechanism=self.sasl_mechanism or "PLAIN",
            )
        raise ValueError(f"unsupported Kafka security protocol {self.protocol!r}: use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")


class CommonSettings(BaseSettings):
    """Settings every process kind reads. Environment variables: ``ROLLOUTBUS_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir, description="Local state directory.")
    kafka_bootstrap: str | None = Field(
        default=None,
        description="Kafka bootstrap servers. Unset: the local broker that `rolloutbus up` starts.",
    )
    kafka_port: int = Field(default=19092, description="Port of the local broker `rolloutbus up` starts.")
    topic_prefix: str = Field(default="rb.", description="Prefix of every topic name.")
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = None
    schema_registry_url: str | None = Field(
        default=None, description="Confluent schema registry; set → Confluent wire format instead of single-object."
    )
    clickhouse_dsn: str | None = Field(
        default=None, description="ClickHouse DSN. Default chdb://<data_dir>/clickhouse (embedded engine)."
    )
    clickhouse_database: str = "rolloutbus"
    clickhouse_cluster: str | None = Field(
        default=None,
        description="ClickHouse cluster name: set → the replicated/distributed DDL of deploy/clickhouse/cluster/.",
    )
    clickhouse_password: SecretStr | None = Field(
        default=None, description="ClickHouse password, kept out of the DSN so it never shows in logs."
    )

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)

    @property
    def bootstrap(self) -> str:
        return self.kafka_bootstrap or f"127.0.0.1:{self.kafka_port}"

    @property
    def uses_local_broker(self) -> bool:
        return self.kafka_bootstrap is None

    @property
    def kafka_security(self) -> KafkaSecurity:
        return KafkaSecurity(
            protocol=self.kafka_security_protocol,
            sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username,
            sasl_password=self.kafka_sasl_password,
            ssl_ca_location=self.kafka_ssl_ca_location,
        )

    def kafka_conf(self) -> dict[str, Any]:
        """librdkafka base configuration: bootstrap plus security."""
        return {"bootstrap.servers": self.bootstrap, **self.kafka_security.librdkafka()}

    @property
    def dsn(self) -> str:
        return self.clickhouse_dsn or f"chdb://{self.data_dir.resolve()}/clickhouse"
