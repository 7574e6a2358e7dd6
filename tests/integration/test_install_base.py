"""The base install, as an agent author gets it: `pip install <this repo>` into a clean virtualenv resolves
the base dependencies only (no torch, chDB, faust, transformers, matplotlib), and an agent in it emits
spans — `emit_*` inside a rollout, the LitAgent API and the OpenTelemetry span processor — onto the
real broker, where they decode as ours. Every module of the agent library (`producers.*`, the LLM proxy's
client side included) imports there without loading the ingest service (`producers.ingest`), which needs
its extra. The `rolloutbus` command works there for what the base carries and names the extra for the rest.

pip resolves against PyPI through pip's own cache (the wheels are small: about 15 MB in all), so
this takes a minute or two; it is marked slow (out of the quick loop) but runs in `make test`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "foundation", "rolloutbus", "producers", "streams", "schemas", "trainer"]
HEAVY = ["torch", "chdb", "faust", "transformers", "matplotlib", "aiohttp", "clickhouse_connect", "prometheus_client",
         "opentelemetry.exporter.otlp"]

AGENT = r'''
import importlib.util, json
from opentelemetry.sdk.trace import TracerProvider
from producers import emit_llm_call, emit_message, emit_reward, emit_tool_call, get_transport, rollout
from rolloutbus import LitAgent
from producers.otel import RolloutSpanProcessor

provider = TracerProvider()
provider.add_span_processor(RolloutSpanProcessor())
tracer = provider.get_tracer("base-install-agent")

with rollout(task_id="task-base-install", agent_name="base") as ctx:
    emit_message("what is 2+2?", role="user")
    emit_llm_call([1, 2, 3], [4, 5], [-0.1, -0.2])
    emit_tool_call("calc", arguments="2+2", result="4")
    with tracer.start_as_current_span("otel-step"):
        pass
    emit_reward(1.0)


class Agent(LitAgent):
    def rollout(self, task, resources, rollout):
        emit_tool_call("calc", arguments=task, result="4")
        return 1.0


result = Agent().run("2+2", task_id="task-litagent")

# The whole agent library imports on the base install; none of it loads the ingest service, which needs its extra.
import importlib, pkgutil, sys
import producers

agent_modules = sorted(m.name for m in pkgutil.iter_modules(producers.__path__, "producers.") if not m.ispkg)
for name in agent_modules:
    importlib.import_module(name)
ingest_loaded = sorted(m for m in sys.modules if m.startswith("producers.ingest"))
from producers.proxy import proxy_headers, proxy_url

with rollout(task_id="task-proxy-client") as pctx:
    proxied = [proxy_url("http://proxy:8788"), proxy_headers()]
try:
    import producers.ingest.gateway
    ingest_needs = None
except ModuleNotFoundError as exc:
    ingest_needs = exc.name
pending = get_transport().flush(30)


def present(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


heavy = [m for m in HEAVY if present(m)]
print(json.dumps({"rollouts": [ctx.rollout_id, result.rollout_id], "pending": pending, "heavy": heavy,
                  "agent_modules": agent_modules, "ingest_loaded": ingest_loaded, "ingest_needs": ingest_needs,
                  "proxied": proxied, "proxied_ids": [pctx.rollout_id, pctx.attempt_id]}))
'''


def _copy_sources(dest: Path) -> None:
    """The working tree's files of the package (tracked and new, not ignored): what `pip install .` would see."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *SOURCES], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file() and "__pycache__" not in name:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _consume(bootstrap: str, topic: str, rollout_ids: set[str], timeout: float = 60.0) -> list[Any]:
    from confluent_kafka import Consumer

    from schemas.codec import decode

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"base-install-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    records: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                if records and {r.rollout_id for r in records} >= rollout_ids and any(
                        getattr(r, "event", None) == "FINISHED" for r in records):
                    break
                continue
            records.append(decode(msg.value()))
    finally:
        consumer.close()
    return [r for r in records if r.rollout_id in rollout_ids]


def test_the_base_install_emits_spans_without_the_heavy_stack(tmp_path: Path, kafka_bootstrap: str, topics: Any) -> None:
    src, venv = tmp_path / "src", tmp_path / "venv"
    _copy_sources(src)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python, rolloutbus = venv / "bin" / "python", venv / "bin" / "rolloutbus"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUTBUS_", "PYTHON", "VIRTUAL_ENV"))}
    started = time.monotonic()
    # A real install: pip resolves the base dependencies from the index (pip's cache serves repeats).
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=480)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    installed = json.loads(subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], env=env,
                                          capture_output=True, text=True, check=True).stdout)
    names = {p["name"].lower().replace("_", "-") for p in installed}
    assert {"rolloutbus", "confluent-kafka", "fastavro", "pydantic", "pydantic-settings", "opentelemetry-sdk"} <= names
    assert not names & {"torch", "chdb", "faust-streaming", "transformers", "matplotlib", "aiohttp", "clickhouse-connect",
                        "opentelemetry-exporter-otlp", "nvidia-cublas-cu12"}, sorted(names)
    print(f"base install: {len(names)} packages in {time.monotonic() - started:.0f}s")

    env.update(ROLLOUTBUS_KAFKA_BOOTSTRAP=kafka_bootstrap, ROLLOUTBUS_TOPIC_PREFIX=topics.prefix,
               ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"))
    script = tmp_path / "agent.py"
    script.write_text(f"HEAVY = {HEAVY!r}\n" + AGENT)
    r = subprocess.run([str(python), str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [] and out["pending"] == 0, out
    # The agent library, every module of it, without the ingest service; the service needs the gateway extra.
    assert {"producers.context", "producers.emit", "producers.litagent", "producers.otel", "producers.proxy",
            "producers.runner", "producers.spool", "producers.transport"} <= set(out["agent_modules"]), out["agent_modules"]
    assert out["ingest_loaded"] == [] and out["ingest_needs"] == "aiohttp", out
    (url, headers), (rid, aid) = out["proxied"], out["proxied_ids"]
    assert url == f"http://proxy:8788/rollout/{rid}/attempt/{aid}/v1" and headers == {"x-rolloutbus-sequence-id": "1"}, out

    records = _consume(kafka_bootstrap, topics.spans, set(out["rollouts"]))
    first, second = out["rollouts"]
    spans = [r for r in records if r.rollout_id == first and hasattr(r, "kind")]
    assert [s.kind for s in sorted(spans, key=lambda s: s.sequence_id)] == ["message", "llm", "tool", "span", "reward"], spans
    assert [s.sequence_id for s in sorted(spans, key=lambda s: s.sequence_id)] == [1, 2, 3, 4, 5]
    assert any(r.rollout_id == second and getattr(r, "kind", None) == "tool" for r in records)
    finished = [r for r in records if getattr(r, "event", None) == "FINISHED"]
    assert {r.rollout_id for r in finished} == {first, second}

    # The command: what the base carries runs; the rest names its extra, in one line.
    r = subprocess.run([str(rolloutbus), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "process" in r.stdout, r.stderr
    for command, extra in (("process", "streams"), ("train", "trainer"), ("query", "query"), ("gateway", "gateway"),
                           ("store", "store"), ("demo", "all")):
        argv = [command, "SELECT 1"] if command == "query" else [command]
        r = subprocess.run([str(rolloutbus), *argv], env=env, capture_output=True, text=True, timeout=60)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and f"pip install -e '.[{extra}]' in a rolloutbus checkout" in lines[0], (command, r.stderr[-2000:])
    r = subprocess.run([str(rolloutbus), "status"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"{topics.prefix}spans" in r.stdout, r.stdout + r.stderr
