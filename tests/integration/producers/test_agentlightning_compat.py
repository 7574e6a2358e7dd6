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


def test_agent_lightning_agent_through_gateway_matches_its_own_adapter(
    al_python: Path, gateway: Any, kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str], tmp_path: Path  # noqa: F811
) -> None:
    base, _ = gateway
    rollout_id, attempt_id = "ro-agl", "at-agl-1"
    out = tmp_path / "al.json"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}, **ENV,
           "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20s3cret"}
    run = subprocess.run([str(al_python), str(DRIVER), f"{base}/v1/traces", rollout_id, attempt_id, str(out)],
                         env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0 and out.exists(), run.stderr[-3000:]
    al = json.loads(out.read_text())
    assert len(al["triplets"]) == 3, "the agent makes 3 policy calls (a duplicate export and a judge call aside)"

    spans = consume_all(kafka_conf, topics.spans, expect=al["spans"], timeout=30)
    assert len(spans) == al["spans"], "every span Agent Lightning's exporter sent is on rb.spans"
    assert {(k, r["rollout_id"], r["attempt_id"]) for k, _n, r, _p in spans} == {(rollout_id.encode(), rollout_id, attempt_id)}
    kinds = sorted(r["kind"] for _k, _n, r, _p in spans)
    assert kinds.count("llm") == 5 and kinds.count("reward") == 2 and {"message", "object", "exception"} <= set(kinds)

    # What our runner sends when the agent returns: FINISHED with the final reward and the span count.
    finished = RolloutEvent(rollout_id=rollout_id, attempt_id=attempt_id, event="FINISHED", time_ns=time.time_ns(),
                            task_id="agl-task", status="succeeded", final_reward=al["final_reward"], span_count=len(spans))
    produce(kafka_conf, topics.spans, [(rollout_id, codec.encode(finished))])
    # Agent Lightning has no intermediate rewards from runtime signals: turn ours off (by default an
    # exception span costs -0.2 and a mid-run emit_reward adds to the return; see README's differences).
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"tool_failed": 0, "exception": 0, "validator_pass": 0, "validator_fail": 0,
                                 "explicit_scale": 0}))
    proc = start_worker(test_env, "--group-size", "1", "--credit", "identical", "--reward-rules", str(rules))
    got = batches(kafka_conf, topics.batches, 1, proc)
    rc, log = stop_worker(proc)
    assert rc == 0 and len(got) == 1, log[-3000:]

    rows = query(test_env, {"tr": (
        "SELECT t.turn, t.prompt_token_ids, t.response_token_ids, t.return_, t.trained, s.attributes['gen_ai.response.id'] "
        "FROM transitions AS t FINAL JOIN spans AS s FINAL ON s.span_id = t.span_id AND s.rollout_id = t.rollout_id "
        "ORDER BY t.turn")})["tr"]
    ours = [{"prompt": r[1], "response": r[2], "response_id": r[5]} for r in rows]
    theirs = [{k: t[k] for k in ("prompt", "response", "response_id")} for t in al["triplets"]]
    assert ours == theirs, "prompt ids, response ids and response ids, step for step"
    # --credit identical: every step is trained on the final reward, Agent Lightning's trajectory reward
    # (its adapter puts it on the last triplet; its trainer gives it to the whole trajectory).
    assert [r[3] for r in rows] == [al["final_reward"]] * 3 == [al["triplets"][-1]["reward"]] * 3
    assert all(r[4] for r in rows)
