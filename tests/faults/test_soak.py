"""A bounded soak: memory of the stream worker and of an emitting agent process does not grow without
bound, and the worker releases the per-rollout state of completed rollouts."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from faultkit import LONG, emitter, free_port, rss_kib, stop_worker, wait_drained, worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200 if LONG else 200)]
DURATION = 600.0 if LONG else 60.0


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def test_soak_memory_is_bounded_and_rollout_state_released(kafka_conf: dict[str, Any], test_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    wk = worker(test_env, "--metrics-port", str(port), rollout_timeout=30)
    em = emitter({**test_env, "ROLLOUTBUS_DATA_DIR": str(tmp_path / "em")}, tmp_path / "unused.jsonl",
                 "--duration", str(DURATION), "--rate", "40", "--tasks", "50", log=tmp_path / "emitter.log")
    samples: list[tuple[float, int, int]] = []
    t0 = time.monotonic()
    while em.poll() is None:
        samples.append((time.monotonic() - t0, rss_kib(wk.pid), rss_kib(em.pid)))
        time.sleep(1.0)
    assert em.returncode == 0, (tmp_path / "emitter.log").read_text()[-2000:]
    summary = json.loads((tmp_path / "emitter.log").read_text().strip().splitlines()[-1])
    wait_drained(kafka_conf, test_env, wk, timeout=120)
    metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    rc, out = stop_worker(wk)
    assert rc == 0, out[-3000:]
    stats = json.loads(re.findall(r"flushed and committed before shutdown: (\{.*\})", out)[-1].replace("'", '"'))
    live = [s for s in samples if s[1] and s[2]]
    third = len(live) // 3
    mid, last = live[third: 2 * third], live[2 * third:]
    figures = {"test": "soak", "seconds": round(DURATION), "rollouts": summary["rollouts"], "spans_enqueued": summary["enqueued"],
               "worker_rss_mib_mid_max": max(s[1] for s in mid) // 1024, "worker_rss_mib_last_max": max(s[1] for s in last) // 1024,
               "emitter_rss_mib_mid_max": max(s[2] for s in mid) // 1024, "emitter_rss_mib_last_max": max(s[2] for s in last) // 1024,
               "rollouts_completed": _metric(metrics, "rolloutbus_streams_rollouts_completed_total"),
               "worker_stats": stats}
    print("FIGURES " + json.dumps(figures))
    for col in (1, 2):
        assert max(s[col] for s in last) <= max(s[col] for s in mid) * 1.15 + 20 * 1024, f"RSS grew: {figures}"
    assert figures["rollouts_completed"] >= summary["rollouts"]
