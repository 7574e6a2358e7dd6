"""``rolloutbus demo --task sql --algorithm apo``: the SQL agent's prompt optimized on the local stack.

The same stack as the GRPO demo without the trainer: the stream processor, the policy server (the
pretrained model, whose weights do not change here), the LLM proxy, the runners with the SQL agent
(greedy). The built-in prompt is published as prompt version 0. Then, as three runs of
``rolloutbus optimize-prompt`` (each recorded in ``prompt_candidates``):

1. APO with the served model as the optimizer LLM, on validation questions from the training split;
2. a dry run scoring the hand-written candidates of :data:`rolloutbus.demo.sql.HAND_WRITTEN` on the same
   validation questions;
3. a dry run scoring the starting prompt, the prompt now published, and the best hand-written one on
   the held-out questions (never used above), with paired standard errors.
"""

from __future__ import annotations

import json
import time
from typing import Any

from foundation.config import CommonSettings, load_settings
from rolloutbus.demo.driver import DemoConfig, sql_task, start_dashboard
from rolloutbus.runs.live import wait_http
from rolloutbus.runs.procs import Supervisor
from rolloutbus.runs.scope import reset_namespace
from rolloutbus.runs.stack import local_stack
from rolloutbus.localproc import free_port
from foundation.errors import ConfigError


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_apo_demo(cfg: DemoConfig) -> int:
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    say = console.print
    overrides = {"data_dir": cfg.data_dir} if cfg.data_dir else {}
    settings = load_settings(CommonSettings, overrides)
    if not settings.uses_local_broker or not settings.uses_local_store:
        raise ConfigError("the demo resets its topics and database, so it runs on the local stack only: "
                          "unset ROLLOUTBUS_KAFKA_BOOTSTRAP and ROLLOUTBUS_CLICKHOUSE_DSN")
    t_start = time.monotonic()
    cfg.out.mkdir(parents=True, exist_ok=True)
    say(f"[bold]rolloutbus demo[/bold] — APO on the SQL agent's prompt: {cfg.apo_rounds} rounds, beam {cfg.apo_beam}, "
        f"branch {cfg.apo_branch}, {cfg.val_size} validation questions, {cfg.runners} rollouts at once (greedy)")
    with local_stack(settings, cfg.out / "logs", keep_running=cfg.keep_running) as stack:
        assert stack.store is not None  # the settings use the local store: checked above
        say(f"kafka      {'started' if stack.started_broker else 'reused'} on {stack.broker.bootstrap}; store {stack.store.url}")
        stack.procs.env["ROLLOUTBUS_AGENT_TEMPERATURE"] = "0"
        return _optimize(cfg, settings, stack.procs, say, t_start, overrides)


