"""Agent Lightning's own code trains end to end on rolloutbus: its runner, our bus, a real policy.

(A) Agent Lightning 0.3.0's ``LitAgentRunner`` and ``LightningStoreClient`` (its own virtualenv,
al_venv.py; al_e2e_driver.py) are given the gateway's URL as their store and nothing else. The agent, the
calc demo's agent as a ``LitAgent``, takes its LLM from the resources the gateway serves (the
``proxy_llm`` whose endpoint ``rolloutbus train --llm-endpoint`` published) and calls it with the OpenAI
client: ``rolloutbus proxy`` → ``rolloutbus serve``, the calc demo's warmed-up tiny policy. Group tasks
published with ``rolloutbus tasks publish`` and rollouts its client enqueues are dequeued from the
gateway; the stream worker forms GRPO groups, ``rolloutbus train`` takes a step on one that teaches and
publishes the next version, the policy server loads it, and the next rollouts its runner runs are
answered by that version (the LLM spans' and rollouts' ``resource_version`` in ClickHouse).

(B) Agent Lightning 1.x's server API (``/api``): see :func:`test_agent_lightning_1x_api_trains_end_to_end`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from al_venv import ENV, ALInstallError, ensure_venv, ensure_venv_1x
from producers_testkit import REPO, free_port, start_gateway
from rolloutbus.runs.procs import Supervisor
from tests.faults.faultkit import store
from tests.integration.streams.helpers import batches, query, start_worker, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
DRIVER = Path(__file__).resolve().parent / "al_e2e_driver.py"
GROUP = 4  # rollouts per task: a group of four calc rollouts teaches (mixed rewards) far more often than one of two
TOKEN = "s3cret"


def _venv(ensure: Any, what: str) -> Path:
    try:
        return Path(ensure())
    except ALInstallError as exc:
        pytest.fail(f"{what} is needed for this test and could not be installed: {exc}")


@pytest.fixture(scope="module")
def al_python() -> Path:
    return _venv(ensure_venv, "Agent Lightning 0.3")


@pytest.fixture(scope="module")
def al1_python() -> Path:
    return _venv(ensure_venv_1x, "Agent Lightning 1.x")


@pytest.fixture(scope="module")
def calc_policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """The calc demo's starting policy (its ``--quick`` supervised warm-up of the tiny model: the format
    learnt, operations partly wrong) and its training problems."""
    from rolloutbus.demo import calc
    from rolloutbus.demo.driver import DemoConfig, warm_up

    cfg = DemoConfig(quick=True, sft_epochs=1, demonstrations=600, held_out=24)
    train, _held_out = calc.split(calc.problem_space(1) - cfg.held_out, cfg.held_out, seed=cfg.seed + 11)
    return warm_up(cfg, train, tmp_path_factory.mktemp("calc-policy"), lambda *_: None), train


@pytest.fixture
def env(test_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """One ClickHouse store (a server) for the worker's writes, the gateway's reads and the test's queries."""
    proc, dsn = store(test_env, tmp_path / "store", tmp_path / "store.log")
    yield {**test_env, "ROLLOUTBUS_CLICKHOUSE_DSN": dsn, "PYTHONPATH": str(REPO)}
    proc.terminate()
    proc.wait(30)


@pytest.fixture
def stack(env: dict[str, str], tmp_path: Path, calc_policy: tuple[Path, list[Any]]) -> Iterator[dict[str, Any]]:
    """Worker, trainer, policy server and LLM proxy, as ``make demo`` starts them (one train step, on a group
    that teaches), the trainer advertising the proxy as its versions' LLM endpoint."""
    base, _train = calc_policy
    serve_port, proxy_port = free_port(), free_port()
    proxy = f"http://127.0.0.1:{proxy_port}/v1"
    sup = Supervisor(tmp_path / "logs", env)
    worker = start_worker(env, "--group-size", str(GROUP), "--finish-grace", "2", "--group-timeout", "120")
    sup.start("train", ["train", "--model", str(base), "--groups-per-step", "1", "--max-steps", "1", "--skip-zero-variance",
                        "--threads", "1", "--metrics-port", "0", "--checkpoint-dir", str(tmp_path / "ckpt"), "--llm-endpoint", proxy])
    sup.start("serve", ["serve", "--port", str(serve_port), "--threads", "1", "--max-batch", "8"])
    sup.start("proxy", ["proxy", "--upstream", f"http://127.0.0.1:{serve_port}/v1", "--port", str(proxy_port)])
    try:
        wait_for(lambda: ok(f"http://127.0.0.1:{serve_port}/healthz"), 180, "rolloutbus serve", sup)
        wait_for(lambda: ok(f"http://127.0.0.1:{proxy_port}/healthz"), 60, "rolloutbus proxy", sup)
        yield {"sup": sup, "worker": worker, "serve": f"http://127.0.0.1:{serve_port}", "proxy": proxy, "logs": tmp_path / "logs"}
    finally:
        sup.stop_all()
        stop_worker(worker)


