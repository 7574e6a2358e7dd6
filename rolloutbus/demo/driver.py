"""The demo's orchestration: the local stack (:mod:`rolloutbus.runs.stack`), a supervised warm-up, the real
processes, a live table, a held-out evaluation of the first and the final version, and a report from ClickHouse.

Processes (each ``rolloutbus <command>``, logs under ``<out>/logs``): the stream processor (the only
writer of the embedded ClickHouse store), the policy server (hot-reloads new versions), the LLM proxy in
front of it, the trainer, and the runners. This process publishes tasks, follows ``rb.metrics``,
``rb.resources`` and ``rb.batches`` for the live table, and runs the evaluation through a proxy so
evaluation rollouts are recorded too (mode ``test``).
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from foundation.config import CommonSettings, load_settings
from rolloutbus.demo import calc
from rolloutbus.demo.config import DemoConfig
from rolloutbus.localproc import free_port
from rolloutbus.runs.evaluation import evaluate, final_validator, version_uri
from rolloutbus.runs.live import Live, TaskFeeder, follow, wait_http
from rolloutbus.runs.procs import Supervisor
from rolloutbus.runs.scope import reset_namespace
from rolloutbus.runs.stack import LocalStack, local_stack, process_env, say_stack
from foundation.errors import ConfigError, RolloutbusError


# --------------------------------------------------------------------------- warm-up


def warm_up(cfg: DemoConfig, train: list[calc.Problem], directory: Path, say: Any) -> Path:
    """Supervised warm-up on noisy demonstrations; cached by its settings."""
    import torch

    from trainer.model import TinyConfig, build_tiny, save_policy
    from trainer.sft import SFTConfig, sft

    key = hashlib.sha256(json.dumps([cfg.seed, cfg.sft_epochs, calc.MISCONCEPTIONS, cfg.demonstrations, len(train), "v2"]).encode()).hexdigest()[:12]
    path = directory / f"base-{key}"
    if (path / "config.json").exists():
        say(f"warm-up    reusing {path}")
        return path
    t0 = time.monotonic()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    pairs = calc.sft_pairs([calc.demonstration(rng.choice(train), rng) for _ in range(cfg.demonstrations)])
    model, tok = build_tiny(TinyConfig(), seed=cfg.seed)
    losses = sft(model, tok, pairs, SFTConfig(epochs=cfg.sft_epochs, lr=3e-3, batch_size=32, seed=cfg.seed))
    tmp = directory / f".base-{key}.tmp"
    save_policy(model, tok, tmp)
    tmp.rename(path)
    say(f"warm-up    {len(pairs)} demonstration turns, {cfg.sft_epochs} epochs, loss {losses[0]:.2f} → {losses[-1]:.3f} "
        f"({time.monotonic() - t0:.0f}s) — format learnt, operations partly wrong")
    return path


# --------------------------------------------------------------------------- live view


# --------------------------------------------------------------------------- evaluation


# --------------------------------------------------------------------------- the tasks


@dataclass
class DemoTask:
    """What differs between the demo's tasks; the loop around them is the same."""

    title: str
    agent: str  # ``module:Class`` for ``rolloutbus run-agent``
    eval_agent: Callable[[str], Any]  # proxy URL → a greedy agent for the held-out evaluation
    train: list[Any]
    held_out: list[Any]
    model: Path
    first_label: str
    train_args: list[str] = field(default_factory=list)
    process_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    rollout_timeout_s: int = 120
    eval_threads: int = 1
    validation: list[Any] = field(default_factory=list)  # scored for each version by the runners (mode test)
    subsets: dict[str, list[int]] = field(default_factory=dict)  # named parts of held_out (indices) reported apart
    serve_args: list[str] = field(default_factory=list)  # the engine of the evaluation's policy server (DemoConfig.serve_args)
    serve_start_s: float = 120.0


