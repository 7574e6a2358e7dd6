"""The dashboard in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, `make browser-deps`),
over a real pipeline: rollouts, trainer steps and a bad record go through the real broker and a real stream
worker into a real ``rolloutbus store``; ``rolloutbus dashboard`` reads them over HTTP as any process would.

What a user would see is asserted: the charts have data points, a known rollout's timeline shows its turns,
its tool call, its rewards, returns and advantages, the SQL box returns rows and refuses a write with the
server's error, and a wrong token gets 401. ``ROLLOUTBUS_DASHBOARD_SCREENSHOT=path.png`` keeps a screenshot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.installs import missing
import requests

from schemas import codec
from schemas.models import LLMCall, Reward, ResourceVersion, RolloutEvent, Span, ToolCall, TrainStep
from tests.integration.store.conftest import REPO, Store, free_port, start_store
from tests.integration.streams.helpers import LIVE, WorkerProc, produce, start_worker, stop_worker

pytestmark = pytest.mark.integration

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN, ANALYST_PW = "dash-token-7", "analyst-pw-3"
KNOWN = "ro-dash-5"


def calc_rollout(i: int, version: int, mode: str = "train") -> list[tuple[str, bytes]]:
    """A calculator agent's rollout as its spans arrive on rb.spans: two LLM turns, a tool call, a reward."""
    rid, att = f"ro-dash-{i}" if mode == "train" else f"ro-eval-{i}", f"at-{i}"
    a, b = i % 5 + 2, 3
    right = i % 2 == 1 or (version == 2 and i % 4 == 2)  # version 2 does better than version 1
    answer = a + b if right else a * b
    now = time.time_ns()
    texts = [(f"question: {a} {b} gain", f"calc {a}+{b}" if right else f"calc {a}*{b}"),
             (f"question: {a} {b} gain\nresult: {answer}", f"answer {answer}")]
    spans: list[Span] = []
    seq = 0
    for turn, (prompt, completion) in enumerate(texts):
        seq += 1
        spans.append(Span(span_id=f"{rid}-s{seq}", trace_id="b" * 32, rollout_id=rid, attempt_id=att, sequence_id=seq,
                          name="chat.completions", kind="llm", start_time_ns=now + seq, end_time_ns=now + seq + 5_000_000,
                          agent_name="calc-agent", attributes={"gen_ai.prompt": prompt, "gen_ai.completion": completion},
                          llm=LLMCall(prompt_token_ids=list(range(10 + turn)), response_token_ids=[5, 6, 7],
                                      response_logprobs=[-0.5, -0.25, -0.125], resource_version=version)))
        if turn == 0:
            seq += 1
            spans.append(Span(span_id=f"{rid}-s{seq}", trace_id="b" * 32, rollout_id=rid, attempt_id=att, sequence_id=seq,
                              name="tool", kind="tool", start_time_ns=now + seq, end_time_ns=now + seq + 1000, agent_name="calc-agent",
                              tool=ToolCall(name="calculator", arguments=f"{a}+{b}" if right else f"{a}*{b}", result=str(answer))))
    seq += 1
    reward = 1.0 if right else 0.0
    spans.append(Span(span_id=f"{rid}-s{seq}", trace_id="b" * 32, rollout_id=rid, attempt_id=att, sequence_id=seq,
                      name="reward", kind="reward", start_time_ns=now + seq, end_time_ns=now + seq,
                      reward=Reward(value=reward, dimensions={"accuracy": reward, "format": 1.0}, primary="accuracy")))
    ev = RolloutEvent(rollout_id=rid, attempt_id=att, event="FINISHED", time_ns=time.time_ns(), task_id=f"task-{i // 2}" if mode == "train" else f"heldout-{i}",
                      mode=mode, resource_version=version, status="succeeded", final_reward=reward, span_count=seq)
    return [(rid, codec.encode(s)) for s in spans] + [(rid, codec.encode(ev))]