def ok(url: str, headers: dict[str, str] | None = None) -> Any:
    try:
        resp = requests.get(url, headers=headers, timeout=3)
    except requests.RequestException:
        return None
    if resp.status_code != 200:
        return None
    try:
        return resp.json()
    except ValueError:
        return True


def wait_for(probe: Any, timeout: float, what: str, sup: Supervisor | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while (got := probe()) is None or got is False:
        if sup is not None:
            sup.check()
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.5)
    return got


def serving(serve: str, version: int) -> Any:
    """True once ``rolloutbus serve`` answers with ``version`` (it hot-reloads from rb.resources)."""
    health = ok(f"{serve}/healthz")
    return isinstance(health, dict) and health.get("resource_version") == version


def publish_tasks(env: dict[str, str], tmp_path: Path, tasks: list[dict[str, Any]]) -> None:
    path = tmp_path / f"tasks-{time.time_ns()}.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    run = subprocess.run([sys.executable, "-m", "rolloutbus.cli", "tasks", "publish", str(path)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def al_env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}, **ENV}


def run_al(al_python: Path, store_url: str, out: Path, rollouts: int, enqueue: list[dict[str, Any]]) -> dict[str, Any]:
    run = subprocess.run([str(al_python), str(DRIVER), store_url, str(out), str(rollouts), *map(json.dumps, enqueue)],
                         env=al_env(), capture_output=True, text=True, timeout=400)
    assert run.returncode == 0 and out.exists(), run.stderr[-4000:]
    got: dict[str, Any] = json.loads(out.read_text())
    assert len(got["seen"]) == rollouts, got
    return got


def assert_stored(env: dict[str, str], before: dict[str, Any], after: dict[str, Any]) -> None:
    """What ClickHouse holds: every rollout ended with its agent's reward, and its LLM calls were answered by
    the version it ran on — 0 for those ``before`` the train step, 1 for those ``after``."""
    def stored() -> Any:
        rows = query(env, {
            "ro": "SELECT rollout_id, status, final_reward, resource_version FROM rollouts FINAL",
            "llm": "SELECT rollout_id, groupUniqArray(resource_version), count() FROM spans FINAL WHERE kind = 'llm' GROUP BY rollout_id",
        })
        return rows if len(rows["ro"]) == len(rows["llm"]) == len(before) + len(after) else None

    rows = wait_for(stored, 60, "every rollout in ClickHouse")
    ro = {r[0]: r[1:] for r in rows["ro"]}
    llm = {r[0]: (r[1], r[2]) for r in rows["llm"]}
    for rid, s in {**before, **after}.items():
        version = 1 if rid in after else 0
        assert ro[rid] == ["succeeded", s["reward"], version], (rid, ro[rid])
        assert llm[rid] == ([version], len(s["replies"])), (rid, llm[rid])


