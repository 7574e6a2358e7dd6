"""Learning side by side: rolloutbus's loop against TRL's ``GRPOTrainer``, same model, same cores, same minutes.

``make bench-learning`` (or ``python -m bench.bench_learning``). Every row trains SmolLM2-135M-Instruct on the
same training questions of the multi-database Text-to-SQL task (``rolloutbus/demo/sql.py``), for the same
wall-clock budget, on this machine's cores, and is evaluated the same way: the held-out questions (new questions
on the training databases, and databases never trained on), greedy, through ``rolloutbus serve`` and the SQL
agent — version 0 once per form, then the version each system ends with:

- ``rolloutbus, single-turn``: the full loop (runners → proxy → serve, Kafka, stream processor, trainer), the
  agent answering with one SQL query; the version kept is the one that won validation;
- ``TRL GRPOTrainer, single-turn``: ``bench/learning_trl.py`` in its own virtualenv (``bench/trl_venv.py``), the
  same prompts and reward, its last weights (TRL keeps no validation winner);
- ``rolloutbus, multi-turn``: the demo's agent (rewrites after an error), a further row.

Prints a table and writes ``bench/results/learning-<date>.md`` (and ``.json`` with every run). Runs one after
the other, nothing else should run on the machine meanwhile: wall-clock is the measure.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT
from producers.settings import feeder_choices, feeder_default
from rolloutbus.demo.config import DemoConfig

DEMO_TEMPERATURE = DemoConfig.temperature  # the SQL rows' sampling temperature unless --temperature says otherwise
GROUP_SIZE, GROUPS_PER_STEP = 4, 2  # the SQL rows' groups unless --group-size / --groups-per-step say otherwise

SYSTEMS = ("rolloutbus-single", "trl-single", "rolloutbus-multi", "rolloutbus-vllm-single", "rolloutbus-vllm-multi")
LABELS = {"rolloutbus-single": "rolloutbus, single-turn", "trl-single": "TRL GRPOTrainer, single-turn",
          "rolloutbus-multi": "rolloutbus, multi-turn agent", "rolloutbus-vllm-single": "rolloutbus + vLLM, single-turn",
          "rolloutbus-vllm-multi": "rolloutbus + vLLM, multi-turn agent"}
DEFAULT_SYSTEMS = SYSTEMS[:3]  # the vLLM rows need `make vllm`'s virtualenv (6.2 GB): asked for by --systems


def demo_config(args: argparse.Namespace, single_turn: bool, run: int, out: Path, engine: str = "torch") -> Any:
    """The demo's SQL run as every row trains it; ``engine`` serves the policy, for training and for evaluation
    (version 0 is scored by each engine's own server: vLLM samples in bfloat16, torch's serve in float32)."""
    return DemoConfig(task="sql", minutes=args.minutes, group_size=getattr(args, "group_size", GROUP_SIZE), runners=16,
                      groups_per_step=getattr(args, "groups_per_step", GROUPS_PER_STEP), held_out=args.held_out,
                      lr=1e-4, kl_beta=0.02, seed=0, out=out, dashboard=False, train_layers=10,
                      temperature=getattr(args, "temperature", None) or DEMO_TEMPERATURE,
                      single_turn=single_turn, validation=args.validation, validate_every=args.validate_every,
                      engine=engine, keep_running=True, task_selection=getattr(args, "task_selection", "all"),
                      pace=getattr(args, "pace", "generation"), backlog=getattr(args, "backlog", "oldest"),
                      updates_per_batch=getattr(args, "updates_per_batch", 1), mini_batches=getattr(args, "mini_batches", 1),
                      train_questions=getattr(args, "train_questions", 0), sql_reward=getattr(args, "sql_reward", "match"),
                      **credit_of(args))  # one broker for every run (each demo run recreates its topics); stopped at the end


def credit_of(args: argparse.Namespace) -> dict[str, Any]:
    """The stream worker's credit settings a row asked for (--credit, --gamma, --reward-rules); the demo's own where not."""
    given = {k: getattr(args, k, None) for k in ("credit", "gamma", "reward_rules")}
    return {k: v for k, v in given.items() if v is not None}


def mean_of(scores: list[float], idx: list[int] | None = None) -> float:
    xs = [scores[i] for i in idx] if idx is not None else scores
    return sum(xs) / len(xs) if xs else 0.0


def run_rolloutbus(args: argparse.Namespace, system: str, run: int, out: Path, first: dict[str, list[float]]) -> dict[str, Any]:
    from rolloutbus.demo.driver import run_demo_result

    single, engine = system.endswith("-single"), "vllm" if "-vllm-" in system else "torch"
    key = ("single" if single else "multi") + ("" if engine == "torch" else f"-{engine}")
    cfg = demo_config(args, single, run, out, engine)
    t0 = time.monotonic()
    res = run_demo_result(cfg, first_scores=first.get(key))
    first.setdefault(key, res.first_scores)
    return {"first_scores": res.first_scores, "final_scores": res.chosen_scores, "subsets": res.subsets,
            "version": res.chosen, "last_version": res.final, "validation": {str(k): v for k, v in res.validation.items()},
            "steps": res.steps, "rollouts": res.rollouts, "train_s": res.train_s, "wall_s": time.monotonic() - t0,
            "step_time_s": res.step_time_s, "cpu_s": res.cpu_s, "early_stopped": res.early_stopped, "tokens": res.tokens,
            "samples": res.samples, "trained_rollouts": res.steps * cfg.groups_per_step * cfg.group_size,
            "groups": res.groups, "groups_teaching": res.groups_teaching, "task_selection": cfg.task_selection, "pace": cfg.pace,
            "group_size": cfg.group_size, "groups_per_step": cfg.groups_per_step, "temperature": cfg.temperature,
            "backlog": cfg.backlog, "updates_per_batch": cfg.updates_per_batch, "mini_batches": cfg.mini_batches, "train_questions": cfg.train_questions, "sql_reward": cfg.sql_reward, "staleness": res.staleness, "skipped_backlog": res.skipped_backlog,
            # the credit settings when the row asked for them (--credit, --gamma, --reward-rules): its label names them
            **({"credit": cfg.credit, "gamma": cfg.gamma, "reward_rules": str(cfg.reward_rules) if cfg.reward_rules else None}
               if credit_of(args) else {})}


def run_trl(args: argparse.Namespace, run: int, out: Path, first: dict[str, list[float]]) -> dict[str, Any]:
    from rolloutbus.demo import sql
    from rolloutbus.demo.driver import evaluate_model
    from trainer.model_import import import_model
    from foundation.config import CommonSettings, load_settings
    from bench.trl_venv import ensure_trl_venv

    t0 = time.monotonic()
    python = ensure_trl_venv()
    settings = load_settings(CommonSettings, {})
    model = import_model("smollm2-135m-instruct", settings.data_dir / "models")
    cfg = demo_config(args, True, run, out)
    cfg.sql_reward = "match"  # TRL's reward function is execution match (learning_trl.py): its evaluation says so too
    _split, train = sql.demo_split(cfg.held_out, cfg.validation, cfg.train_questions, seed=cfg.seed)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "train.jsonl"
    with data.open("w") as f:
        # the same questions rolloutbus trains on (its validation set is not trained on either)
        for q in train:
            f.write(json.dumps({"prompt": sql.question_messages(q), "qid": q.qid, "db": q.db, "gold": q.gold,
                                "level": q.level, "question": q.text}) + "\n")
    trl_out = out / "trl"
    cmd = [str(python), str(ROOT / "bench" / "learning_trl.py"), "--model", str(model), "--train", str(data),
           "--minutes", str(args.minutes), "--group-size", str(cfg.group_size), "--groups-per-step", str(cfg.groups_per_step),
           "--lr", str(cfg.lr), "--beta", str(cfg.kl_beta), "--temperature", str(cfg.temperature),
           "--max-completion-length", "48", "--train-layers", str(cfg.train_layers), "--threads", str(os.cpu_count() or 2),
           "--seed", str(run), "--out", str(trl_out)]  # the rolloutbus rows' settings, as the bench's flags set them
    print("trl        " + " ".join(cmd), flush=True)
    with (out / "trl.log").open("w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.minutes * 60 + 1800,
                              env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    if proc.returncode != 0:
        tail = (out / "trl.log").read_text(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"TRL run failed ({proc.returncode}):\n" + "\n".join(tail))
    summary = json.loads((trl_out / "summary.json").read_text())
    scores, _problems, subsets = evaluate_model(cfg, str(trl_out / "final"), f"trl-{run}")
    if "single" not in first:
        first["single"], _p, _s = evaluate_model(cfg, str(model), "version0-single")
    return {"first_scores": first["single"], "final_scores": scores, "subsets": subsets, "version": None,
            "steps": summary.get("steps"), "rollouts": summary.get("rollouts"), "train_s": summary.get("wall_s"),
            "wall_s": time.monotonic() - t0, "generation_s": summary.get("generation_s"), "training_s": summary.get("training_s"),
            "cpu_s": {"trl": summary.get("cpu_s")}, "trl": summary, "group_size": cfg.group_size,
            "groups_per_step": cfg.groups_per_step, "temperature": cfg.temperature, "train_questions": cfg.train_questions}


def paired_se(a: list[float], b: list[float]) -> float:
    d = [y - x for x, y in zip(a, b)]
    return statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else 0.0


def spread(xs: list[float], fmt: str = "{:+.1f}") -> str:
    if not xs:
        return "—"
    m = statistics.fmean(xs)
    return f"{fmt.format(m)} ({', '.join(fmt.format(x) for x in xs)})" if len(xs) > 1 else fmt.format(m)


def teaching_groups(r: dict[str, Any]) -> float:
    """Groups with mixed rewards (the only ones with an advantage) that optimiser steps trained on."""
    if "trl" in r:
        per_step = r.get("groups_per_step", GROUPS_PER_STEP)
        return sum(per_step * (1.0 - float(st.get("frac_reward_zero_std", 1.0))) for st in r["trl"].get("reward_by_step", []))
    # rolloutbus trains with --skip-zero-variance: every group of a step teaches
    return float(r.get("groups_per_step", GROUPS_PER_STEP)) * (r.get("steps") or 0)


def label(system: str, r: dict[str, Any]) -> str:
    """The row's name, with its task selection when it is not every question in turn."""
    sel, pace, backlog = r.get("task_selection", "all"), r.get("pace", "generation"), r.get("backlog", "oldest")
    rules = r.get("reward_rules")
    credit = (f", credit {r['credit']}" + (f" (γ {r['gamma']:g})" if r["credit"] == "discounted" else "")
              + (f", rules {Path(rules).name}" if rules else "") if r.get("credit") else "")
    return (LABELS[system] + ("" if sel == "all" else f", task selection {sel}")
            + ("" if r.get("group_size", GROUP_SIZE) == GROUP_SIZE
               else f", groups of {r['group_size']}, {r.get('groups_per_step', GROUPS_PER_STEP)} a step")
            + ("" if r.get("temperature", DEMO_TEMPERATURE) == DEMO_TEMPERATURE else f", temperature {r['temperature']:g}")
            + (f", {r['train_questions']} training questions" if r.get("train_questions") else "")
            + ("" if r.get("sql_reward", "match") == "match" else f", reward {r['sql_reward']}")
            + ("" if pace == "generation" else f", paced by the {pace}") + ("" if backlog == "oldest" else f", backlog {backlog}")
            + ("" if r.get("updates_per_batch", 1) == 1 else f", {r['updates_per_batch']} updates a batch")
            + ("" if r.get("mini_batches", 1) == 1 else f", {r['mini_batches']} mini-batches a batch")
            + credit)


