"""Settings shared by every process kind, read from ``ROLLOUTBUS_*`` environment variables.

Each process kind (stream worker, trainer, gateway, proxy, runner) has its own settings class that
derives from :class:`CommonSettings`; it is read once, at the entry point, and library code takes
plain typed arguments. Explicit argument beats environment variable beats documented default.

Each field carries its rule (``Field(ge=..., le=...)``, a ``Literal``, a validator); :func:`load_settings`
turns a broken rule into one :class:`~foundation.errors.SettingError` that names the flag and the
variable, which the CLI prints as one line with exit status 2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin
from urllib.parse import urlparse

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from foundation.errors import ConfigError, SettingError

ENV_PREFIX = "ROLLOUTBUS_"
PORT = {"ge": 1, "le": 65535}  # Field(**PORT): a TCP port a process binds or connects to

_HOST_PORT = re.compile(r"^(?:[A-Za-z_]+://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d+))?$")
_TOPIC_PREFIX = re.compile(r"^[A-Za-z0-9._-]*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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

    @property
    def feedback(self) -> str:
        """Late rewards (Feedback records) keyed by rollout id; the stream worker makes it."""
        return f"{self.prefix}feedback"

    @property
    def agl_dequeue_group(self) -> str:
        """The consumer group of the gateway replicas on rb.tasks (Agent Lightning's queue, /v1/agl):
        each task partition has one owner, which hands its tasks out."""
        return f"{self.prefix}agl-dequeue"

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
    kafka_port: int = Field(default=19092, **PORT, description="Port of the local broker `rolloutbus up` starts.")
    topic_prefix: str = Field(default="rb.", description="Prefix of every topic name.")
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = None
    clickhouse_dsn: str | None = Field(
        default=None,
        description="ClickHouse DSN. Default http://<store_host>:<store_port>, the store `rolloutbus up` starts; "
        "chdb://<path> opens the embedded engine in this process instead.",
    )
    store_host: str = Field(default="127.0.0.1", description="Address the local store (`rolloutbus store`) serves on.")
    store_port: int = Field(default=8123, ge=1, le=65535, description="Port of the local store's ClickHouse HTTP interface.")
    clickhouse_database: str = "rolloutbus"
    clickhouse_cluster: str | None = Field(
        default=None,
        description="ClickHouse cluster name: set → the replicated/distributed form of the migrations.",
    )
    clickhouse_password: SecretStr | None = Field(
        default=None, description="ClickHouse password, kept out of the DSN so it never shows in logs."
    )

    @field_validator("data_dir")
    @classmethod
    def _data_dir_is_dir(cls, v: Path) -> Path:
        if v.exists() and not v.is_dir():
            raise ValueError("must be a directory (it is created when missing), not a file")
        return v

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap_list(cls, v: str | None) -> str | None:
        if v is None:
            return v
        for server in v.split(","):
            m = _HOST_PORT.match(server.strip())
            if not m or (m.group(1) is not None and not 1 <= int(m.group(1)) <= 65535):
                raise ValueError("must be a comma-separated list of host:port (port 1-65535), e.g. kafka-1:9092,kafka-2:9092")
        return v

    @field_validator("topic_prefix")
    @classmethod
    def _topic_chars(cls, v: str) -> str:
        if not _TOPIC_PREFIX.match(v):
            raise ValueError("may hold only letters, digits, '.', '_' and '-' (Kafka topic names)")
        return v

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    @field_validator("kafka_ssl_ca_location")
    @classmethod
    def _ca_exists(cls, v: str | None) -> str | None:
        if v is not None and v != "probe" and not Path(v).exists():
            raise ValueError("must be an existing CA file or directory (or 'probe')")
        return v

    @field_validator("clickhouse_dsn")
    @classmethod
    def _dsn(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if v.startswith("chdb:"):
            return v
        if not v.startswith(("http:", "https:", "clickhouse:")):
            raise ValueError("must be chdb://<path>, http(s)://[user@]host:port[/database]")
        check_http_url(v, schemes=("http", "https", "clickhouse"))
        return v

    @field_validator("clickhouse_database")
    @classmethod
    def _database_ident(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError("must be letters, digits and underscores, not starting with a digit")
        return v

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
    def store_path(self) -> Path:
        """The embedded engine's data directory, which the local store owns."""
        return self.data_dir.resolve() / "clickhouse"

    @property
    def uses_local_store(self) -> bool:
        return self.clickhouse_dsn is None

    @property
    def dsn(self) -> str:
        """The ClickHouse DSN: the setting; unset, the local store; ``chdb://`` alone, the embedded engine at
        ``<data_dir>/clickhouse`` opened in this process (tests, one-off scripts: no store process)."""
        if self.clickhouse_dsn in ("chdb:", "chdb://"):
            return f"chdb://{self.store_path}"
        return self.clickhouse_dsn or f"http://{self.store_host}:{self.store_port}"


def check_http_url(v: str, schemes: tuple[str, ...] = ("http", "https")) -> None:
    """ValueError unless ``v`` is ``scheme://host[:port][/path]`` with a port in 1-65535."""
    try:
        parsed = urlparse(v)
        port = parsed.port  # ValueError when out of range or not a number
    except ValueError:
        port, parsed = -1, None
    if parsed is None or parsed.scheme not in schemes or not parsed.hostname or port == -1:
        raise ValueError(f"must be a URL {'|'.join(schemes)}://host[:port][/path] with a port in 1-65535")


S = TypeVar("S", bound=BaseSettings)

# pydantic error type → the rule, said plainly; ctx keys fill the braces.
_RULES = {
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be greater than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "int_type": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "finite_number": "must be a finite number",
}


def default_of(cls: type[BaseSettings], field: str) -> Any:
    """A settings field's declared default, for a dataclass or config that mirrors the field (the model stays the one
    place the default is written). Pure."""
    return cls.model_fields[field].default


def check_values(cls: type[BaseSettings], values: Mapping[str, Any], name: str = "{}",
                 whole: str = "settings that do not go together") -> None:
    """ConfigError for the first of ``values`` (field → value) that breaks its rule in ``cls``, naming the field as
    ``name.format(field)`` (``GRPO({}=...)``), or a rule over several fields after ``whole``: an API's own arguments
    checked against the settings model that declares them; the environment is not read. Pure."""
    try:
        cls.model_validate(dict(values))
    except ValidationError as exc:
        err = exc.errors()[0]
        if not err["loc"]:
            raise ConfigError(f"{whole}: {str(err['msg']).removeprefix('Value error, ')}") from None
        field = str(err["loc"][0])
        rule = str(err["msg"]).replace("Input should be", "must be")
        raise ConfigError(f"{name.format(field)} {rule}, got {values.get(field)!r}") from None


def choices_of(cls: type[BaseSettings], field: str) -> tuple[str, ...]:
    """The values a ``Literal`` settings field takes, for a flag's ``choices`` (the model stays the one place they are
    written). Pure."""
    return tuple(get_args(cls.model_fields[field].annotation))


def _is_literal(cls: type[BaseSettings], field: str) -> bool:
    return get_origin(cls.model_fields[field].annotation) is Literal


def shown_default(cls: type[BaseSettings], field: str) -> str | None:
    """A field's default as a flag's help shows it (None: none to show: no default, a computed one, a switch). Pure."""
    info = cls.model_fields[field]
    default = info.default
    if (info.default_factory is not None or default is None or default == "" or isinstance(default, bool)
            or "SecretStr" in repr(info.annotation)):
        return None
    if isinstance(default, float) and default.is_integer():
        return str(int(default)) if abs(default) >= 1 or default == 0 else repr(default)
    return str(default)


def describe_now(parser: Any, cls: type[BaseSettings], dests: Any = None) -> None:
    """Each flag's variable and default appended to its help from the settings model ``cls``, so a default is written
    once, in the model: ``(env ROLLOUTBUS_LR, default 0.0005)``. ``dests``: flag dest → settings field (default: every
    flag whose dest is a field). A help that names its variable itself (a default the model computes) is left as
    written. :func:`foundation.flags.describe_flags` calls it when the help is shown."""
    if dests is None:
        dests = list(cls.model_fields)
    fields = dict(dests) if isinstance(dests, Mapping) else {d: d for d in dests}
    for action in parser._actions:
        field = fields.get(action.dest)
        if field is None or field not in cls.model_fields or not action.help or "(env " in action.help or action.help == "==SUPPRESS==":
            continue
        default = shown_default(cls, field) if action.nargs != 0 else None
        if action.choices is None and action.metavar is None and action.nargs != 0 and _is_literal(cls, field):
            action.metavar = "{" + ",".join(map(str, choices_of(cls, field))) + "}"  # the model's values, as choices= shows them
        env = ENV_PREFIX + field.upper()
        action.help = f"{action.help} (env {env}" + (f", default {default})" if default is not None else ")")


def setting_bounds(cls: type[BaseSettings], field: str) -> dict[str, float]:
    """The numeric bounds (``ge``/``gt``/``le``/``lt``) declared on one settings field."""
    info = cls.model_fields[field]
    bounds: dict[str, float] = {}
    for meta in info.metadata:
        for key in ("ge", "gt", "le", "lt"):
            if getattr(meta, key, None) is not None:
                bounds[key] = getattr(meta, key)
    return bounds


def _is_secret(cls: type[BaseSettings] | None, field: str) -> bool:
    if cls is None or field not in cls.model_fields:  # no class to ask: judge by the name
        return any(word in field for word in ("password", "token", "secret", "api_key"))
    return "SecretStr" in repr(cls.model_fields[field].annotation) or "password" in field


def _rule(cls: type[BaseSettings] | None, field: str, err: Mapping[str, Any]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    bounds = setting_bounds(cls, field) if cls is not None and field in cls.model_fields else {}
    low = ("at least", bounds["ge"]) if "ge" in bounds else ("greater than", bounds["gt"]) if "gt" in bounds else None
    high = ("at most", bounds["le"]) if "le" in bounds else ("less than", bounds["lt"]) if "lt" in bounds else None
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than") and low and high:
        return f"must be {low[0]} {low[1]} and {high[0]} {high[1]}"
    if kind in _RULES:
        return _RULES[kind].format(**ctx)
    msg = str(err.get("msg", kind))
    return msg.removeprefix("Value error, ").replace("Input should be", "must be")


def _shown(cls: type[BaseSettings] | None, field: str, value: Any) -> str:
    """The bad value as the error line shows it: never a secret, never a DSN's password."""
    if _is_secret(cls, field):
        return "(value hidden)"
    text = re.sub(r"//[^@/\s]*@", "//***@", str(value))  # user:password in a DSN or URL
    return repr(text if len(text) <= 80 else text[:77] + "...")


def setting_error(cls: type[BaseSettings] | None, exc: ValidationError, overrides: Mapping[str, Any],
                  flags: Mapping[str, str] | None = None) -> SettingError:
    """One pydantic error on a settings class → the :class:`SettingError` the CLI prints in one line."""
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err.get("loc") else ""
    flag = (flags or {}).get(field) or ("--data-dir" if field == "data_dir" else None)
    env = f"{ENV_PREFIX}{field.upper()}" if field else None
    source = flag if field in overrides and flag else env
    value = overrides[field] if field in overrides else err.get("input")
    what = f"bad value {_shown(cls, field, value)}" + (f" from {source}" if flag else "")
    if not field:  # a rule over several fields (a model validator): the class's name means nothing to the user
        what = "settings that do not go together"
    return SettingError(what, _rule(cls, field, err), flag=flag, env=env)


def load_settings(cls: type[S], overrides: Mapping[str, Any] | None = None, flags: Mapping[str, str] | None = None) -> S:
    """Read ``cls`` from explicit values (flags) over ``ROLLOUTBUS_*`` variables over defaults.

    A value that breaks a field's rule raises :class:`SettingError` naming the field's flag
    (``flags``: field → flag) and its environment variable — the one place settings errors are mapped.
    """
    overrides = dict(overrides or {})
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise setting_error(cls, exc, overrides, flags) from exc
