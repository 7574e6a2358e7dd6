"""Real instrumentation, no hand-made spans: the official ``openai`` client, instrumented by the
OpenTelemetry GenAI instrumentation from PyPI (``opentelemetry-instrumentation-openai-v2``), calls
``rolloutbus serve`` through ``rolloutbus proxy`` inside a rollout and exports OTLP to the gateway.

Each call is then seen twice: the instrumentation's ``chat <model>`` span (``gen_ai.*``, no token ids,
through the gateway) and the proxy's span (token ids and logprobs, straight to Kafka). Both carry the
same response id; the trajectory in ClickHouse has one step per call, with the proxy's token ids.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from producers_testkit import consume_all
from schemas.codec import unpack_tokens
from test_gateway_otlp import gateway  # noqa: F401 - the fixture
from tests.integration.streams.helpers import batches, query, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[3]
CALLS = 3

# The agent as a user writes it: stock OTel SDK + exporter, the instrumentation from PyPI, the official
# client; rolloutbus gives it the rollout (ids stamped on every span it starts) and the proxy's base URL.
AGENT = """
import json, sys
from openai import OpenAI
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from producers import get_transport, rollout
from producers.otel import RolloutSpanProcessor
from producers.proxy import proxy_headers, proxy_url

gateway, proxy, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
provider = TracerProvider(resource=Resource.create({"service.name": "openai-agent"}))
provider.add_span_processor(RolloutSpanProcessor(export=False))  # attribution only; OTLP does the export
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=gateway + "/v1/traces",
                                                                headers={"Authorization": "Bearer s3cret"})))
OpenAIInstrumentor().instrument(tracer_provider=provider)

