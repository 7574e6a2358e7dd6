"""The RowBinary row builders against the previous ones (``rowbinary_reference``) on random spans and steps."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schemas.checks import check_span
from streams import rowbinary
from streams.attempts import span_view
from tests.unit.schemas.test_span_avro import spans
from tests.unit.streams import rowbinary_reference as ref


def _whole(b: bytes, size: int) -> bytes:
    return b[: len(b) - len(b) % size]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(spans, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), st.booleans(), st.integers(-(2**63), 2**63 - 1))
def test_span_rows_as_before(d: dict, partition: int, offset: int, late: bool, ingested: int) -> None:
    assume(d["sequence_id"] >= 0)
    if d["llm"] is not None:
        llm = d["llm"]
        for key in ("prompt_token_ids", "response_token_ids"):
            llm[key] = _whole(llm[key], 4)
        llm["response_logprobs"] = struct.pack(f"<{len(llm['response_logprobs']) // 4}f",
                                               *[-0.5] * (len(llm["response_logprobs"]) // 4))
    try:
        check_span(d)
    except Exception:  # noqa: BLE001 - the stage dead-letters these before a row is built
        assume(False)
    v = span_view(d)
    assert rowbinary.span(v, partition, offset, late, ingested) == ref.span(v, partition, offset, late, ingested)


@pytest.mark.parametrize("n", [0, 1, 127, 128, 16383, 16384, 2**21, 2**35])
def test_varint_as_before(n: int) -> None:
    assert rowbinary.varint(n) == ref.varint(n)


@pytest.mark.parametrize("text", ["", "é", "x" * 127, "x" * 128, "x" * 16384, "\u2603" * 6000])
def test_long_strings_as_before(text: str) -> None:
    assert rowbinary._str(text) == ref._str(text)
    assert rowbinary._nstr(text) == ref._nstr(text)
    assert rowbinary._map_ss({text: text, "k": text}) == ref._map_ss({text: text, "k": text})
