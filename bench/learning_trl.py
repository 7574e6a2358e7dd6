"""Learning benchmark baseline: TRL's GRPOTrainer on the SQL task, on CPU, under a wall-clock budget.

Runs INSIDE the TRL virtualenv (``bench/trl_venv.py``; TRL cannot share the project venv), so it
imports nothing from ``rolloutbus``: the reward, execution match on the question's SQLite database,
comes from ``rolloutbus/demo/sql.py`` loaded by path.

    PY=$(.venv/bin/python -m bench.trl_venv)
    $PY bench/learning_trl.py --model ~/.rolloutbus/models/smollm2-135m-instruct \\
        --train train.jsonl --minutes 3 --out /tmp/trl-run

``--train`` is JSONL, one question a line: ``{"prompt": [chat messages], "qid", "db", "gold"}`` (and
optionally ``level``, ``question``). Writes ``<out>/final`` (a plain HF directory, safetensors) and
``<out>/summary.json``: steps, rollouts, where the time went, reward by step, the config and every
knob where this run differs from the project's own GRPO trainer.

Timing: ``generation_s`` is time inside the policy's ``generate`` (wrapped on the model instance);
``scoring_s`` the rest of TRL's ``_generate_and_score_completions`` (tokenising, rewards, reference
log-probs; ``ref_forward_s``, the reference model's forward, is part of it); ``training_s`` the rest
of each optimiser step (forward/backward, clip, AdamW), from ``on_step_begin`` to ``on_step_end``;
``other_s`` what ``train()`` spent outside steps; ``wall_s`` the whole ``train()`` call; ``cpu_s``
the process's user+system CPU seconds over it.
"""

from __future__ import annotations

import os

# Before transformers/huggingface_hub are imported: nothing in this run may touch the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any, Callable  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SQL_PY = ROOT / "rolloutbus" / "demo" / "sql.py"


