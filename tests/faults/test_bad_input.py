"""Adversarial records on rb.spans land on rb.dlq with a reason while good records keep flowing;
fuzzed OTLP bodies at the gateway get a 4xx with a reason (or a 200 partial success), never a 5xx."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from faultkit import check_store, rng, stop_worker, wait_drained, worker
from schemas import codec
from tests.integration.streams.helpers import encoded, produce, rollout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def adversarial(seed: str) -> dict[str, bytes]:
    """One record per kind of bad input, each built from a valid record."""
    r = rng(seed)
    spans, ev = rollout("bad-r", "bad", 1.0)
    good = codec.encode(spans[0])
    _name, span = codec.decode_raw(good)
    _name, fin = codec.decode_raw(codec.encode(ev))

    def span_with(**changes: Any) -> bytes:
        d = json.loads(json.dumps(span, default=lambda b: b.hex()))  # deep copy; bytes restored below
        d["llm"] = dict(span["llm"])
        d.update(changes)
        d["span_id"] = f"bad-{len(changes)}-{r.random()}"
        return codec.encode_raw("rolloutbus.Span", d)

    return {
        "truncated_avro": good[: len(good) // 2],
        "wrong_fingerprint": good[:2] + bytes(r.getrandbits(8) for _ in range(8)) + good[10:],
        "random_bytes": bytes(r.getrandbits(8) for _ in range(64)),
        "empty": b"",
        "negative_sequence_id": span_with(sequence_id=-5),
        "huge_attribute_map": span_with(attributes={f"k{i}": "v" * 10 for i in range(200_000)}),
        "token_ids_out_of_range": span_with(llm={**span["llm"], "prompt_token_ids": b"\x01\x02\x03\x04\x05"}),
        "nan_span_reward": span_with(reward={"value": math.nan, "dimensions": {}, "primary": "reward"}),
        "nan_final_reward": codec.encode_raw("rolloutbus.RolloutEvent", {**fin, "rollout_id": "bad-nan", "attempt_id": "bad-nan-a1", "final_reward": math.nan}),
    }


def test_adversarial_records_go_to_the_dlq_and_good_ones_keep_flowing(kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str]) -> None:
    bad = adversarial("bad-input")
    good = {f"g{i}": rollout(f"g{i}", f"gt{i // 2}", reward=float(i % 2)) for i in range(8)}
    items: list[tuple[str, bytes]] = []
    # Good rollouts interleaved with bad records on the same keys (so on the same partitions).
    for i, (kind, value) in enumerate(bad.items()):
        rid = f"g{i % 8}"
        spans, ev = good[rid]
        items.append((rid, value))
    for rid, (spans, ev) in good.items():
        items.extend(encoded(spans, ev))
    items.extend((f"g{i % 8}", v) for i, v in enumerate(bad.values()))
    produce({**kafka_conf, "message.max.bytes": 16 << 20}, topics.spans, items)
    proc = worker(test_env, rollout_timeout=30)
    wait_drained(kafka_conf, test_env, proc, timeout=120)
    rc, out = stop_worker(proc)
    assert rc == 0, out[-3000:]
    res = check_store(test_env, kafka_conf, "bad_input")
    ro = {(r[0], r[1]): r[2] for r in res["rows"]["rollouts"]}
    assert all(ro.get((rid, f"{rid}-a1")) == "succeeded" for rid in good), "good rollouts behind bad records completed"
    accepted = sorted({kind for kind, v in bad.items() if _accepted(v)})
    print("FIGURES " + json.dumps({"test": "bad_input/kinds", "kinds": len(bad), "accepted_as_valid": accepted}))
    dlq = res["figures"]["dlq_by_reason"]
    assert sum(dlq.values()) == 2 * len(bad), f"each bad record (sent twice) is one dead letter: {dlq}"


def _accepted(value: bytes) -> bool:
    try:
        codec.decode(value)
    except Exception:  # noqa: BLE001
        return False
    return True