def calc_task(cfg: DemoConfig, demo_dir: Path, say: Any) -> DemoTask:
    from rolloutbus.demo.agent import CalcAgent

    # Every one-step problem there is: the held-out ones are never published as training tasks.
    train, held_out = calc.split(calc.problem_space(1) - cfg.held_out, cfg.held_out, seed=cfg.seed + 11)
    base = warm_up(cfg, train, demo_dir, say)
    return DemoTask("calculator agent", "rolloutbus.demo.agent:CalcAgent", lambda url: CalcAgent(proxy=url, temperature=0.0),
                    train, held_out, base, "supervised warm-up only", process_args=["--group-timeout", "20"])


def sql_task(cfg: DemoConfig, settings: CommonSettings, say: Any) -> DemoTask:
    from rolloutbus.demo import sql
    from rolloutbus.demo.sql_agent import SQLAgent
    from trainer.model_import import import_model

    t0 = time.monotonic()
    model = import_model(cfg.model, settings.data_dir / "models")
    say(f"model      {model} ({time.monotonic() - t0:.0f}s; a second run reuses it)")
    split, train = sql.demo_split(cfg.held_out, cfg.validation, cfg.train_questions, seed=cfg.seed)
    held_out = split.test
    n_dbs = len({q.db for q in train})
    say(f"task       Text-to-SQL on {len(sql.DATABASES)} databases: {len(train)} training questions ({n_dbs} databases), "
        f"{len(split.validation)} validation, {len(held_out)} held-out — {len(split.test_seen)} new questions on the training "
        f"databases, {len(split.test_unseen)} on databases never trained on ({', '.join(split.held_out_dbs)}); execution match"
        + ("; single-turn form (one SQL answer)" if cfg.single_turn else "")
        + (f"; training rollouts rewarded {cfg.sql_reward} ({sql.REWARDS[cfg.sql_reward]})" if cfg.sql_reward != "match" else ""))
    temp = str(cfg.temperature)
    rewrites = 0 if cfg.single_turn else sql_agent_rewrites()
    seen = list(range(len(split.test_seen)))
    return DemoTask(
        "Text-to-SQL agent", "rolloutbus.demo.sql_agent:SQLAgent",
        lambda url: SQLAgent(proxy=url, temperature=0.0, max_rewrites=rewrites),
        train, held_out, model, "pretrained, before RL",
        # Most early groups of a 135M model fail all together: train only on groups that teach.
        train_args=["--train-layers", str(cfg.train_layers), "--micro-batch-tokens", "2048", "--skip-zero-variance"],
        process_args=["--group-timeout", "300"],
        env={"ROLLOUTBUS_AGENT_TEMPERATURE": temp, "ROLLOUTBUS_TRAIN_TEMPERATURE": temp, "ROLLOUTBUS_AGENT_REWRITES": str(rewrites),
             "ROLLOUTBUS_AGENT_REWARD": cfg.sql_reward},
        rollout_timeout_s=900, eval_threads=2, validation=list(split.validation),
        serve_args=cfg.serve_args(), serve_start_s=cfg.serve_start_s if cfg.engine == "vllm" else 120.0,
        subsets={"questions never trained on, training databases": seen,
                 "databases never trained on": list(range(len(seen), len(held_out)))},
    )


def sql_agent_rewrites() -> int:
    from rolloutbus.demo.sql_agent import MAX_REWRITES

    return MAX_REWRITES


# --------------------------------------------------------------------------- the run


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def start_dashboard(sup: Supervisor, say: Any) -> None:
    """``rolloutbus dashboard`` for the length of the run, on 8050 or a free port; it reads the store over HTTP."""
    port = 8050 if _port_free(8050) else free_port()
    sup.start("dashboard", ["dashboard", "--host", "127.0.0.1", "--port", str(port)])
    say(f"dashboard  http://127.0.0.1:{port}/ — learning curves, pipeline health, trajectories and SQL, live during the run")