def trainer_records(steps: int) -> list[tuple[str, bytes]]:
    out = []
    for step in range(1, steps + 1):
        now = time.time_ns()
        out.append(("run-1", codec.encode(TrainStep(run_id="run-1", step=step, time_ns=now, resource_version=step, group_ids=[f"g{step}"],
                                                    metrics={"loss": 0.1 / step, "kl": 0.01 * step, "clip_fraction": 0.02,
                                                             "reward_mean": 0.25 * step, "tokens_per_s": 100.0 + step}))))
    return out


def ch_count(store: Store, sql: str) -> int:
    r = requests.post(store.url, params={"database": "rolloutbus"}, data=sql.encode(), timeout=30)
    if r.status_code != 200:
        return -1  # not migrated yet
    return int(r.text.strip() or 0)


def wait_for(store: Store, sql: str, want: int, worker: WorkerProc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (n := ch_count(store, sql)) < want:
        assert worker.poll() is None, worker.output()[-3000:]
        assert time.monotonic() < deadline, f"{sql} = {n}, wanted {want}; worker:\n{worker.output()[-3000:]}"
        time.sleep(0.3)


@pytest.fixture
def pipeline(tmp_path: Path, kafka_conf: dict[str, Any], topics: Any, test_env: dict[str, str]) -> Iterator[tuple[Store, dict[str, str]]]:
    """A store with a writer and an analyst, a worker writing through it, and a small run's records in it."""
    store = start_store(tmp_path / "store", ROLLOUTBUS_STORE_USERS=f"default:writer:,analyst:analyst:{ANALYST_PW}")
    env = {**test_env, "ROLLOUTBUS_CLICKHOUSE_DSN": store.url}
    worker = start_worker(env, "--group-size", "2", "--credit", "discounted", "--gamma", "1.0")
    try:
        # Two waves a few seconds apart (two versions), held-out rollouts, the trainer's records, one bad record.
        produce(kafka_conf, topics.spans, [kv for i in range(4) for kv in calc_rollout(i, 1)])
        produce(kafka_conf, topics.metrics, trainer_records(3))
        produce(kafka_conf, topics.resources, [("policy", codec.encode(ResourceVersion(name="policy", version=v, created_ns=time.time_ns())))
                                               for v in (1, 2)])
        wait_for(store, "SELECT count() FROM rollouts FINAL", 4, worker)
        time.sleep(5.5)  # the second wave lands in a later time bucket
        produce(kafka_conf, topics.spans, [kv for i in range(4, 8) for kv in calc_rollout(i, 2)]
                + [kv for i in range(2) for kv in calc_rollout(i, 2, mode="test")] + [("junk", b"\x00not avro")])
        wait_for(store, "SELECT count() FROM rollouts FINAL", 10, worker)
        wait_for(store, "SELECT count() FROM transitions FINAL WHERE rollout_id = 'ro-dash-5' AND advantage != 0", 2, worker)
        wait_for(store, "SELECT count() FROM train_steps FINAL", 3, worker)
        wait_for(store, "SELECT count() FROM dead_letters FINAL", 1, worker)
        yield store, env
    finally:
        stop_worker(worker)
        store.proc.terminate()
        store.proc.wait(20)


def serve_until_healthy(args: list[str], env: dict[str, str], url: str) -> WorkerProc:
    proc = WorkerProc([sys.executable, "-m", "rolloutbus.cli", *args], env)
    LIVE.add(proc)
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.output()[-3000:]
        try:
            if requests.get(url + "/healthz", timeout=2).ok:
                return proc
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, proc.output()[-3000:]
        time.sleep(0.2)


@pytest.fixture
def gateway(pipeline: tuple[Store, dict[str, str]]) -> Iterator[str]:
    """A real OTLP gateway that has answered one good request (200) and two bad ones (400, 401)."""
    _, env = pipeline
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve_until_healthy(["gateway", "--port", str(port)], {**env, "ROLLOUTBUS_GATEWAY_TOKEN": "gw-token",
                                                                 "PYTHONPATH": str(REPO)}, url)
    auth = {"Authorization": "Bearer gw-token", "Content-Type": "application/x-protobuf"}
    try:
        assert requests.post(url + "/v1/traces", data=b"", headers=auth, timeout=10).status_code == 200  # no spans: fine
        assert requests.post(url + "/v1/traces", data=b"\xff\xff", headers=auth, timeout=10).status_code == 400
        assert requests.post(url + "/v1/traces", data=b"", headers={"Content-Type": "application/x-protobuf"}, timeout=10).status_code == 401
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture
def dashboard(pipeline: tuple[Store, dict[str, str]], gateway: str, tmp_path: Path) -> Iterator[str]:
    store, env = pipeline
    port = free_port()
    env = {**env, "ROLLOUTBUS_DASHBOARD_TOKEN": TOKEN, "ROLLOUTBUS_DASHBOARD_ANALYST_PASSWORD": ANALYST_PW,
           "ROLLOUTBUS_DASHBOARD_SCRAPE": gateway + "/metrics", "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", "")}
    url = f"http://127.0.0.1:{port}"
    proc = serve_until_healthy(["dashboard", "--port", str(port), "--refresh", "1", "--analyst-user", "analyst"], env, url)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture
