"""Agent Lightning's own code as the client: its tracer, emitters and OTLP exporter send an agent's spans
to our gateway; what lands in ClickHouse is, step for step, what its own adapter makes of the same spans.

Agent Lightning 0.3.0 runs in its own virtualenv (al_venv.py); a failed install fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from al_venv import DRIVER, ENV, ALInstallError, ensure_venv
from producers_testkit import consume_all
from schemas import codec
from schemas.models import RolloutEvent
from test_gateway_otlp import gateway  # noqa: F401 - the fixture
from tests.integration.streams.helpers import batches, produce, query, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def al_python() -> Path:
    try:
        return ensure_venv()
    except ALInstallError as exc:
        pytest.fail(f"Agent Lightning is needed for this test and could not be installed: {exc}")


def _run_driver(al_python: Path, base: str, rollout_id: str, attempt_id: str, final: float, out: Path) -> dict[str, Any]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}, **ENV,
           "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20s3cret"}
    run = subprocess.run([str(al_python), str(DRIVER), f"{base}/v1/traces", rollout_id, attempt_id, str(out), str(final)],
                         env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0 and out.exists(), run.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_agent_lightning_agent_through_gateway_matches_its_own_adapter(
    al_python: Path, gateway: Any, kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path  # noqa: F811
) -> None:
    """Two rollouts of one task, rewarded only by reward spans (as Agent Lightning rewards them): one
    ends with a FINISHED that names no reward (its runner's ``update_attempt(status="succeeded")``), the
    other never ends (an exporter only) and is timed out. Each gets its last reward span as its reward,
    and the group's advantages are computed from those."""
    base, _ = gateway
    (rid_a, att_a), (rid_b, att_b) = ("ro-agl", "at-agl-1"), ("ro-agl-b", "at-agl-b1")
    al = _run_driver(al_python, base, rid_a, att_a, 1.0, tmp_path / "a.json")
    al_b = _run_driver(al_python, base, rid_b, att_b, 0.0, tmp_path / "b.json")
    assert len(al["triplets"]) == 3, "the agent makes 3 policy calls (a duplicate export and a judge call aside)"
    assert (al["final_reward"], al_b["final_reward"]) == (1.0, 0.0), "find_final_reward: its last reward span"

    spans = consume_all(kafka_conf, topics.spans, expect=al["spans"] + al_b["spans"], timeout=30)
    assert len(spans) == al["spans"] + al_b["spans"], "every span Agent Lightning's exporter sent is on rb.spans"
    assert {(k, r["rollout_id"], r["attempt_id"]) for k, _n, r, _p in spans} == {
        (rid_a.encode(), rid_a, att_a), (rid_b.encode(), rid_b, att_b)}
    kinds = sorted(r["kind"] for _k, _n, r, _p in spans if r["rollout_id"] == rid_a)
    assert kinds.count("llm") == 5 and kinds.count("reward") == 2 and {"message", "object", "exception"} <= set(kinds)

    # Both claimed for one task (STARTED names it); rollout A ends with a FINISHED without a reward and
    # with its span count, rollout B with nothing at all.
    now = time.time_ns()
    events = [RolloutEvent(rollout_id=r, attempt_id=a, event="STARTED", time_ns=now, task_id="agl-task")
              for r, a in ((rid_a, att_a), (rid_b, att_b))]
    events.append(RolloutEvent(rollout_id=rid_a, attempt_id=att_a, event="FINISHED", time_ns=now + 1, task_id="agl-task",
                               status="succeeded", final_reward=None, span_count=al["spans"]))
    produce(kafka_conf, topics.spans, [(e.rollout_id, codec.encode(e)) for e in events])
    # Agent Lightning trains on the final reward alone: our automatic rules are off by default, and a
    # mid-run emit_reward, which adds to the return by default, is turned off too (see README's differences).
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"explicit_scale": 0}))
    proc = start_worker(test_env, "--group-size", "2", "--credit", "identical", "--reward-rules", str(rules),
                        "--rollout-timeout", "4")
    got = batches(kafka_conf, topics.batches, 1, proc, timeout=90)
    rc, log = stop_worker(proc)
    assert rc == 0 and len(got) == 1, log[-3000:]

    # The group: rewards from the reward spans, advantages (R - mean) / (std + eps) = +1 / -1, on every step.
    batch = got[0]
    assert batch.group_id == "agl-task@None" and batch.complete and not batch.zero_variance
    assert dict(zip(batch.rollout_ids, batch.rewards)) == {rid_a: 1.0, rid_b: 0.0}
    assert dict(zip(batch.rollout_ids, batch.advantages)) == pytest.approx({rid_a: 1.0, rid_b: -1.0}, abs=1e-5)
    per = sorted((t.rollout_id, round(t.advantage, 4)) for t in batch.transitions)
    assert per == [(rid_a, 1.0)] * 3 + [(rid_b, -1.0)] * 3, "each rollout's advantage on each of its steps"

    rows = query(test_env, {
        "tr": ("SELECT t.turn, t.prompt_token_ids, t.response_token_ids, t.return_, t.trained, s.attributes['gen_ai.response.id'], "
               "t.advantage FROM transitions AS t FINAL JOIN spans AS s FINAL ON s.span_id = t.span_id AND s.rollout_id = t.rollout_id "
               f"WHERE t.rollout_id = '{rid_a}' ORDER BY t.turn"),
        "ro": "SELECT rollout_id, status, final_reward, metadata['rolloutbus.final_reward_span'] != '' FROM rollouts FINAL ORDER BY rollout_id",
    })
    assert rows["ro"] == [[rid_a, "succeeded", 1.0, 1], [rid_b, "timed_out", 0.0, 1]]
    tr = rows["tr"]
    ours = [{"prompt": r[1], "response": r[2], "response_id": r[5]} for r in tr]
    theirs = [{k: t[k] for k in ("prompt", "response", "response_id")} for t in al["triplets"]]
    assert ours == theirs, "prompt ids, response ids and response ids, step for step"
    # --credit identical: every step is trained on the final reward, Agent Lightning's trajectory reward
    # (its adapter puts it on the last triplet; its trainer gives it to the whole trajectory).
    assert [r[3] for r in tr] == [al["final_reward"]] * 3 == [al["triplets"][-1]["reward"]] * 3
    assert all(r[4] for r in tr) and [r[6] for r in tr] == pytest.approx([1.0] * 3, abs=1e-5)
