"""The dashboard's pure parts: time buckets, chart series, a rollout's timeline, the SQL box's answer,
the token check and the missing-library message (no socket, no ClickHouse)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from rolloutbus.dashboard import queries as Q


@pytest.mark.parametrize(("seconds", "bucket"), [(0, 10), (60, 5), (600, 5), (1200, 10), (3600, 30), (6 * 3600, 300), (10**7, 86400)])
def test_buckets_keep_a_run_near_120_points(seconds: int, bucket: int) -> None:
    assert Q.bucket_seconds(10**18, 10**18 + seconds * 10**9) == bucket


def test_series_are_aligned_on_one_x_axis_with_gaps() -> None:
    rows = [(1, "train", 0.5), (2, "train", 0.75), (2, "test", 1.0)]
    assert Q.series_by(rows, key=1, x=0, ys={"reward": 2}) == {
        "x": [1, 2], "test:reward": [None, 1.0], "train:reward": [0.5, 0.75]}


def test_values_json_cannot_carry_become_null_or_text() -> None:
    assert Q.clean([math.nan, math.inf, 1.5, (1, 2), b"ok", {"a": math.nan}]) == [None, None, 1.5, [1, 2], "ok", {"a": None}]


def test_a_timeline_puts_each_llm_turns_text_and_step_beside_its_span() -> None:
    spans = [
        {"attempt_id": "a", "span_id": "s1", "seq": 1, "kind": "llm", "logprobs": [-0.5, -0.25], "token_ids": [17, 42],
         "attributes": {"gen_ai.prompt": "2 3 gain", "gen_ai.completion": "calc 2+3", "http.route": "/v1"}},
        {"attempt_id": "a", "span_id": "s2", "seq": 2, "kind": "tool", "logprobs": [], "attributes": {}},
    ]
    steps = [{"attempt_id": "a", "span_id": "s1", "turn": 0, "reward": 0.0, "return": 1.0, "advantage": 0.7, "trained": True}]
    t = Q.timeline(spans, steps)
    assert t[0]["text"] == {"gen_ai.prompt": "2 3 gain", "gen_ai.completion": "calc 2+3"}
    assert t[0]["attributes"] == {"http.route": "/v1"}
    assert t[0]["step"] == {"turn": 0, "reward": 0.0, "return": 1.0, "advantage": 0.7, "trained": True}
    assert t[0]["logprob_mean"] == pytest.approx(-0.375) and t[0]["logprob_min"] == -0.5
    assert t[0]["token_ids"] == [17, 42] and t[0]["logprobs"] == [-0.5, -0.25], "each token's id beside its log-probability"
    assert t[1]["step"] is None and t[1]["logprob_mean"] is None and t[1]["token_ids"] == []


def test_the_sql_answer_says_which_columns_can_be_charted_and_cuts_long_results() -> None:
    r = Q.sql_result(["v", "reward", "name"], ["Nullable(Int64)", "Float64", "String"], [[1, 0.5, "x"]] * 5, max_rows=3)
    assert r["numeric"] == [True, True, False] and r["row_count"] == 5 and len(r["rows"]) == 3 and r["truncated"]


class NoStore:
    """The readers' place: the auth check must answer before anything is read."""

    def rows(self, sql: str, parameters: Any = None) -> list[Any]:
        raise AssertionError("read ClickHouse")

    def close_client(self) -> None:
        pass


def test_api_requests_without_the_token_get_401_and_the_page_does_not(tmp_path: Path) -> None:
    from aiohttp.test_utils import make_mocked_request

    from rolloutbus.dashboard.app import Dashboard

    dash = Dashboard(NoStore(), NoStore(), token="s3cret")  # type: ignore[arg-type]

    async def handler(request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"ok": True})

    async def go() -> list[int]:
        out = []
        for path, auth in [("/api/learning", None), ("/api/learning", "Bearer wrong"), ("/api/learning", "Bearer s3cret"), ("/", None)]:
            req = make_mocked_request("GET", path, headers={"Authorization": auth} if auth else {})
            out.append((await dash._auth(req, handler)).status)
        return out

    assert asyncio.run(go()) == [401, 401, 200, 200]


def test_without_the_vendored_library_the_line_says_how_to_get_it(tmp_path: Path) -> None:
    from rolloutbus.dashboard.app import assets_missing

    line = assets_missing(tmp_path / "no-vendor")
    assert line is not None and "make dashboard-assets" in line and "uPlot" in line
    (tmp_path / "v").mkdir()
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        (tmp_path / "v" / name).write_text("x")
    assert assets_missing(tmp_path / "v") is None


def test_a_gateways_metrics_become_one_row_of_requests_by_status_and_spool_depth() -> None:
    text = """# HELP rolloutbus_gateway_requests_total OTLP requests by HTTP status
# TYPE rolloutbus_gateway_requests_total counter
rolloutbus_gateway_requests_total{code="200"} 7.0
rolloutbus_gateway_requests_total{code="400"} 2.0
rolloutbus_gateway_requests_total{code="401"} 1.0
rolloutbus_gateway_requests_total{code="413"} 1.0
# TYPE rolloutbus_gateway_spans_accepted_total counter
rolloutbus_gateway_spans_accepted_total 40.0
# TYPE rolloutbus_gateway_spool_pending gauge
rolloutbus_gateway_spool_pending 3.0
# TYPE rolloutbus_gateway_kafka_up gauge
rolloutbus_gateway_kafka_up 0.0
"""
    row = Q.producer_health("http://gw:4318/metrics", text)
    assert row == {"target": "http://gw:4318/metrics", "2xx": 7.0, "4xx": 4.0, "503": 0, "5xx": 0, "spans_accepted": 40.0,
                   "spans_rejected": None, "spool_pending": 3.0, "kafka_up": 0.0}
    assert Q.producer_health("x", "# nothing we know\nother_metric 1.0\n")["2xx"] is None, "no request counter: unknown, not 0"