def _optimize(cfg: DemoConfig, settings: CommonSettings, sup: Supervisor, say: Any, t_start: float,
              overrides: dict[str, Any]) -> int:
    """The three runs of ``rolloutbus optimize-prompt`` on the started stack, the processes started through ``sup``."""
    from confluent_kafka import Producer

    from rolloutbus.demo import sql
    from schemas import ResourceVersion, encode
    from trainer.apo import paired_difference
    from trainer.apo_cli import run_optimizer
    from trainer.settings import ApoSettings

    reset_namespace(settings, say)
    task = sql_task(cfg, settings, say)
    val, held_out = task.train[: cfg.val_size], task.held_out
    say(f"questions  {len(val)} validation (from the training split) and {len(held_out)} held-out")

    start_config = sql.prompt_config()
    producer = Producer({**settings.kafka_conf(), "log_level": 0})
    producer.produce(settings.topics.resources, encode(ResourceVersion(name="prompt", version=0, kind="prompt_template",
                                                                       created_ns=time.time_ns(), config=start_config)), b"prompt")
    if producer.flush(30):
        raise ConfigError("could not publish the starting prompt")
    say("published  prompt version 0: the built-in prompt")

    env = sup.env
    if cfg.dashboard:
        start_dashboard(sup, say)
    serve_port, proxy_port = free_port(), free_port()
    serve_url = f"http://127.0.0.1:{serve_port}/v1"
    sup.start("process", ["process", "--sink-interval", "0.5", *task.process_args])
    sup.start("serve", ["serve", "--model", str(task.model), "--no-follow", "--port", str(serve_port), "--threads", "2",
                        "--max-batch", "32"])
    sup.start("proxy", ["proxy", "--upstream", serve_url, "--port", str(proxy_port)])
    wait_http(f"http://127.0.0.1:{serve_port}/healthz", 180, sup)
    wait_http(f"http://127.0.0.1:{proxy_port}/healthz", 60, sup)
    sup.env = dict(env, ROLLOUTBUS_LLM_PROXY_URL=f"http://127.0.0.1:{proxy_port}")
    sup.start("runners", ["run-agent", task.agent, "--concurrency", str(cfg.runners), "--max-attempts", "1",
                          "--timeout", str(task.rollout_timeout_s)])
    say(f"started    stream processor, policy server :{serve_port} (also the optimizer LLM), LLM proxy :{proxy_port}, "
        f"{cfg.runners} runners (logs in {cfg.out / 'logs'})")

    s = load_settings(ApoSettings, {**overrides, "apo_llm_url": serve_url, "apo_rounds": cfg.apo_rounds,
                                    "apo_beam_width": cfg.apo_beam, "apo_branch": cfg.apo_branch})
    val_inputs, held_inputs = [q.to_json() for q in val], [q.to_json() for q in held_out]

    def phase(title: str, *args: Any, **kw: Any) -> dict[str, Any]:
        say(f"[bold]{title}[/bold]")
        sup.check()
        summary = run_optimizer(s, *args, say=lambda m: say(f"  {m}"), **kw)
        (cfg.out / f"{kw['run_id']}.json").write_text(json.dumps(summary, indent=2))
        for c in summary["candidates"]:
            score = f"{c['score']:.3f} ± {c['score_se'] or 0:.3f}" if c["score"] is not None else "-"
            say(f"  {c['id']:<22} {c['source']:<9} {score:>14}  {_one_line(c['config'].get('template', ''), 90)}")
        say(f"  ({summary['seconds']:.0f}s)")
        return summary

    llm = phase("1. APO, the served SmolLM2 as the optimizer LLM", val_inputs, [], None, dry_run=False, run_id="apo-llm")
    mine = [{"template": t, "examples": json.dumps([list(e) for e in ex])} for _, t, ex in sql.HAND_WRITTEN]
    dry = phase("2. dry run: hand-written candidates on the same validation questions", val_inputs, mine, None, dry_run=True,
                run_id="apo-dry")
    users = [c for c in dry["candidates"] if c["source"] == "user"]
    best_mine = max(users, key=lambda c: c["score"] or 0.0)
    # 3. The held-out questions: the incumbent now (published by 1, or still version 0), version 0, the best of 2.
    published = llm["published_version"] is not None
    seeds = ([start_config] if published else []) + [best_mine["config"]]
    held = phase("3. held-out: the prompts side by side on questions never used above", held_inputs, seeds, None,
                 dry_run=True, run_id="apo-heldout")
    cands = held["candidates"]
    now, rest = cands[0], cands[1:]
    start = rest[0] if published else now
    labelled = [("starting prompt (version 0)", start)]
    if published:
        labelled.append((f"published by APO (version {llm['published_version']})", now))
    labelled.append(("best hand-written (dry run)", rest[-1]))
    say("[bold]held-out execution accuracy[/bold] (greedy, same questions, paired standard error of the difference)")
    for label, c in labelled:
        line = f"  {label:<36} {c['score']:.1%} ± {c['score_se']:.1%}"
        if c is not start:
            d, se = paired_difference(start["rewards"], c["rewards"])
            line += f"   vs start {d * 100:+.1f} ± {se * 100:.1f} points"
        say(line)
    say(f"  starting prompt:  {_one_line(sql.render(start_config['template']).split(chr(10))[0])} … + {len(sql.EXAMPLES)} examples")
    if published:
        say(f"  published prompt: {_one_line(now['config']['template'])}")
    say(f"  best hand-written: {_one_line(best_mine['config']['template'])} (+ {len(json.loads(best_mine['config']['examples']))} examples)")
    say(f"done in {time.monotonic() - t_start:.0f}s. The record: .venv/bin/rolloutbus query "
        "\"SELECT run_id, candidate_id, source, round, score, published_version FROM prompt_candidates FINAL ORDER BY created_ns\"")
    return 0