def test_agent_lightning_runner_trains_a_policy_through_the_gateway(
    al_python: Path, env: dict[str, str], stack: dict[str, Any], kafka_conf: dict[str, Any], topics: Any,
    calc_policy: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    _base, problems = calc_policy
    proxy, serve, sup = stack["proxy"], stack["serve"], stack["sup"]
    gw, gw_proc = start_gateway(env, tmp_path / "gw")  # its LightningStoreClient sends no token (README)
    try:
        agl = f"{gw}/v1/agl"
        # The resources its runner gets: the trainer's initial weights (version 0), the proxy as the LLM endpoint.
        latest = wait_for(lambda: ok(f"{agl}/resources/latest"), 120, "the initial version on rb.resources", sup)
        assert latest["resources_id"] == "policy=0"
        assert latest["resources"]["policy"]["resource_type"] == "proxy_llm"
        assert latest["resources"]["policy"]["endpoint"] == proxy, "the LLM endpoint its agent gets is our proxy"
        wait_for(lambda: serving(serve, 0), 120, "serve loading version 0", sup)

        # Round 1: four group tasks (GRPO groups of four) and one rollout its own client enqueues. Its runner takes
        # them one at a time; the trainer (one group per step) is held until they are all run, so that its version 1
        # cannot land in the middle of a group (that group would split into calc-N@0 and calc-N@1: seen under load).
        train = next(m for m in sup.procs if m.name == "train")
        os.killpg(train.proc.pid, signal.SIGSTOP)
        try:
            picked = [problems[i] for i in (0, 7, 14, 21, 28)]
            publish_tasks(env, tmp_path, [{"task_id": f"calc-{i}", "input": json.loads(p.to_json()), "group_size": GROUP}
                                          for i, p in enumerate(picked[:4])])
            first = run_al(al_python, gw, tmp_path / "round1.json", 4 * GROUP + 1, [json.loads(picked[4].to_json())])
        finally:
            os.killpg(train.proc.pid, signal.SIGCONT)
        seen1 = first["seen"]
        for rid, s in seen1.items():  # its ProxyLLM routes each attempt to the proxy's per-rollout route
            # An enqueued rollout names the newest set; a published task none (its runner fetches the latest).
            assert s["resource_type"] == "proxy_llm" and s["resources_id"] == ("policy=0" if rid in first["enqueued"] else None)
            assert s["base_url"].startswith(f"{proxy.removesuffix('/v1')}/rollout/{rid}/attempt/") and s["base_url"].endswith("/v1")
            assert s["replies"], "every rollout called the policy"

        # The worker groups them; a group with mixed rewards has non-zero advantages.
        got = batches(kafka_conf, topics.batches, 4, stack["worker"], timeout=120)
        groups = {b.group_id: b for b in got if b.group_id.startswith("calc-")}
        assert len(groups) == 4, sorted(groups)
        for b in groups.values():
            assert b.complete and len(b.rollout_ids) == GROUP
            assert dict(zip(b.rollout_ids, b.rewards)) == {r: seen1[r]["reward"] for r in b.rollout_ids}, "its agent's rewards"
        teaching = [b for b in groups.values() if any(abs(a) > 1e-6 for a in b.advantages)]
        assert teaching, f"every group tied: {[b.rewards for b in groups.values()]}"

        # The trainer takes its step and publishes version 1; the gateway's resources and the server follow.
        assert train.proc.wait(180) == 0, (stack["logs"] / "train.log").read_text()[-3000:]
        assert "trained 1 steps; policy is at version 1" in (stack["logs"] / "train.log").read_text()
        latest = wait_for(lambda: (r := ok(f"{agl}/resources/latest")) and r["resources_id"] == "policy=1" and r, 60,
                          "version 1 on the gateway")
        assert latest["resources"]["policy"]["endpoint"] == proxy
        wait_for(lambda: serving(serve, 1), 120, "serve loading version 1")

        # Round 2: its client enqueues two rollouts; its runner runs them on version 1.
        second = run_al(al_python, gw, tmp_path / "round2.json", 2, [json.loads(p.to_json()) for p in problems[40:42]])
        seen2 = second["seen"]
        assert sorted(seen2) == sorted(second["enqueued"])
        assert {s["resources_id"] for s in seen2.values()} == {"policy=1"}

        assert_stored(env, seen1, seen2)
    finally:
        gw_proc.terminate()
        gw_proc.wait(30)


def test_agent_lightning_1x_api_trains_end_to_end(
    al1_python: Path, env: dict[str, str], stack: dict[str, Any], kafka_conf: dict[str, Any], topics: Any,
    calc_policy: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    """Agent Lightning 1.x's ``/api`` path, driven by its own code in its own virtualenv (al1_e2e_driver.py):
    its client creates the rollouts and its ``LocalReconciler`` runs unmodified with the gateway as its server
    (URL and key, nothing else): it polls the gateway's queue (rb.tasks), spawns its worker subprocesses with the
    environment its ``_spawn_for`` builds — the LLM URL its server's LLM route, which the gateway forwards to
    ``rolloutbus proxy`` at the endpoint the trainer published — and patches them running and succeeded.
    No environment variable, no private call: the driver only watches its calls. The rollouts of one sample
    are one GRPO group, the trainer steps, ``/api/models`` lists the new version, and the next rollouts are
    answered by it."""
    _base, problems = calc_policy
    proxy, serve, sup = stack["proxy"], stack["serve"], stack["sup"]
    gw, gw_proc = start_gateway(env, tmp_path / "gw", token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def models(version: int) -> Any:
        got = ok(f"{gw}/api/models", auth)
        return got if got and got[0]["version"] == version else None

    def run_al1(out: Path, n: int, samples: list[dict[str, Any]]) -> dict[str, Any]:
        run = subprocess.run([str(al1_python), str(DRIVER.with_name("al1_e2e_driver.py")), gw, TOKEN, str(n), str(out),
                              *map(json.dumps, samples)], env=al_env(), capture_output=True, text=True, timeout=450)
        assert run.returncode == 0 and out.exists(), run.stderr[-4000:]
        got: dict[str, Any] = json.loads(out.read_text())
        created = [c[0] for c in got["created"]]
        assert [c[1] for c in got["created"]] == ["queuing"] * len(created) == ["queuing"] * n * len(samples)
        assert [c for c in got["calls"] if c[2] >= 300] == [], "every call its controller made was answered 2xx"
        assert {c[0] for c in got["calls"]} == {"GET", "PATCH"}, "its poll and its patches, nothing else"
        patches = {rid: [c[3] for c in got["calls"] if c[0] == "PATCH" and c[1] == f"/api/rollouts/{rid}"] for rid in created}
        assert patches == {rid: ["running", "succeeded"] for rid in created}, "each claimed once, each ended once"
        assert sorted(got["seen"]) == sorted(created), f"every agent ran to its end: {run.stderr[-3000:]}"
        for rid, s in got["seen"].items():  # the URLs its controller hands an agent: the gateway's, nothing else set
            assert s["base_url"] == f"{gw}/proxy/rollout/{rid}/attempt/0/mode/train/openai/v1"
            assert s["event_url"] == f"{gw}/api/rollouts/{rid}/attempt/0/events" and s["replies"]
        return got

    try:
        assert wait_for(lambda: models(0), 120, "version 0 in /api/models", sup) == [
            {"model": "rolloutbus-tiny", "endpoint": proxy, "version": 0}], "the trainer's initial weights, served behind the proxy"
        wait_for(lambda: serving(serve, 0), 120, "serve loading version 0", sup)

        samples = [{"data_id": f"calc-{i}", **json.loads(p.to_json())} for i, p in enumerate(problems[60:64])]
        first = run_al1(tmp_path / "round1.json", GROUP, samples)
        assert first["models"] == [{"model": "rolloutbus-tiny", "endpoint": proxy, "version": 0}], "its Model shape"
        assert [c[1] for c in first["created"]] == ["queuing"] * len(first["created"])
        seen1 = first["seen"]

        got = batches(kafka_conf, topics.batches, len(samples), stack["worker"], timeout=120)
        assert len(got) == len(samples), [b.group_id for b in got]
        for b in got:
            assert b.complete and len(b.rollout_ids) == GROUP
            assert dict(zip(b.rollout_ids, b.rewards)) == {r: seen1[r]["reward"] for r in b.rollout_ids}, "its last reward events"
        assert any(abs(a) > 1e-6 for b in got for a in b.advantages), f"every group tied: {[b.rewards for b in got]}"

        train = next(m for m in sup.procs if m.name == "train")
        assert train.proc.wait(180) == 0, (stack["logs"] / "train.log").read_text()[-3000:]
        assert wait_for(lambda: models(1), 60, "version 1 in /api/models") == [{"model": "rolloutbus-tiny", "endpoint": proxy, "version": 1}]
        wait_for(lambda: serving(serve, 1), 120, "serve loading version 1")

        second = run_al1(tmp_path / "round2.json", 2, [{"data_id": "calc-next", **json.loads(problems[70].to_json())}])
        assert second["models"] == [{"model": "rolloutbus-tiny", "endpoint": proxy, "version": 1}]
        seen2 = second["seen"]

        # Its controller runs a round's rollouts at once, so the step may be published while the last ones
        # still call the policy: a rollout is under the version of its creation, each call records the
        # version that answered it — version 0 for every call of a group the trainer took, 1 in round 2.
        rows = wait_for(lambda: (r := query(env, {
            "ro": "SELECT rollout_id, status, final_reward, resource_version FROM rollouts FINAL",
            "llm": "SELECT rollout_id, groupUniqArray(resource_version), count() FROM spans FINAL WHERE kind = 'llm' GROUP BY rollout_id",
        })) and len(r["ro"]) == len(r["llm"]) == len(seen1) + len(seen2) and r, 60, "every rollout in ClickHouse")
        ro, llm = {r[0]: r[1:] for r in rows["ro"]}, {r[0]: (sorted(r[1]), r[2]) for r in rows["llm"]}
        for rid, s in {**seen1, **seen2}.items():
            assert ro[rid] == ["succeeded", s["reward"], 1 if rid in seen2 else 0], (rid, ro[rid])
            assert llm[rid][1] == len(s["replies"]) and set(llm[rid][0]) <= ({1} if rid in seen2 else {0, 1}), (rid, llm[rid])
        assert any(all(llm[r][0] == [0] for r in b.rollout_ids) for b in got), "a whole group answered by version 0"
        for rid in seen2:  # its GET /api/rollouts/{id}: an ended rollout, from ClickHouse
            detail = ok(f"{gw}/api/rollouts/{rid}", auth)
            assert detail["attempts"] == ["0"] and detail["rollout"]["status"]["state"] == "succeeded", detail
    finally:
        gw_proc.terminate()
        gw_proc.wait(30)