answers = []
with rollout("task-oa", rollout_id="ro-oa", attempt_id="at-oa") as r:
    client = OpenAI(base_url=proxy_url(proxy), api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Count: 1 2 3"}]
    for _ in range(calls):
        resp = client.chat.completions.create(model="policy", messages=messages, max_tokens=6, temperature=1.0,
                                              extra_headers=proxy_headers())
        answers.append({"id": resp.id, "text": resp.choices[0].message.content})
        messages += [{"role": "assistant", "content": resp.choices[0].message.content},
                     {"role": "user", "content": "go on"}]
    r.set_reward(1.0)
provider.shutdown()
get_transport().flush(30)
print(json.dumps(answers))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(cmd: list[str], env: dict[str, str], health: str, procs: list[subprocess.Popen[str]], timeout: float = 120) -> None:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{cmd[2]} exited: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        try:
            requests.get(health, timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.3)
    pytest.fail(f"{cmd[2]} did not come up at {health} within {timeout:.0f}s")


@pytest.fixture
def served(test_env: dict[str, str]) -> Any:
    """``rolloutbus serve --model tiny`` and ``rolloutbus proxy`` in front of it; yields the proxy's URL."""
    try:
        import opentelemetry.instrumentation.openai_v2  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"this test needs opentelemetry-instrumentation-openai-v2 (pip install -e '.[test]'): {exc}")
    env = {**test_env, "PYTHONPATH": str(REPO), "ROLLOUTBUS_TORCH_THREADS": "1"}
    serve_port, proxy_port = _port(), _port()
    procs: list[subprocess.Popen[str]] = []
    try:
        _start([sys.executable, "-m", "trainer.serve_cli", "--model", "tiny", "--port", str(serve_port), "--no-follow"],
               env, f"http://127.0.0.1:{serve_port}/v1/models", procs)
        _start([sys.executable, "-m", "producers.ingest.llm_proxy_cli", "--upstream", f"http://127.0.0.1:{serve_port}/v1",
                "--port", str(proxy_port)], env, f"http://127.0.0.1:{proxy_port}/healthz", procs)
        yield f"http://127.0.0.1:{proxy_port}"
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_agent(source: str, gateway_url: str, proxy: str, test_env: dict[str, str]) -> list[dict[str, str]]:
    """Run an agent script (``argv``: gateway URL, proxy URL, number of calls); its answers, one per call."""
    run = subprocess.run([sys.executable, "-c", source, gateway_url, proxy, str(CALLS)],
                         env={**test_env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    answers: list[dict[str, str]] = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(answers) == CALLS and len({a["id"] for a in answers}) == CALLS, answers
    return answers


def check_one_step_per_call(answers: list[dict[str, str]], rollout_id: str, attempt_id: str, service: str,
                            kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str]) -> None:
    """What a user sees of an instrumented agent's calls through the proxy: on ``rb.spans`` two views of
    each call (the instrumentation's ``gen_ai`` span from ``service``, the proxy's with token ids), and in
    ClickHouse one step per call carrying the proxy's token ids."""
    # On rb.spans: per call, the instrumentation's span (via the gateway) and the proxy's (with token ids).
    records = consume_all(kafka_conf, topics.spans, expect=2 * CALLS + 2, timeout=30)
    spans = [r for _k, name, r, _p in records if name.endswith("Span")]
    instrumented = [s for s in spans if s["resource"].get("service.name") == service]
    proxied = [s for s in spans if s["resource"].get("service.name") == "rolloutbus-proxy"]
    assert len(instrumented) == len(proxied) == CALLS, [(s["name"], s["resource"]) for s in spans]
    for s in instrumented:
        assert s["kind"] == "llm" and s["name"] == "chat policy" and s["attributes"]["gen_ai.operation.name"] == "chat"
        assert (s["rollout_id"], s["attempt_id"]) == (rollout_id, attempt_id)
        assert unpack_tokens(s["llm"]["response_token_ids"]) == [], "the instrumentation knows no token ids"
    assert [s["llm"]["request_id"] for s in instrumented] == [a["id"] for a in answers]
    assert [s["llm"]["request_id"] for s in proxied] == [a["id"] for a in answers], "the same call, by response id"
    assert all(unpack_tokens(s["llm"]["response_token_ids"]) for s in proxied)
    assert len({s["sequence_id"] for s in spans}) == len(spans) == 2 * CALLS, "one sequence counter for both producers"

    proc = start_worker(test_env, "--group-size", "1")
    got = batches(kafka_conf, topics.batches, 1, proc)
    rc, log = stop_worker(proc)
    assert rc == 0 and len(got) == 1, log[-3000:]

    rows = query(test_env, {
        "tr": ("SELECT t.turn, t.span_id, t.prompt_token_ids, t.response_token_ids, t.trained FROM transitions AS t FINAL "
               f"WHERE t.rollout_id = '{rollout_id}' ORDER BY t.turn"),
        "llm_spans": f"SELECT count() FROM spans FINAL WHERE rollout_id = '{rollout_id}' AND kind = 'llm'",
        "ro": f"SELECT status, final_reward FROM rollouts FINAL WHERE rollout_id = '{rollout_id}'",
    })
    assert rows["llm_spans"] == [[2 * CALLS]], "both views of every call are kept as spans"
    tr = rows["tr"]
    assert [r[0] for r in tr] == list(range(CALLS)), "one step per call, not two"
    by_id = {s["span_id"]: s for s in proxied}
    for r in tr:
        # The step carries the proxy's token ids (the instrumentation's span has none to give).
        px = by_id.get(r[1]) or next(s for s in proxied if unpack_tokens(s["llm"]["response_token_ids"]) == r[3])
        assert r[2] == unpack_tokens(px["llm"]["prompt_token_ids"]) and r[3] == unpack_tokens(px["llm"]["response_token_ids"])
        assert r[4]
    assert [len(r[2]) for r in tr] == sorted(len(r[2]) for r in tr) and len(tr[0][2]) < len(tr[-1][2]), "the prompt grows"
    assert rows["ro"][0][1] == 1.0


def test_instrumented_openai_client_through_proxy_is_one_step_per_call(
    served: str, gateway: Any, kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str]  # noqa: F811
) -> None:
    base, _ = gateway
    answers = run_agent(AGENT, base, served, test_env)
    check_one_step_per_call(answers, "ro-oa", "at-oa", "openai-agent", kafka_conf, topics, test_env)
