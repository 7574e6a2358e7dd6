"""One attempt's spans through two gateway processes (as deploy runs 2-10 replicas): every stored span
gets its own sequence id, in the order the spans reached the topic, and the attempt completes by its
FINISHED ``span_count`` — numbering is the span stage's, so replicas need no coordination."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import Consumer

from schemas import codec
from schemas.models import RolloutEvent
from producers_testkit import start_gateway
from tests.integration.streams.helpers import batches, produce, query, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "s3cret"
RID, AID = "ro-two-gw", "at-two-gw"


@pytest.fixture
def two_gateways(test_env: dict[str, str], tmp_path: Path) -> Iterator[list[str]]:
    """Two gateway processes on one broker, each with its own spool (as two replicas have)."""
    started = [start_gateway(test_env, tmp_path / f"gw-{n}", TOKEN) for n in ("a", "b")]
    yield [base for base, _ in started]
    for _, proc in started:
        proc.terminate()
        proc.wait(30)


def _otlp(name: str, attrs: dict[str, Any], n: int) -> dict[str, Any]:
    """One OTLP/JSON span of the attempt, ids on the Resource and no sequence id (a plain SDK's)."""
    def value(v: Any) -> dict[str, Any]:
        if isinstance(v, list):
            return {"arrayValue": {"values": [{"intValue": str(x)} for x in v]}}
        return {"doubleValue": v} if isinstance(v, float) else {"stringValue": str(v)}

    res = [{"key": "agentlightning.rollout_id", "value": {"stringValue": RID}},
           {"key": "agentlightning.attempt_id", "value": {"stringValue": AID}}]
    t = 1_700_000_000_000_000_000 + n * 1_000_000
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": f"{n:016x}", "name": name,
            "startTimeUnixNano": str(t), "endTimeUnixNano": str(t + 500_000),
            "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}
    return {"resourceSpans": [{"resource": {"attributes": res}, "scopeSpans": [{"spans": [span]}]}]}


def test_one_attempt_through_two_gateways_is_numbered_once_in_order_and_completes(
    two_gateways: list[str], kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str]
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    llm = {"gen_ai.request.model": "tiny"}
    # (replica, what is sent): OTLP spans without sequence ids, and one Agent Lightning 1.x event.
    sends: list[tuple[int, str, Any]] = [
        (0, "otlp", _otlp("openai.chat.completion", {**llm, "prompt_token_ids": [1, 2], "response_token_ids": [3],
                                                     "gen_ai.response.id": "c1"}, 1)),
        (1, "otlp", _otlp("tool-run", {"gen_ai.tool.name": "calc"}, 2)),
        (0, "otlp", _otlp("openai.chat.completion", {**llm, "prompt_token_ids": [1, 2, 3, 4], "response_token_ids": [5],
                                                     "gen_ai.response.id": "c2"}, 3)),
        (1, "otlp", _otlp("openai.chat.completion", {**llm, "prompt_token_ids": [1, 2, 3, 4, 5, 6], "response_token_ids": [7],
                                                     "gen_ai.response.id": "c3"}, 4)),
        (0, "otlp", _otlp("note", {"agentlightning.message.body": "checking"}, 5)),
        (1, "event", {"event_type": "reward", "data": {"value": 1.0}}),
    ]
    watch = Consumer({**kafka_conf, "group.id": f"watch-{uuid.uuid4().hex}", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
    watch.subscribe([topics.spans])
    on_topic = 0
    try:
        for sent, (replica, kind, body) in enumerate(sends, 1):
            base = two_gateways[replica]
            if kind == "otlp":
                resp = requests.post(f"{base}/v1/traces", data=json.dumps(body),
                                     headers={**auth, "Content-Type": "application/json"}, timeout=10)
                assert resp.status_code == 200 and "rejectedSpans" not in resp.text, resp.text
            else:
                resp = requests.post(f"{base}/api/rollouts/{RID}/attempt/{AID}/events", json=body, headers=auth, timeout=10)
                assert resp.status_code == 200, resp.text
            # The next span goes out once this one is on the topic: the order they were sent is the
            # order on the partition (two producers give no order between them otherwise).
            deadline = time.monotonic() + 30
            while on_topic < sent:
                assert time.monotonic() < deadline, "a span did not reach rb.spans"
                msg = watch.poll(0.5)
                if msg is not None and not msg.error():
                    _name, rec = codec.decode_raw(msg.value())
                    assert rec["sequence_id"] == 0, "the gateway passes unnumbered spans on unnumbered"
                    on_topic += 1
    finally:
        watch.close()

    # Agent Lightning's store API on a gateway with a token wants it too.
    assert requests.post(f"{two_gateways[0]}/v1/agl/spans/next", json={"rollout_id": RID, "attempt_id": AID},
                         timeout=5).status_code == 401

    # The runner's FINISHED: no reward of its own (the reward event is the reward), six spans.
    finished = RolloutEvent(rollout_id=RID, attempt_id=AID, event="FINISHED", time_ns=time.time_ns(), task_id="two-gw",
                            status="succeeded", final_reward=None, span_count=len(sends))
    produce(kafka_conf, topics.spans, [(RID, codec.encode(finished))])
    # A long grace: completing within the wait below means the span count found 1..6 in, not the grace.
    proc = start_worker(test_env, "--group-size", "1", "--finish-grace", "600")
    got = batches(kafka_conf, topics.batches, 1, proc, timeout=60)
    rc, log = stop_worker(proc)
    assert rc == 0 and len(got) == 1, log[-3000:]

    rows = query(test_env, {
        "spans": ("SELECT sequence_id, name, attributes['rolloutbus.sequence_by'], late FROM spans FINAL "
                  f"WHERE rollout_id = '{RID}' ORDER BY kafka_offset"),
        "ro": f"SELECT status, spans_seen, span_count, missing_sequence_ids, final_reward FROM rollouts FINAL WHERE rollout_id = '{RID}'",
        "tr": f"SELECT turn, prompt_token_ids FROM transitions FINAL WHERE rollout_id = '{RID}' ORDER BY turn",
    })
    assert rows["spans"] == [
        [1, "openai.chat.completion", "stream", 0], [2, "tool-run", "stream", 0], [3, "openai.chat.completion", "stream", 0],
        [4, "openai.chat.completion", "stream", 0], [5, "note", "stream", 0], [6, "agentlightning.event.reward", "stream", 0],
    ], "distinct sequence ids, in the order the spans arrived, whichever replica took them"
    assert rows["ro"] == [["succeeded", 6, 6, [], 1.0]]
    assert [r[1] for r in rows["tr"]] == [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6]], "the steps in that order"
