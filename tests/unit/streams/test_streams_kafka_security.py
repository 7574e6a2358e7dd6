"""The stream worker's faust clients get the same Kafka security settings as every other client."""

from __future__ import annotations

import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from pydantic import SecretStr

from foundation.config import KafkaSecurity

PASSWORD = "pw-7d1c0e"


def test_plaintext_needs_no_credentials() -> None:
    assert KafkaSecurity().faust() is None


def test_sasl_reaches_aiokafka_with_mechanism_user_and_password() -> None:
    cred = KafkaSecurity(protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", sasl_username="ingest",
                         sasl_password=SecretStr(PASSWORD)).faust()
    auth = credentials_to_aiokafka_auth(cred)
    assert (auth["security_protocol"], auth["sasl_mechanism"]) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
    assert (auth["sasl_plain_username"], auth["sasl_plain_password"]) == ("ingest", PASSWORD)
    assert PASSWORD not in repr(cred) and PASSWORD not in str(cred)


def test_sasl_ssl_and_ssl_carry_a_tls_context() -> None:
    auth = credentials_to_aiokafka_auth(KafkaSecurity(protocol="SASL_SSL", sasl_username="u", sasl_password=SecretStr("p")).faust())
    assert auth["security_protocol"] == "SASL_SSL" and auth["sasl_mechanism"] == "PLAIN" and auth["ssl_context"] is not None
    auth = credentials_to_aiokafka_auth(KafkaSecurity(protocol="SSL").faust())
    assert auth["security_protocol"] == "SSL" and auth["ssl_context"] is not None


def test_an_unknown_protocol_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported Kafka security protocol 'KERBEROS'"):
        KafkaSecurity(protocol="KERBEROS").faust()