@dataclass
class DemoResult:
    """What one demo run measured (the learning bench reads it)."""

    first: int
    chosen: int  # the version that won validation (the last version when there is no validation)
    final: int
    first_scores: list[float]
    chosen_scores: list[float]
    validation: dict[int, float]  # version → validation score, fully validated versions only
    subsets: dict[str, list[int]]
    steps: int
    rollouts: int  # training rollouts in groups
    train_s: float  # from the runners' start to the end of training
    early_stopped: bool
    wall_s: float
    step_time_s: float = 0.0  # the trainer's optimiser steps, summed
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds per process over the training phase
    tokens: float = 0.0  # tokens the trainer's steps trained on (prompt + response of each row), summed
    samples: float = 0.0  # rows (rollout turns) the steps trained on, summed
    groups: int = 0  # training groups generated (seen on the batches topic)
    groups_teaching: int = 0  # of them, those whose rewards differ
    staleness: float | None = None  # the trained batches' mean age in versions (the steps' batch_staleness_mean)
    skipped_backlog: float = 0.0  # groups the trainer read and skipped (--backlog newest|sample), summed over the steps


def _local_settings(cfg: DemoConfig) -> CommonSettings:
    overrides = {"data_dir": cfg.data_dir} if cfg.data_dir else {}
    settings = load_settings(CommonSettings, overrides)
    if not settings.uses_local_broker:
        raise ConfigError("the demo resets its topics and database, so it runs on the local stack only: unset ROLLOUTBUS_KAFKA_BOOTSTRAP")
    if settings.clickhouse_dsn and not settings.clickhouse_dsn.startswith("chdb:"):
        raise ConfigError("the demo resets its database, so it runs on the local store only: unset ROLLOUTBUS_CLICKHOUSE_DSN")
    return settings


def run_demo(cfg: DemoConfig) -> int:
    run_demo_result(cfg)
    return 0


def run_demo_result(cfg: DemoConfig, first_scores: list[float] | None = None) -> DemoResult:
    """The whole run; ``first_scores``: version 0's held-out scores when already known (it is not evaluated again)."""
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    say = console.print
    settings = _local_settings(cfg)
    t_start = time.monotonic()
    cfg.out.mkdir(parents=True, exist_ok=True)
    demo_dir = settings.data_dir / "demo"
    demo_dir.mkdir(parents=True, exist_ok=True)
    say(f"[bold]rolloutbus demo[/bold] — {'quick smoke run' if cfg.quick else f'{cfg.minutes:g} minutes of training'}, "
        + (f"production traffic: no task ids, late feedback, {cfg.runners} requests at once, {cfg.production.groups_per_step} "
           "judged rollouts per step" if cfg.production else
           f"groups of {cfg.group_size}, {cfg.runners} rollouts at once, {cfg.groups_per_step} groups per step"))

    with local_stack(settings, cfg.out / "logs", keep_running=cfg.keep_running) as stack:
        say_stack(stack, say)
        return _run(cfg, settings, stack, demo_dir, t_start, say, first_scores)


