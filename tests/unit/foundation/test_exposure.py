import logging

import pytest

from foundation.errors import ConfigError
from foundation.exposure import check_listen, is_loopback


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("api.localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("192.168.1.5", False), ("10.0.0.1", False),
    ("fe80::1", False), ("example.com", False), ("localhost.example.com", False), ("::ffff:127.0.0.1", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_needs_nothing(host: str) -> None:
    check_listen(host, credentials=False, insecure=False, variable="ROLLOUTBUS_X_TOKEN", command="rolloutbus x")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "box.lan"])
def test_open_address_without_credentials_is_refused_in_one_line(host: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_listen(host, credentials=False, insecure=False, variable="ROLLOUTBUS_X_TOKEN", command="rolloutbus x")
    line = str(err.value)
    assert "\n" not in line and "ROLLOUTBUS_X_TOKEN" in line and "--insecure" in line and host in line


def test_credentials_allow_any_address(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_listen("0.0.0.0", credentials=True, insecure=False, variable="V", command="rolloutbus x")
    assert not caplog.records


def test_insecure_starts_with_a_loud_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_listen("0.0.0.0", credentials=False, insecure=True, variable="ROLLOUTBUS_X_TOKEN", command="rolloutbus x")
    [rec] = caplog.records
    assert rec.levelno == logging.WARNING and "INSECURE" in rec.getMessage() and "ROLLOUTBUS_X_TOKEN" in rec.getMessage()