def table(results: dict[str, list[dict[str, Any]]], minutes: float) -> str:
    head = ("| system | runs | held-out before → after (mean) | gain, points (runs) | gain per training minute | "
            "unseen databases before → after | rollouts / min | optimiser steps / min | groups that teach / min | whole run, min |")
    lines = [head, "|" + "---|" * 10]
    for system, runs in results.items():
        if not runs:
            continue
        unseen_key = "databases never trained on"
        gains = [100 * (mean_of(r["final_scores"]) - mean_of(r["first_scores"])) for r in runs]
        before = statistics.fmean(mean_of(r["first_scores"]) for r in runs)
        after = [mean_of(r["final_scores"]) for r in runs]
        ub = statistics.fmean(mean_of(r["first_scores"], r["subsets"].get(unseen_key)) for r in runs)
        ua = statistics.fmean(mean_of(r["final_scores"], r["subsets"].get(unseen_key)) for r in runs)
        per_min = [g / minutes for g in gains]
        rpm = [r["rollouts"] / (r["train_s"] / 60) for r in runs if r.get("rollouts") and r.get("train_s")]
        spm = [r["steps"] / (r["train_s"] / 60) for r in runs if r.get("steps") is not None and r.get("train_s")]
        wall = [r["wall_s"] / 60 for r in runs]
        tpm = [teaching_groups(r) / (r["train_s"] / 60) for r in runs if r.get("train_s")]
        lines.append(f"| {label(system, runs[0])} | {len(runs)} | {before:.1%} → {statistics.fmean(after):.1%} | {spread(gains)} | "
                     f"{spread(per_min, '{:+.2f}')} | {ub:.1%} → {ua:.1%} | {spread(rpm, '{:.1f}')} | {spread(spm, '{:.2f}')} | "
                     f"{spread(tpm, '{:.2f}')} | {spread(wall, '{:.1f}')} |")
    return "\n".join(lines)