def browser() -> Iterator[Any]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        missing("Debian's chromium and chromium-driver", "make browser-deps")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1500,2400"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_js(driver: Any, script: str, timeout: float = 30) -> Any:
    """Poll a JavaScript expression until it is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script("return " + script)
        if value:
            return value
        if time.monotonic() > deadline:
            status = driver.execute_script("return document.getElementById('status').textContent")
            raise AssertionError(f"{script} stayed {value!r} for {timeout}s; page status: {status}")
        time.sleep(0.2)


def test_the_dashboard_shows_a_real_run(dashboard: str, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    # A wrong or missing token gets 401, from the API and in the page.
    assert requests.get(dashboard + "/api/learning", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    assert requests.get(dashboard + "/api/rollouts", timeout=10).status_code == 401
    browser.get(dashboard + "/#token=wrong")
    assert "401" in wait_js(browser, "!document.getElementById('auth').hidden && document.getElementById('auth-message').textContent")

    browser.execute_script("sessionStorage.clear()")
    browser.get(dashboard + "/#token=" + TOKEN)
    wait_js(browser, "document.body.dataset.refreshed")
    # The charts have data points (counted by the page from what it gave uPlot), and uPlot drew them.
    charts = ["chart-by-version", "chart-over-time", "chart-loss", "chart-tps", "chart-rollouts", "chart-spans", "chart-latency", "chart-dlq"]
    for cid in charts:
        wait_js(browser, f"+document.getElementById('{cid}').dataset.points > 0 && window.rbCharts['{cid}']")
    by_version = browser.execute_script("return window.rbCharts['chart-by-version'].data")
    assert by_version[0] == [1, 2]  # train versions 1 and 2 (test rollouts at version 2)
    series = browser.execute_script("return window.rbCharts['chart-by-version'].series.map(s => s.label)")
    assert "train reward" in series and "test reward" in series
    assert by_version[series.index("train reward")] == pytest.approx([0.5, 0.75])  # the mean reward each version got
    loss = browser.execute_script("return window.rbCharts['chart-loss'].data")
    assert loss[0] == [1, 2, 3] and loss[1] == pytest.approx([0.1, 0.05, 0.1 / 3])
    over_time = browser.execute_script("return window.rbCharts['chart-over-time'].data")
    assert len(over_time[0]) >= 2, over_time  # two waves, two time buckets
    assert browser.find_elements(By.CSS_SELECTOR, "#dlq-table tbody tr"), browser.find_element(By.ID, "dlq-table").text
    assert browser.find_elements(By.CSS_SELECTOR, "#versions-now tbody tr"), browser.find_element(By.ID, "versions-now").text
    # Lag per consumer group and partition; the gateway's requests by status and its spool, from its /metrics.
    lag_head = browser.execute_script("return [...document.querySelectorAll('#lag-table th')].map(e => e.textContent)")
    assert lag_head == ["group", "topic", "partition", "lag"], browser.find_element(By.ID, "lag-table").text
    assert browser.find_elements(By.CSS_SELECTOR, "#lag-table tbody tr"), browser.find_element(By.ID, "lag-table").text
    gw = wait_js(browser, "document.querySelector('#producers-table tbody tr') && "
                          "[...document.querySelectorAll('#producers-table tbody tr td')].map(e => e.textContent)")
    head = browser.execute_script("return [...document.querySelectorAll('#producers-table th')].map(e => e.textContent)")
    row = dict(zip(head, gw))
    assert row["target"].endswith("/metrics") and row["2xx"] == "1" and row["4xx"] == "2" and row["503"] == "0", row
    assert row["spool depth"] == "0" and row["kafka up"] == "1", row

    # A known rollout, found by search and opened: its turns' text, its tool call, its rewards, returns and advantages.
    box = browser.find_element(By.CSS_SELECTOR, "#filters input[name=q]")
    box.clear()
    box.send_keys(KNOWN)
    browser.find_element(By.CSS_SELECTOR, "#filters button").click()
    wait_js(browser, f"document.querySelectorAll('#rollout-list tr.pick').length == 1 && "
                     f"document.querySelector('#rollout-list tr[data-rollout=\"{KNOWN}\"]')")
    # The list refreshes itself every second: click from inside the page, where the row cannot go stale.
    browser.execute_script(f"document.querySelector('#rollout-list tr[data-rollout=\"{KNOWN}\"]').click()")
    wait_js(browser, "document.getElementById('timeline')")
    view = browser.find_element(By.ID, "rollout-view").text
    for text in ("question: 2 3 gain", "calc 2+3", "answer 5", "calculator(2+3) → 5", "final reward 1", "reward 1 (accuracy=1, format=1)",
                 "return 1", "GRPO group task-2@2", "ro-dash-4: reward 0, advantage -1", "agent calc-agent", "prompt 10 tokens → response 3 tokens"):
        assert text in view, f"{text!r} not in the timeline:\n{view}"
    chips = browser.execute_script("return [...document.querySelectorAll('#timeline .span[data-seq=\"1\"] .tokens .tok')].map(e => e.textContent)")
    assert chips == ["5 -0.5", "6 -0.25", "7 -0.125"], chips  # each response token's id and log-probability
    kinds = browser.execute_script("return [...document.querySelectorAll('#timeline .span')].map(e => e.className + ' #' + e.dataset.seq)")
    assert kinds == ["span llm #1", "span tool #2", "span llm #3", "span reward #4"], kinds
    # In a group of two with rewards 0 and 1 the winner's advantage is positive, at every step.
    advantages = browser.execute_script("return [...document.querySelectorAll('#timeline .step b')].map(e => e.textContent)")
    assert advantages[1::2] and all(float(a) > 0 for a in advantages[1::2]), advantages

    # The SQL box: rows back, and a write refused with the store's own error.
    sql = browser.find_element(By.ID, "sql-text")
    sql.clear()
    sql.send_keys("SELECT rollout_id, final_reward FROM rollouts FINAL ORDER BY rollout_id")
    browser.find_element(By.ID, "sql-run").click()
    wait_js(browser, "document.querySelectorAll('#sql-result tbody tr').length == 10")
    assert "ro-dash-0" in browser.find_element(By.ID, "sql-result").text
    browser.find_element(By.ID, "sql-chart").click()  # the first column is text: the page says so instead of drawing
    sql.clear()
    sql.send_keys("SELECT resource_version, avg(final_reward) AS reward, count() AS n FROM rollouts FINAL GROUP BY resource_version ORDER BY 1")
    browser.find_element(By.ID, "sql-run").click()
    wait_js(browser, "document.querySelectorAll('#sql-result tbody tr').length == 2")
    browser.find_element(By.ID, "sql-chart").click()
    wait_js(browser, "+document.getElementById('chart-sql').dataset.points == 4")
    sql.clear()
    sql.send_keys("INSERT INTO rollouts (rollout_id) VALUES ('written-by-the-dashboard')")
    browser.find_element(By.ID, "sql-run").click()
    error = wait_js(browser, "!document.getElementById('sql-error').hidden && document.getElementById('sql-error').textContent")
    assert error.startswith("Code: 164.") and "(READONLY)" in error, error  # the store's own refusal, as it said it
    r = requests.post(dashboard + "/api/sql", json={"sql": "DROP TABLE spans"}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 400 and "readonly" in r.json()["error"].lower(), r.text

    shot = tmp_path / "dashboard.png"
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("ROLLOUTBUS_DASHBOARD_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)

