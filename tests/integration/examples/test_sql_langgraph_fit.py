"""``Trainer.fit`` end to end on the write-ups' LangGraph SQL agent (examples/sql_langgraph/train_sql_agent.py,
the project's tiny policy for speed): the real broker, the stream worker, the policy server, the proxy, the
trainer and the runners, all started by ``fit``; every LLM call lands in the real ClickHouse engine with its
LangGraph node as the agent; with ``agent_match="write|rewrite"`` check_query's calls are stored but are not
transitions the trainer may use (``trained`` false), write_query's and rewrite_query's are."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.installs import installed

from tests.conftest import free_port_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600),
              pytest.mark.skipif(bool(os.environ.get("ROLLOUTBUS_KAFKA_BOOTSTRAP")), reason="fit runs on the local stack only")]
ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "examples" / "sql_langgraph" / "train_sql_agent.py"


def test_fit_trains_write_and_rewrite_only(tmp_path: Path) -> None:
    installed("langgraph", "pip install -e '.[test]' (the SQL example's agent)")
    kafka_port = free_port_run((0, 1))  # the broker and, at + 1, its controller
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"), ROLLOUTBUS_KAFKA_PORT=str(kafka_port), PYTHONUNBUFFERED="1",
               ROLLOUTBUS_STORE_PORT=str(free_port_run()))
    env.pop("ROLLOUTBUS_CLICKHOUSE_DSN", None)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--minutes", "1.5", "--runners", "4", "--train", "8", "--validation", "4", "--held-out", "3",
                           "--max-turns", "2", "--truncate-length", "80", "--max-tokens", "8", "--out", str(out), "--keep-store"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=540)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted((out / "logs").glob("*.log"))) \
        if (out / "logs").exists() else ""
    try:
        assert proc.returncode == 0, f"fit failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{logs}"
        assert "started    stream processor" in proc.stdout and "done " in proc.stdout, proc.stdout
        assert "validate   v0 " in proc.stdout, proc.stdout  # the first version scored on the validation tasks
        # test_dataset: version 0 and the version kept answered the same 3 tasks afterwards, paired
        assert "held-out   v0 " in proc.stdout and "on 3 tasks (" in proc.stdout, proc.stdout
        assert "held-out   databases never trained on (2): " in proc.stdout, proc.stdout

        run = re.search(r"^run        (\w+): ", proc.stdout, re.M)
        assert run, proc.stdout  # fit's own namespace: `rolloutbus query --run RUN` reads it

        def query(sql: str) -> list[list[str]]:
            q = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "query", "--run", run.group(1), "--format", "TabSeparated",
                                sql], env=env,
                               capture_output=True, text=True, timeout=120)
            assert q.returncode == 0, q.stderr
            return [line.split("\t") for line in q.stdout.splitlines() if line]

        # Every LLM span came through the proxy (token ids) and names its node.
        spans = dict(query("SELECT agent_name, count() FROM spans FINAL WHERE kind = 'llm' GROUP BY agent_name"))
        assert {"write_query", "check_query"} <= set(spans), f"{spans}\n{logs}"
        tools = query("SELECT name, count() FROM spans FINAL WHERE kind = 'tool' GROUP BY name")
        assert [t[0] for t in tools] == ["sql_db_query"], tools  # execute_query's LangChain tool, recorded by the tracer
        steps = {(a, t): int(n) for a, t, n in query(
            "SELECT agent_name, toString(trained), count() FROM transitions FINAL GROUP BY agent_name, trained")}
        assert steps.get(("check_query", "true"), 0) == 0, steps
        assert steps.get(("check_query", "false"), 0) > 0, steps  # stored, for analysis
        assert steps.get(("write_query", "true"), 0) > 0, steps
        assert all(t == "false" for (a, t) in steps if not a.startswith(("write", "rewrite"))), steps
        held = query("SELECT count(DISTINCT task_id), countIf(mode != 'test') FROM rollouts FINAL WHERE task_id LIKE 'heldout-%'")
        assert held == [["3", "0"]], held  # recorded as test rollouts, never trained on
        tokens = query("SELECT min(length(prompt_token_ids)), min(length(response_token_ids)) FROM transitions FINAL "
                       "WHERE agent_name = 'write_query'")
        assert int(tokens[0][0]) > 0 and int(tokens[0][1]) > 0, tokens
    finally:
        subprocess.run([sys.executable, "-m", "rolloutbus.cli", "down"], env=env, capture_output=True, timeout=120)
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", kafka_port)) != 0, "fit left its broker running"
