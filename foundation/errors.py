"""The project's error tree. Every error the library raises on purpose derives from one root.

::

    RolloutbusError
    ├── ConfigError            a setting is missing or wrong (the CLI exits 2)
    │   └── SettingError       one flag / environment variable holds a value outside its rule
    ├── DecodeError            bytes are not a record of ours (unknown fingerprint, truncated, wrong type)
    ├── EncodeError            a record does not fit its schema
    ├── ValidationError        a decoded record holds impossible values (negative sequence id, NaN reward, ...)
    ├── ServiceError           a real service is unusable
    │   ├── KafkaUnavailable   the broker does not answer
    │   ├── KafkaNotAuthorized the broker refused this client (ACL refusal or failed login): fatal, no retry
    │   ├── BrokerSetupError   the local broker cannot be fetched, formatted or started
    │   ├── ClickHouseError    the ClickHouse engine refused a statement or cannot be reached
    │   └── StoreError         the local store process cannot start (its data dir is in use, its port taken)
    ├── RolloutContextError    an emit_* helper was called outside a rollout
    └── TrainingError          the trainer cannot go on (bad checkpoint, shape mismatch, ...)

Messages say what was wrong and how to fix it. Third-party errors are mapped once, at the boundary,
with ``raise ... from exc``.
"""

from __future__ import annotations


class RolloutbusError(Exception):
    """Root of every error rolloutbus raises on purpose."""


class ConfigError(RolloutbusError):
    """A setting is missing or has a value that cannot work."""


class SettingError(ConfigError):
    """One setting holds a value that breaks its rule; names the flag and the environment variable.

    ``str()`` is ``<what is wrong> (<flag> / <ENV VAR>): <the rule>``, the line the CLI prints.
    """

    def __init__(self, what: str, rule: str, flag: str | None = None, env: str | None = None) -> None:
        self.what, self.rule, self.flag, self.env = what, rule, flag, env
        where = " / ".join(x for x in (flag, env) if x)
        super().__init__(f"{what} ({where}): {rule}" if where else f"{what}: {rule}")


class DecodeError(RolloutbusError):
    """Bytes could not be decoded into one of our records."""


class EncodeError(RolloutbusError):
    """A record could not be encoded with its schema."""


class ValidationError(RolloutbusError):
    """A record decoded fine but holds values that cannot be right."""


class ServiceError(RolloutbusError):
    """A real service (Kafka, ClickHouse) is unusable."""


class KafkaUnavailable(ServiceError):
    """The Kafka cluster does not answer."""


class KafkaNotAuthorized(ServiceError):
    """The broker refused this client: an ACL does not allow the operation, or the login failed.

    Retrying cannot help; the process ends with the one line and a non-zero exit.
    """


class BrokerSetupError(ServiceError):
    """The local Kafka broker cannot be fetched, formatted or started."""


class ClickHouseError(ServiceError):
    """ClickHouse refused a statement or cannot be reached."""


class StoreError(ServiceError):
    """The local store process cannot start or be reached."""


class RolloutContextError(RolloutbusError):
    """An emit_* helper was called where no rollout is open."""


class TrainingError(RolloutbusError):
    """The trainer cannot go on."""


__all__ = [
    "RolloutbusError",
    "ConfigError",
    "SettingError",
    "DecodeError",
    "EncodeError",
    "ValidationError",
    "ServiceError",
    "KafkaUnavailable",
    "BrokerSetupError",
    "ClickHouseError",
    "StoreError",
    "RolloutContextError",
    "TrainingError",
]