def _run(cfg: DemoConfig, settings: CommonSettings, stack: LocalStack, demo_dir: Path, t_start: float, say: Any,
         first_scores: list[float] | None) -> DemoResult:
    """The run on the started stack: a fresh start, the task, the processes, training, validation, evaluation, the report."""
    from trainer.validation import best as best_version, complete

    reset_namespace(settings, say)
    task = sql_task(cfg, settings, say) if cfg.task == "sql" else calc_task(cfg, demo_dir, say)
    train, held_out, base = task.train, task.held_out, task.model
    if cfg.production is not None:  # the worker's feedback flags; one-rollout batches per step, older versions trained
        task.process_args += cfg.production.process_args()
        task.train_args += cfg.production.train_args()
        task.validation = []  # no runners answer the trainer's validation tasks here: the held-out evaluation judges
    validate_args: list[str] = []
    if task.validation:
        val_file = demo_dir / "validation.jsonl"
        val_file.write_text("".join(q.to_json() + "\n" for q in task.validation))
        validate_args = ["--validation-tasks", str(val_file), "--validate-every", str(cfg.validate_every)]
        if cfg.early_stop_patience:
            validate_args += ["--early-stop-patience", str(cfg.early_stop_patience)]
        say(f"validate   {len(task.validation)} validation questions for every "
            f"{'' if cfg.validate_every == 1 else f'{cfg.validate_every}th '}version, greedy, by the runners (mode test); "
            "the version that wins is the one evaluated"
            + (f"; the trainer stops after {cfg.early_stop_patience} validated version(s) without a better score" if cfg.early_stop_patience else ""))

    env = dict(process_env(settings), ROLLOUTBUS_CHECKPOINT_DIR=str(demo_dir / "checkpoints"), **task.env)
    import shutil

    shutil.rmtree(demo_dir / "checkpoints", ignore_errors=True)
    shutil.rmtree(settings.data_dir / "spool", ignore_errors=True)
    sup = stack.procs
    sup.env = env
    live = Live()
    stop_follow = threading.Event()
    follower = threading.Thread(target=follow, args=(settings, live, stop_follow), daemon=True)
    try:
        if cfg.dashboard and settings.uses_local_store:
            start_dashboard(sup, say)
        serve_port, proxy_port = free_port(), free_port()
        sup.start("process", ["process", "--group-size", str(cfg.group_size), "--group-min-rollouts", "2",
                              "--credit", cfg.credit, "--gamma", str(cfg.gamma), "--advantage-estimator", cfg.advantage_estimator,
                              *(["--reward-rules", str(cfg.reward_rules)] if cfg.reward_rules else []),
                              "--sink-interval", "0.5", *task.process_args])
        sup.start("serve", ["serve", "--port", str(serve_port), "--threads", "1", "--max-batch", "32", *cfg.serve_args(), *cfg.lora_serve_args(),
                            *(["--follow-lag", str(cfg.serve_lag)] if cfg.serve_lag else []),
                            *(cfg.production.serve_args(str(base)) if cfg.production else [])])
        sup.start("proxy", ["proxy", "--upstream", f"http://127.0.0.1:{serve_port}/v1", "--port", str(proxy_port)])
        train_argv = ["train", "--model", str(base), "--groups-per-step", str(cfg.groups_per_step),
                      "--lr", str(cfg.lr), "--kl-beta", str(cfg.kl_beta), "--max-staleness", str(2 + cfg.serve_lag), "--threads", "1", "--seed", str(cfg.seed),
                      *cfg.learning_train_args(),
                      *(["--nproc-per-node", str(cfg.nproc_per_node)] if cfg.nproc_per_node > 1 else []),
                      *(["--keep-checkpoints", str(3 + cfg.serve_lag)] if cfg.serve_lag else []),  # the served one kept
                      *task.train_args, *cfg.lora_train_args(), *validate_args, *(["--max-steps", str(cfg.max_steps)] if cfg.max_steps else [])]
        if cfg.production is None or not cfg.production.sft_first:  # --sft-first: started after the SFT (production.SFTFirst)
            sup.start("train", train_argv)
        follower.start()
        wait_http(f"http://127.0.0.1:{serve_port}/healthz", cfg.serve_start_s, sup)
        wait_http(f"http://127.0.0.1:{proxy_port}/healthz", 60, sup)
        sup.env = dict(env, ROLLOUTBUS_LLM_PROXY_URL=f"http://127.0.0.1:{proxy_port}")
        if cfg.production is None:
            sup.start("runners", ["run-agent", task.agent, "--concurrency", str(cfg.runners),
                                  "--max-attempts", "1", "--timeout", str(task.rollout_timeout_s)])
        say(f"started    stream processor, policy server :{serve_port}, LLM proxy :{proxy_port}, trainer, "
            + ("the deployment's traffic" if cfg.production else f"{cfg.runners} runners") + f" (logs in {cfg.out / 'logs'})")
        if cfg.production is not None:
            from rolloutbus.demo.production import start_traffic

            feeder: Any = start_traffic(settings, cfg, task, f"http://127.0.0.1:{proxy_port}", say, sup, train_argv)
        else:
            from producers.curriculum import pass_rate_curriculum

            curriculum = (pass_rate_curriculum(settings, cfg.selection_k, cfg.selection_explore, seed=cfg.seed,
                                               group_size=cfg.group_size) if cfg.task_selection == "pass-rate" else None)
            feeder = TaskFeeder(settings, train, live, group_size=cfg.group_size, runners=cfg.runners,
                                groups_per_step=cfg.groups_per_step, curriculum=curriculum, pace=cfg.pace)
        train_for = cfg.minutes * 60
        t_train = time.monotonic()
        shown = 0
        early_stopped = False
        header = (f"{'step':>5} {'version':>7} {'rollouts':>8} {'batch reward':>12} {'success (last 128)':>18} "
                  f"{'loss':>8} {'clip':>6}  {'elapsed':>7}")
        say(header)
        while time.monotonic() - t_train < train_for + getattr(feeder, "paused_s", 0.0):  # --sft-first: the SFT's time added
            if sup.returncode("train") == 0:
                early_stopped = True
                say(f"training   the trainer took its {cfg.max_steps} optimiser steps (--max-steps)"
                    if cfg.max_steps and not cfg.early_stop_patience else "training   the trainer stopped early: validation stopped improving")
                break
            sup.check()
            feeder.top_up()
            with live.lock:
                new = live.steps[shown:]
                shown = len(live.steps)
                total = sum(len(v) for v in live.rewards_by_version.values())
                success = sum(1 for r in live.recent if r >= 1.0) / len(live.recent) if live.recent else 0.0
            for s in new:
                say(f"{int(s['step']):>5} {int(s.get('version') or 0):>7} {total:>8} {s.get('reward_mean', 0):>12.3f} "
                    f"{success:>18.0%} {s.get('loss', 0):>8.4f} {s.get('clip_fraction', 0):>6.3f}  "
                    f"{time.monotonic() - t_start:>6.0f}s")
            time.sleep(0.5)
        train_s = time.monotonic() - t_train
        cpu = sup.cpu_seconds()
        feeder.close()
        if getattr(feeder, "selection_line", lambda: None)():
            say(feeder.selection_line())
        if not early_stopped:
            say("training   time is up: stopping the trainer")
        sup.stop("train", grace=60)
        time.sleep(1.5)
        with live.lock:
            versions = dict(live.versions)
            steps_done = len(live.steps)
            step_time = sum(float(st.get("step_time_s", 0.0)) for st in live.steps)
            trained_tokens = sum(float(st.get("tokens", 0.0)) for st in live.steps)
            trained_samples = sum(float(st.get("samples", 0.0)) for st in live.steps)
            rollouts = sum(len(v) for v in live.rewards_by_version.values())
            groups, groups_teaching = len(live.groups_seen), live.groups_teaching
            staleness = [float(st["batch_staleness_mean"]) for st in live.steps if st.get("batch_staleness_mean") is not None]
            skipped = sum(float(st.get("batches_skipped_backlog", 0.0)) for st in live.steps)
        if staleness:
            say(f"staleness  the batches trained on were {sum(staleness) / len(staleness):.2f} versions old on average "
                f"(the steps' means from {min(staleness):.1f} to {max(staleness):.1f}; --policy-loss {cfg.policy_loss})")
        if not versions:
            raise RolloutbusError("no resource version was published: the trainer never started")
        if len(versions) < 2:
            say("[yellow]training   no optimiser step in the time given (no two groups with mixed rewards yet): "
                "version 0 is what there is to evaluate[/yellow]")
        first, final = min(versions), max(versions)
        chosen, val_scores = final, {}
        if task.validation:
            run_id = versions[final]["config"].get("run_id", "")
            n = len(task.validation)
            wanted = final - final % cfg.validate_every
            deadline = time.monotonic() + 90  # the newest version's validation, behind the training tasks queued
            validator = final_validator(settings, task.validation, run_id, wanted)
            scores = validator.poll(force=True)
            while time.monotonic() < deadline and (scores.get(wanted) is None or scores[wanted].answered < n):
                sup.check()
                time.sleep(2.0)
                scores = validator.poll(force=True)  # publishes again what an older version answered
            validator.close()
            val_scores = {s.version: s.mean for s in complete(scores, n)}
            winner = best_version(scores, n)
            if winner is not None:
                chosen = winner.version
            say("validate   " + ", ".join(f"v{v} {m:.0%}" for v, m in sorted(val_scores.items()))
                + f" — version {chosen} is kept" + ("" if winner is not None else " (no version was fully validated: the last)"))
        say("training   stopping the runners")
        sup.stop("runners", grace=30)
        sup.stop("proxy")
        sup.stop("serve")
        say(f"evaluate   version {first} ({task.first_label}) and version {chosen} on the same {len(held_out)} held-out problems (greedy)")
        # Version 0 is the warm-up's weights as published (its checkpoint may be pruned by now).
        first_uri = str(base) if first == 0 else versions[first]["uri"]
        threads = 16 if cfg.task == "sql" else 8
        evaluated: list[int] = []
        if first_scores is None or len(first_scores) != len(held_out):
            evaluated.append(first)
            first_scores = evaluate(settings, sup, first_uri, first, held_out, "first", task, threads=threads)
        if chosen == first:
            chosen_scores = list(first_scores)  # greedy: the same version answers the same
        else:
            chosen_scores = evaluate(settings, sup, version_uri(versions, chosen), chosen, held_out, "final", task,
                                     threads=threads)
            evaluated.append(chosen)
        time.sleep(2.0)  # the sink flushes every 0.5 s
        sup.stop("process", grace=60)
        stop_follow.set()
        follower.join(5)
        from rolloutbus.demo.report import report

        report(settings, cfg, live, first, chosen, first_scores, chosen_scores, say, task.title, task.first_label,
               subsets=task.subsets, final_label=(cfg.production.label if cfg.production else "after GRPO")
               + ("" if chosen == final else ", validation's choice"), evaluated=tuple(evaluated))
        if cfg.production is not None:
            from rolloutbus.demo.production import production_report

            production_report(settings, say, live.steps, feeder.user.stats.feedback_sent)
        stack.keep_store = True
        say(f"done in {time.monotonic() - t_start:.0f}s.")
        if stack.store is not None:
            # The run is there to be queried: the store stays up (one light process); the broker stops.
            say(f"query      the store stays up on {stack.store.url}: .venv/bin/rolloutbus query \"SELECT * FROM v_reward_by_version\" "
                "(.venv/bin/rolloutbus down stops it)")
        return DemoResult(first, chosen, final, first_scores, chosen_scores, val_scores, task.subsets, steps_done, rollouts,
                          train_s, early_stopped, time.monotonic() - t_start, step_time, cpu, trained_tokens, trained_samples,
                          groups, groups_teaching, sum(staleness) / len(staleness) if staleness else None, skipped)
    finally:
        stop_follow.set()


def evaluate_model(cfg: DemoConfig, uri: str, label: str) -> tuple[list[float], list[Any], dict[str, list[int]]]:
    """Greedy held-out evaluation of any model directory (another trainer's output), as the demo evaluates its versions:
    its own server, proxy and agent, recorded through the local stack. Returns (scores, problems, subsets)."""
    from rich.console import Console

    say = Console(highlight=False, soft_wrap=True).print
    settings = _local_settings(cfg)
    with local_stack(settings, cfg.out / "logs", keep_running=cfg.keep_running) as stack:
        say_stack(stack, say)
        task = sql_task(cfg, settings, say) if cfg.task == "sql" else calc_task(cfg, settings.data_dir / "demo", say)
        stack.procs.env.update(task.env)
        scores = evaluate(settings, stack.procs, uri, 0, task.held_out, label, task, threads=16 if cfg.task == "sql" else 8)
        return scores, task.held_out, task.subsets
