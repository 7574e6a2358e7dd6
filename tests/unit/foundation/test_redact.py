"""redact_url: what a log line or error shows of a URL (or a ClickHouse DSN); url_secrets: what must never
appear at all; scrub: text with given secrets masked."""

from __future__ import annotations

import pytest

from foundation.redact import redact_url, scrub, url_secrets


@pytest.mark.parametrize(("url", "shown"), [
    ("https://user:key-123@api.example.com/v1", "https://user:***@api.example.com/v1"),
    ("https://user:key-123@api.example.com:8443/v1", "https://user:***@api.example.com:8443/v1"),
    ("http://sk-abc123@host/v1", "http://***@host/v1"),
    ("http://user:@host/v1", "http://user:***@host/v1"),
    ("http://us%40er:p%40ss@host/v1", "http://us%40er:***@host/v1"),
    ("http://user:p@ss@host/v1", "http://user:***@host/v1"),  # an unquoted @ in the password: all of it hidden
    ("https://host/v1?api_key=k1&model=m&sig=s2", "https://host/v1?api_key=***&model=m&sig=***"),
    ("https://host/v1?api-version=2024", "https://host/v1?api-version=2024"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
    ("http://u:pw@[::1/v1", "http://***@[::1/v1"),  # not parseable: the user part is hidden all the same
    ("", ""),
    # ClickHouse DSNs, as the dashboard, the CLI and connection errors show them
    ("http://h:8123/?password=s3cr", "http://h:8123/?password=***"),
    ("https://tok@h/", "https://***@h/"),
    ("http://rolloutbus:s3cr@h:8123", "http://rolloutbus:***@h:8123"),
    ("http://default:@h:8123", "http://default:***@h:8123"),
    ("http://h:8123/?user=a&password=s3cr&database=rb", "http://h:8123/?user=a&password=***&database=rb"),
    ("clickhouse://u:s3cr@h:9000/db", "clickhouse://u:***@h:9000/db"),
    ("chdb:///var/lib/rolloutbus/clickhouse", "chdb:///var/lib/rolloutbus/clickhouse"),  # nothing to hide: as given
    ("chdb://", "chdb://"),
    ("http://rolloutbus@127.0.0.1:8123", "http://***@127.0.0.1:8123"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(("url", "secrets"), [
    ("https://user:key-123@host/v1", ["key-123"]),
    ("http://sk-abc123@host/v1", ["sk-abc123"]),
    ("http://u:p%40ss@host/v1?token=t%2B1", ["p%40ss", "t%2B1", "p@ss", "t+1"]),
    ("http://host/v1", []),
])
def test_url_secrets_are_what_redact_url_hides(url: str, secrets: list[str]) -> None:
    assert sorted(url_secrets(url)) == sorted(secrets)
    for secret in url_secrets(url):
        assert secret not in redact_url(url)


def test_the_clickhouse_dsn_is_shown_by_the_one_redactor() -> None:
    from foundation.clickhouse import redact_dsn

    assert redact_dsn is redact_url


@pytest.mark.parametrize(("text", "secrets", "shown"), [
    ("refused key-123 for user:key-123", ["key-123"], "refused *** for user:***"),
    ("abc-long and abc", ["abc", "abc-long"], "*** and ***"),  # the longer first: no tail of it left
    ("nothing here", ["", "zz"], "nothing here"),
])
def test_scrub(text: str, secrets: list[str], shown: str) -> None:
    assert scrub(text, secrets) == shown