def where_time_goes(results: dict[str, list[dict[str, Any]]]) -> str:
    out = []
    for system, runs in results.items():
        for i, r in enumerate(runs, 1):
            if system == "trl-single":
                t = r.get("trl", {})
                out.append(f"- {LABELS[system]}, run {i}: train() {r['train_s']:.0f} s = generation {t.get('generation_s') or 0:.0f} s "
                           f"+ scoring {t.get('scoring_s') or 0:.0f} s (rewards, reference model {t.get('ref_forward_s') or 0:.0f} s) "
                           f"+ optimiser steps {t.get('training_s') or 0:.0f} s + other {t.get('other_s') or 0:.0f} s, one after "
                           f"the other; CPU {r['cpu_s'].get('trl') or 0:.0f} s; {r['steps']} steps, {r['rollouts']} completions")
            else:
                cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.get("cpu_s", {}).items(), key=lambda kv: -kv[1]))
                val = ", ".join(f"v{k} {v:.0%}" for k, v in r.get("validation", {}).items())
                trainer_cpu = r.get("cpu_s", {}).get("train") or 0.0
                trained = (f"; trained on {r['trained_rollouts']} of them ({r['trained_rollouts'] / r['rollouts']:.0%}), "
                           f"{r['tokens']:.0f} tokens, {r['tokens'] / trainer_cpu:.0f} per trainer CPU-second"
                           if r.get("tokens") and trainer_cpu and r.get("rollouts") else "")
                if r.get("staleness") is not None:
                    trained += (f"; batches {r['staleness']:.2f} versions old on average, "
                                f"{r.get('skipped_backlog', 0):.0f} waiting groups skipped (backlog {r.get('backlog', 'oldest')})")
                if r.get("groups"):
                    trained += (f"; {r['groups_teaching']} of {r['groups']} groups generated taught "
                                f"({r['groups_teaching'] / r['groups']:.0%}, task selection {r.get('task_selection', 'all')})")
                out.append(f"- {label(system, r)}, run {i}: {r['train_s']:.0f} s of training, optimiser steps {r['step_time_s']:.0f} s "
                           f"of it (the trainer, one thread, while serve generates); CPU s by process (with its children: "
                           f"serve's vLLM engine): {cpu}; {r['steps']} steps, {r['rollouts']} training rollouts{trained}; "
                           f"validation {val or '—'}: version "
                           f"{r['version']} kept (last {r['last_version']})" + (" — early stop" if r.get("early_stopped") else ""))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="training budget per run (wall clock)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    p.add_argument("--held-out", type=int, default=90, help="held-out questions (a third on the training databases)")
    p.add_argument("--validation", type=int, default=20, help="validation questions per version (rolloutbus rows)")
    p.add_argument("--validate-every", type=int, default=1)
    p.add_argument("--task-selection", choices=feeder_choices("task_selection"), default=feeder_default("task_selection"),
                   help="the rolloutbus rows' feeder: every question in turn, or by what teaches (the demo's --task-selection)")
    p.add_argument("--pace", choices=feeder_choices("pace"), default=feeder_default("pace"),
                   help="the rolloutbus rows' feeder keeps tasks ahead of generation or of the trainer (the demo's --pace)")
    from foundation.config import choices_of, default_of, setting_bounds
    from foundation.flags import Bounded
    from trainer.settings import TrainerSettings

    p.add_argument("--temperature", type=Bounded(float, gt=0),
                   help="every row's sampling temperature of training rollouts (the demo's --temperature; default the demo's)")
    p.add_argument("--group-size", type=Bounded(int, ge=1), default=GROUP_SIZE,
                   help="every row's rollouts per task (the demo's --group-size; TRL's num_generations)")
    p.add_argument("--groups-per-step", type=Bounded(int, ge=1), default=GROUPS_PER_STEP,
                   help="every row's groups per optimiser step")
    p.add_argument("--train-questions", type=Bounded(int, ge=0), default=0,
                   help="every row trains on this many of the training questions, so each comes round more often in a "
                        "run (the demo's --train-questions; default 0: all)")
    p.add_argument("--backlog", choices=choices_of(TrainerSettings, "backlog"),
                   default=default_of(TrainerSettings, "backlog"),
                   help="the rolloutbus rows' trainer: which waiting groups a step takes (the demo's --backlog)")
    p.add_argument("--updates-per-batch", type=Bounded(int, **setting_bounds(TrainerSettings, "updates_per_batch")),
                   default=default_of(TrainerSettings, "updates_per_batch"),
                   help="the rolloutbus rows' trainer: optimiser updates on each batch (the demo's --updates-per-batch)")
    p.add_argument("--mini-batches", type=Bounded(int, **setting_bounds(TrainerSettings, "mini_batches")),
                   default=default_of(TrainerSettings, "mini_batches"),
                   help="the rolloutbus rows' trainer: optimiser steps on each pass over a batch (the demo's --mini-batches)")
    from streams.credit import CREDIT

    p.add_argument("--credit", choices=CREDIT.names(), help="the rolloutbus rows' credit mode (the demo's --credit; "
                   "default the demo's: identical)")
    p.add_argument("--gamma", type=float, help="the discount of --credit discounted (the demo's --gamma)")
    p.add_argument("--reward-rules", type=Path, help="the stream worker's reward rules file (the demo's --reward-rules; "
                   "default every automatic rule off), e.g. deploy/rewards/sql.toml")
    from rolloutbus.demo.sql import REWARDS

    p.add_argument("--sql-reward", choices=list(REWARDS), default="match",
                   help="the rolloutbus rows' training reward (the demo's --sql-reward; TRL's row keeps execution match); "
                        "held-out and validation questions are scored by execution match either way")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--work", type=Path, default=Path("bench-learning-output"))
    p.add_argument("--render", type=Path, help="print the table and time split of an earlier run's JSON, run nothing")
    args = p.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        minutes = float(saved["args"]["minutes"])
        print(table(saved["results"], minutes) + "\n\n## Where the time goes\n\n" + where_time_goes(saved["results"]))
        return 0
    from rolloutbus.demo import sql

    try:  # the held-out, validation and training questions fit the task's: one line, before any run
        sql.demo_split(args.held_out, args.validation, args.train_questions, seed=0)
    except ValueError as exc:
        p.error(str(exc))
    systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        p.error(f"unknown system(s) {bad}: choose from {SYSTEMS}")
    started = _dt.datetime.now().replace(microsecond=0)
    t0 = time.monotonic()
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    first: dict[str, list[float]] = {}
    raw = args.out / f"learning-{started.date()}.json"
    for run in range(args.runs):
        for system in systems:
            out = args.work / f"{system}-{run + 1}"
            print(f"\n=== {LABELS[system]}, run {run + 1} of {args.runs} ({args.minutes:g} min of training) ===", flush=True)
            if system == "trl-single":
                r = run_trl(args, run, out, first)
            else:
                r = run_rolloutbus(args, system, run, out, first)
            r["load_after"] = os.getloadavg()[0]
            results[system].append(r)
            args.out.mkdir(parents=True, exist_ok=True)
            raw.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1))
            print(table(results, args.minutes), flush=True)
    text = (f"# Learning side by side — {started.isoformat()}\n\n"
            f"`python -m bench.bench_learning --minutes {args.minutes:g} --runs {args.runs} --held-out {args.held_out} "
            f"--validation {args.validation}`, {(time.monotonic() - t0) / 60:.0f} min in all, runs one after the other "
            f"(each system once per round), {platform.machine()} with {os.cpu_count()} cores, nothing else running.\n\n"
            f"{table(results, args.minutes)}\n\n## Where the time goes\n\n{where_time_goes(results)}\n\nEvery run: {raw.name}.\n")
    subprocess.run([sys.executable, "-m", "rolloutbus.cli", "down"], check=False)
    md = args.out / f"learning-{started.date()}.md"
    md.write_text(text)
    print(f"\nwritten {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
