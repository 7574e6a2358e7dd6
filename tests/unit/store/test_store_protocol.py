"""The pure parts of the store's HTTP interface: where an insert's data starts, error text, codings."""

from __future__ import annotations

import pytest

from rolloutbus.store import protocol


@pytest.mark.parametrize(
    "statement, head, fmt, data",
    [
        (b"INSERT INTO t (a, b) FORMAT Native\n\x00\x01\n", "INSERT INTO t (a, b)", "Native", b"\x00\x01\n"),
        (b"INSERT INTO db.t FORMAT RowBinary\r\n\n\x02", "INSERT INTO db.t", "RowBinary", b"\n\x02"),  # one line break only
        (b"  insert into t format TSV 1\t2\n", "insert into t", "TSV", b"1\t2\n"),
        (b"-- c\nINSERT INTO t SETTINGS async_insert=1 FORMAT JSONEachRow\n{}", "-- c\nINSERT INTO t SETTINGS async_insert=1", "JSONEachRow", b"{}"),
        (b"INSERT INTO t FORMAT Native", "INSERT INTO t", "Native", b""),
    ],
)
def test_split_insert(statement: bytes, head: str, fmt: str, data: bytes) -> None:
    got = protocol.split_insert(statement)
    assert got is not None and (got.head, got.fmt, bytes(got.data)) == (head, fmt, data)


@pytest.mark.parametrize("statement", [b"SELECT 1 FORMAT Native", b"INSERT INTO t VALUES (1)", b"INSERT INTO t SELECT * FROM u FORMAT TSV",
                                       b"CREATE TABLE t (a Int8) ENGINE = Memory"])
def test_statements_that_are_not_inserts_with_data(statement: bytes) -> None:
    assert protocol.split_insert(statement) is None


def test_data_from_the_body_when_the_statement_came_in_the_url() -> None:
    got = protocol.split_insert(b"INSERT INTO t FORMAT RowBinary", b"\x01\x02")
    assert got is not None and bytes(got.data) == b"\x01\x02"


def test_engine_errors_and_error_bodies() -> None:
    code, name, text = protocol.parse_engine_error("Code: 60. DB::Exception: Table x does not exist. (UNKNOWN_TABLE)")
    assert (code, name) == (60, "UNKNOWN_TABLE")
    assert protocol.error_body(code, name, text, "26.9") == b"Code: 60. DB::Exception: Table x does not exist. (UNKNOWN_TABLE) (version 26.9)\n"
    assert protocol.error_body(497, "ACCESS_DENIED", "no.", "1") == b"Code: 497. DB::Exception: no. (ACCESS_DENIED) (version 1)\n"
    assert [protocol.http_status(c) for c in (60, 62, 164, 516, 159, 48)] == [404, 400, 403, 403, 500, 501]


@pytest.mark.parametrize("encoding", protocol.SUPPORTED_ENCODINGS)
def test_codings_round_trip(encoding: str) -> None:
    data = b"row\t1\n" * 1000
    assert protocol.decode_body(protocol.encode_body(data, encoding), encoding) == data


def test_concatenated_lz4_frames_decode_to_their_concatenation() -> None:
    frames = protocol.encode_body(b"abc", "lz4") + protocol.encode_body(b"def", "lz4")
    assert protocol.decode_body(frames, "lz4") == b"abcdef"


def test_accept_encoding_and_output_format() -> None:
    assert protocol.pick_encoding("br, zstd;q=1, gzip") == "zstd"
    assert protocol.pick_encoding("br") is None
    assert protocol.output_format("SELECT 1 FORMAT JSONEachRow;", "TabSeparated") == "JSONEachRow"
    assert protocol.output_format("SELECT 'FORMAT x' AS f", "Native") == "Native"
    assert protocol.is_read("  (SELECT 1)") and protocol.is_read("SHOW TABLES") and not protocol.is_read("CREATE TABLE t (a Int8) ENGINE = Memory")