def load_sql(path: Path = SQL_PY) -> ModuleType:
    """The SQL task module, by path (the TRL venv does not have the ``rolloutbus`` package)."""
    spec = importlib.util.spec_from_file_location("rolloutbus_bench_sql", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot load the SQL task from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def completion_text(completion: Any) -> str:
    """A TRL completion as text: conversational (a list of messages) or plain."""
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    return str(completion)


def make_reward(sql: ModuleType, last: list[dict[str, Any]] | None = None) -> Callable[..., list[float]]:
    """TRL reward function: ``sql.score`` (execution match) per completion; ``last`` gets the latest batch.

    TRL passes every dataset column but ``prompt`` as a keyword argument, one value per completion
    (``GRPOTrainer._calculate_rewards``), so qid/level/question/gold/db arrive here.
    """
    def execution_match(completions: list[Any], qid: list[str], gold: list[str], level: list[int],
                        question: list[str], db: list[str], **_: Any) -> list[float]:
        out = []
        for i, completion in enumerate(completions):
            text = completion_text(completion)
            row = {"qid": qid[i], "level": level[i], "question": question[i], "gold": gold[i], "db": db[i]}
            out.append(float(sql.score(sql.Question.from_json(row), text)))
        if last is not None:
            last[:] = [{"qid": q, "completion": completion_text(c), "reward": r} for q, c, r in zip(qid, completions, out)]
        return out

    return execution_match


def read_train(path: Path) -> list[dict[str, Any]]:
    """The JSONL training questions, each with the columns the reward needs (defaults filled in)."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            prompt = d["prompt"]
            question = d.get("question") or next(m["content"] for m in reversed(prompt) if m["role"] == "user")
            rows.append({"prompt": prompt, "qid": str(d["qid"]), "db": str(d.get("db") or "company"),
                         "gold": str(d["gold"]), "level": int(d.get("level", 0)), "question": str(question)})
        except (ValueError, KeyError, TypeError, StopIteration) as exc:
            raise SystemExit(f"error: {path}:{n}: need prompt (chat messages with a user turn), qid and gold: {exc!r}") from exc
    if not rows:
        raise SystemExit(f"error: {path} holds no questions")
    return rows


# The project's trainer, for the comparison (trainer/grpo.py, trainer/torch_backend.py, trainer/model.py).
OURS = {
    "optimizer": "torch.optim.AdamW, lr 1e-4, weight decay 0, betas (0.9, 0.999), constant lr",
    "grad_clip": 1.0,
    "kl": "beta 0.02, k3 estimator exp(d)-d-1 with d=ref-logp clamped to [-20, 20], at most 10 per token; no ratio factor",
    "ppo_clip": "0.2 symmetric, ratio against the sampler's behaviour log-probs (async, up to max_staleness versions old)",
    "advantages": "(R - mean) / (std + 1e-6), population std (divide by n), per group",
    "loss_agg": "grpo: per-sequence token mean, then mean over sequences",
    "batch": "one optimiser step per 2 groups of 4 completions",
    "trained": "top 10 of 30 decoder layers + final norm (embeddings, lm_head, lower layers frozen)",
    "sampling": "temperature 0.7, max 48 new tokens, served by rolloutbus serve",
}


def _name(value: Any) -> str:
    """An enum's value (``OptimizerNames.ADAMW_TORCH_FUSED`` → ``adamw_torch_fused``), else ``str``."""
    return str(getattr(value, "value", value))


def deviations(cfg: Any, args: argparse.Namespace) -> list[dict[str, str]]:
    """Every knob where TRL's default, or this run, differs from the project's trainer."""
    return [
        {"knob": "learning_rate", "trl_default": "1e-6", "this_run": str(cfg.learning_rate), "ours": "1e-4"},
        {"knob": "lr_scheduler_type", "trl_default": "linear (decay to 0 at max_steps)",
         "this_run": _name(cfg.lr_scheduler_type),
         "ours": "constant"},
        {"knob": "beta (KL)", "trl_default": "0.0 (no reference model)", "this_run": str(cfg.beta), "ours": "0.02"},
        {"knob": "KL estimator", "trl_default": "k3, unclamped, times the importance ratio (use_bias_correction_kl=True)",
         "this_run": f"same (use_bias_correction_kl={cfg.use_bias_correction_kl})", "ours": "k3 clamped, no ratio factor"},
        {"knob": "loss_type", "trl_default": "dapo: token sum / active tokens of the whole batch", "this_run": cfg.loss_type,
         "ours": "grpo: per-sequence mean, then mean over sequences"},
        {"knob": "scale_rewards", "trl_default": "group: (R-mean)/(std+1e-4), unbiased std (n-1)",
         "this_run": str(cfg.scale_rewards),
         "ours": "(R-mean)/(std+1e-6), population std: TRL's advantages are sqrt(3/4)=0.87x ours at n=4"},
        {"knob": "PPO ratio", "trl_default": "num_iterations=1 and steps_per_generation=1: old log-probs = current, detached",
         "this_run": f"num_iterations={cfg.num_iterations}, steps_per_generation={cfg.steps_per_generation}: "
                     "ratio == 1, clip never bites",
         "ours": "ratio against the sampler's log-probs (off-policy by up to max_staleness versions)"},
        {"knob": "epsilon (clip)", "trl_default": "0.2 (epsilon_high 0.2)", "this_run": f"{cfg.epsilon}", "ours": "0.2"},
        {"knob": "num_generations", "trl_default": "8", "this_run": str(cfg.num_generations), "ours": str(args.group_size)},
        {"knob": "per_device_train_batch_size (completions)", "trl_default": "8",
         "this_run": str(cfg.per_device_train_batch_size), "ours": f"{args.group_size * args.groups_per_step} ({args.groups_per_step} groups of {args.group_size})"},
        {"knob": "max_completion_length", "trl_default": "512", "this_run": str(cfg.max_completion_length), "ours": "48"},
        {"knob": "temperature", "trl_default": "1.0 (top_p 1.0, top_k 0)", "this_run": str(cfg.temperature), "ours": str(args.temperature)},
        {"knob": "logprob temperature", "trl_default": "training log-probs use logits / temperature",
         "this_run": f"logits / {cfg.temperature}", "ours": "logits / train_temperature (settings; default 1.0)"},
        {"knob": "trainable parameters", "trl_default": "all (embeddings, every layer, norm, lm_head)",
         "this_run": f"top {args.train_layers} decoder layers + final norm "
                     "(frozen before GRPOTrainer; its optimizer takes requires_grad params only)",
         "ours": "top 10 of 30 layers + final norm"},
        {"knob": "gradient_checkpointing", "trl_default": "True", "this_run": str(cfg.gradient_checkpointing), "ours": "off"},
        {"knob": "bf16", "trl_default": "True when fp16 is unset (autocast, also on CPU)", "this_run": str(cfg.bf16), "ours": "float32"},
        {"knob": "optim", "trl_default": "adamw_torch_fused (transformers on torch >= 2.8)", "this_run": _name(cfg.optim),
         "ours": "torch.optim.AdamW (unfused)"},
        {"knob": "logging_steps", "trl_default": "10", "this_run": str(cfg.logging_steps), "ours": "every step"},
        {"knob": "rollout schedule", "trl_default": "synchronous: generate with the current weights, then one step",
         "this_run": "same", "ours": "asynchronous workers over Kafka, staleness-weighted batches"},
    ]


@dataclass
class Timings:
    """Seconds per phase, filled by the wrappers and the callback."""

    generation_s: float = 0.0
    generate_and_score_s: float = 0.0
    ref_s: float = 0.0
    rollouts: int = 0
    generate_calls: int = 0
    step_s: list[float] = field(default_factory=list)
    step_gen_s: list[float] = field(default_factory=list)

    def timed(self, fn: Callable[..., Any], attr: str, count: bool = False) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                setattr(self, attr, getattr(self, attr) + time.perf_counter() - t0)
                if count:
                    self.generate_calls += 1
                    ids = kw.get("input_ids", a[0] if a else None)
                    self.rollouts += int(ids.shape[0]) if hasattr(ids, "shape") else 0
        return wrapper


def build_callback(budget_s: float, timings: Timings) -> Any:
    from transformers import TrainerCallback

    class Budget(TrainerCallback):  # type: ignore[misc]
        """Stops at the wall-clock budget (a step in progress finishes); records per-step time; prints progress."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.step_t0 = time.perf_counter()
            self.gen_t0 = timings.generate_and_score_s

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            timings.step_s.append(time.perf_counter() - self.step_t0)
            timings.step_gen_s.append(timings.generate_and_score_s - self.gen_t0)
            if time.perf_counter() - self.t0 >= budget_s:
                control.should_training_stop = True

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            if logs and "reward" in logs:
                print(f"step {state.global_step:4d}  reward {logs['reward']:.3f}  kl {logs.get('kl', 0.0):.4f}  "
                      f"len {logs.get('completions/mean_length', 0.0):5.1f}  step {timings.step_s[-1] if timings.step_s else 0:5.1f}s  "
                      f"elapsed {time.perf_counter() - self.t0:6.1f}s", flush=True)

    return Budget()


def train_top_layers(model: Any, layers: int) -> int:
    """As the project's ``trainer.model.train_top_layers``: only the top ``layers`` decoder layers and the
    final norm train; embeddings, lower layers and lm_head (tied to the embeddings here) are frozen."""
    if layers <= 0:
        return sum(p.numel() for p in model.parameters())
    decoder = model.get_decoder()
    for p in model.parameters():
        p.requires_grad_(False)
    for module in [*list(decoder.layers)[-layers:], getattr(decoder, "norm", None)]:
        if module is not None:
            for p in module.parameters():
                p.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def print_table(summary: dict[str, Any]) -> None:
    rows = [("steps", summary["steps"]), ("rollouts", summary["rollouts"]),
            ("steps/min", f"{summary['steps_per_min']:.2f}"), ("rollouts/min", f"{summary['rollouts_per_min']:.1f}"),
            ("wall_s (train())", f"{summary['wall_s']:.1f}"), ("cpu_s", f"{summary['cpu_s']:.1f}"),
            ("generation_s", f"{summary['generation_s']:.1f}"), ("scoring_s", f"{summary['scoring_s']:.1f}"),
            ("  of which ref_forward_s", f"{summary['ref_forward_s']:.1f}"),
            ("training_s (fwd/bwd/AdamW)", f"{summary['training_s']:.1f}"), ("other_s", f"{summary['other_s']:.1f}"),
            ("reward first/last 5 steps", f"{summary['reward_first5']:.3f} / {summary['reward_last5']:.3f}")]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print("\nknob | TRL default | this run | ours")
    for d in summary["deviations"]:
        print(f"{d['knob']} | {d['trl_default']} | {d['this_run']} | {d['ours']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="local HF model directory")
    ap.add_argument("--train", type=Path, required=True, help="JSONL: prompt, qid, db, gold (level, question optional)")
    ap.add_argument("--minutes", type=float, required=True, help="wall-clock training budget")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--beta", type=float, default=0.02)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-completion-length", type=int, default=48)
    ap.add_argument("--train-layers", type=int, default=10, help="train only the top N decoder layers (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch
    torch.set_num_threads(args.threads)
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    sql = load_sql()
    if not hasattr(sql, "score"):
        raise SystemExit(f"error: {SQL_PY} has no score(question, reply); it needs the multi-database SQL task")
    rows = read_train(args.train)
    model_dir = str(args.model.expanduser().resolve())
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    trainable = train_top_layers(model, args.train_layers)
    total = sum(p.numel() for p in model.parameters())

    batch = args.group_size * args.groups_per_step
    cfg = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        use_cpu=True, bf16=False, fp16=False,
        num_generations=args.group_size,
        per_device_train_batch_size=batch,  # completions per step: groups_per_step prompts x group_size
        steps_per_generation=1,  # one generation batch per optimiser step
        gradient_accumulation_steps=1,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        beta=args.beta,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        max_steps=1_000_000,  # the wall-clock callback stops it
        logging_steps=1, save_strategy="no", report_to="none",
        dataloader_num_workers=0, dataloader_pin_memory=False,
        seed=args.seed, disable_tqdm=True,
    )
    timings, samples = Timings(), []
    trainer = GRPOTrainer(model=model, reward_funcs=make_reward(sql, samples), args=cfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[build_callback(args.minutes * 60, timings)])
    trainer.remove_callback(PrinterCallback)  # it prints each log dict; the Budget callback prints one line a step
    # Time the policy's sampling and TRL's whole rollout phase, on the instances (no subclassing).
    trainer.model.generate = timings.timed(trainer.model.generate, "generation_s", count=True)
    trainer._generate_and_score_completions = timings.timed(trainer._generate_and_score_completions, "generate_and_score_s")
    if trainer.ref_model is not None:  # beta > 0: TRL loads a second copy from --model for the KL term
        trainer.ref_model.forward = timings.timed(trainer.ref_model.forward, "ref_s")

    print(f"trl {trl.__version__}, torch {torch.__version__} ({args.threads} threads): {len(rows)} questions, "
          f"{trainable:,} of {total:,} parameters trained, budget {args.minutes:g} min", flush=True)
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)

    del trainer.model.generate  # the instance wrapper; the class's generate again
    trainer.model.config.use_cache = True  # the Trainer turns it off for training; a server wants it on
    final = args.out / "final"
    trainer.model.save_pretrained(final, safe_serialization=True)
    tokenizer.save_pretrained(final)

    reward_by_step = [{"step": int(h["step"]), "reward": h["reward"], "reward_std": h.get("reward_std"),
                       "kl": h.get("kl"), "mean_length": h.get("completions/mean_length"),
                       "frac_reward_zero_std": h.get("frac_reward_zero_std")}
                      for h in trainer.state.log_history if "reward" in h]
    steps = trainer.state.global_step
    step_total = sum(timings.step_s)
    rewards = [r["reward"] for r in reward_by_step]
    summary = {
        "steps": steps, "rollouts": timings.rollouts, "generate_calls": timings.generate_calls,
        "steps_per_min": steps / (wall / 60), "rollouts_per_min": timings.rollouts / (wall / 60),
        "wall_s": wall, "cpu_s": cpu,
        "generation_s": timings.generation_s,
        "scoring_s": timings.generate_and_score_s - timings.generation_s,
        "ref_forward_s": timings.ref_s,
        "training_s": step_total - sum(timings.step_gen_s),
        "other_s": wall - step_total,
        "step_s": timings.step_s,
        "reward_first5": sum(rewards[:5]) / max(len(rewards[:5]), 1),
        "reward_last5": sum(rewards[-5:]) / max(len(rewards[-5:]), 1),
        "reward_by_step": reward_by_step,
        "versions": {"trl": trl.__version__, "torch": torch.__version__},
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "questions": len(rows), "trainable_params": trainable, "total_params": total,
                   "reward": "sql.score: execution match on the question's database",
                   "grpo_config": {k: getattr(cfg, k) for k in (
                       "num_generations", "per_device_train_batch_size", "generation_batch_size", "steps_per_generation",
                       "gradient_accumulation_steps", "max_completion_length", "temperature", "top_p", "top_k", "beta",
                       "learning_rate", "loss_type", "scale_rewards", "epsilon", "epsilon_high", "num_iterations",
                       "use_bias_correction_kl", "max_grad_norm", "weight_decay", "adam_beta1", "adam_beta2",
                       "adam_epsilon", "gradient_checkpointing", "bf16", "seed")} | {
                       "optim": _name(cfg.optim), "lr_scheduler_type": _name(cfg.lr_scheduler_type)}},
        "ours": OURS,
        "deviations": deviations(cfg, args),
        "last_batch": samples,
        "final_model": str(final),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print()
    print_table(summary)
    print(f"\nmodel: {final}\nsummary: {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
