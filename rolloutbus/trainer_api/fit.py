"""``Trainer.fit``: the user's agent trained by the same commands the demo starts, on the local stack
(:func:`rolloutbus.runs.stack.local_stack`) or on given Kafka / ClickHouse addresses, always in a namespace of
the run's own (:mod:`rolloutbus.runs.scope`: nothing of an earlier run or of the demo is deleted): the
stream worker with the Trainer's ``agent_match`` / ``llm_call_match``, the policy server, the LLM proxy,
the trainer (GRPO, validation on ``val_dataset``), and ``n_runners`` rollouts at once running the agent,
shipped to them pickled (:mod:`rolloutbus.trainer_api.shipped`). Tasks are published a few steps ahead of
the trainer; the live table is the demo's. On return, an error or Ctrl-C, everything started stops.

With ``SFT(...)`` the runners first collect rollouts on the policy as it is (the server serves the model
given), then ``rolloutbus train --algorithm sft`` fine-tunes on the ones that pass its filter and publishes
its versions (:func:`_sft`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from foundation.config import CommonSettings, load_settings
from foundation.errors import ConfigError, RolloutbusError
from rolloutbus.localproc import free_port
from rolloutbus.runs.evaluation import evaluate, final_validator, version_uri
from rolloutbus.runs.live import Live, TaskFeeder, engine_args, engine_start_s, follow, served_lora_rank, wait_http
from rolloutbus.runs.scope import RunScope, check_given, given_addresses, prepare, run_scope, where_lines
from rolloutbus.runs.stack import local_stack, process_env
from rolloutbus.trainer_api.agent import Adapted
from rolloutbus.trainer_api.algorithms import GRPO, SFT
from rolloutbus.trainer_api.shipped import ENV as SHIPPED_ENV, ship



class Trainer(Protocol):
    """What a run takes from :class:`rolloutbus.trainer_api.trainer.Trainer`."""

    n_runners: int
    algorithm: Any
    agent_match: str | None
    llm_call_match: str | None
    resources: Mapping[str, Any]
    out: Path
    keep_store: bool
    engine: str
    say: Callable[[str], None]

AGENT_SPEC = "rolloutbus.trainer_api.shipped:agent"
# The stream worker's finish grace here: an agent that calls the model through LLM.get_base_url's proxy URL cannot count
# the proxy's spans, so each of its attempts waits this long after FINISHED for them (rolloutbus/trainer_api/resources.py).
# On one host the proxy's span follows within a second; the worker's default (10 s) is for producers further away.
FINISH_GRACE_S = 2.0


@dataclass
class Row:
    """A dataset row as the demo's task feeder takes a problem; a row with a ``"task_family"`` field is of that
    family (task selection pass-rate judges a row it has not seen by its family's recent rollouts)."""

    json: str

    def to_json(self) -> str:
        return self.json

    @property
    def family(self) -> str | None:
        try:
            row = json.loads(self.json)
        except ValueError:
            return None
        family = row.get("task_family") if isinstance(row, dict) else None
        return str(family) if family not in (None, "") else None

    @property
    def text(self) -> str:
        return self.json[:200]


@dataclass
class HeldOut:
    """``test_dataset`` answered greedily by version ``first`` (0: the policy as given) and version ``chosen`` (the
    best validated, else the last): the reward per task, in the dataset's order."""

    first: int
    chosen: int
    first_scores: list[float]
    chosen_scores: list[float]

    @property
    def first_mean(self) -> float:
        return sum(self.first_scores) / max(1, len(self.first_scores))

    @property
    def chosen_mean(self) -> float:
        return sum(self.chosen_scores) / max(1, len(self.chosen_scores))

    def difference(self) -> tuple[float, float]:
        """(mean of chosen - first over the same tasks, its paired standard error)."""
        from trainer.apo import paired_difference

        return paired_difference(self.first_scores, self.chosen_scores)

    def line(self) -> str:
        d, se = self.difference()
        return (f"v{self.first} {self.first_mean:.1%} -> v{self.chosen} {self.chosen_mean:.1%} on {len(self.first_scores)} tasks "
                f"({d * 100:+.1f} points, paired standard error {se * 100:.1f})")


@dataclass
class FitResult:
    steps: list[dict[str, Any]]
    versions: dict[int, dict[str, Any]]
    rewards_by_version: dict[int, list[float]]
    rollouts: int
    seconds: float
    warnings: list[str] = field(default_factory=list)
    validation: dict[int, float] = field(default_factory=dict)  # version -> mean validation reward (fully validated)
    chosen: int | None = None  # the version fit keeps: the best validated (GRPO with val_dataset), else the last
    held_out: HeldOut | None = None  # test_dataset before/after (fit's ``test_dataset``)
    run: str = ""  # the run's name: its topics ``<prefix>fit-<run>.*``, its database ``<database>_fit_<run>``
    database: str = ""  # where its rows are: ROLLOUTBUS_CLICKHOUSE_DATABASE=<database> rolloutbus query ...


def _model(llm: Any, settings: CommonSettings) -> str:
    """The policy to train: a local directory as it is, ``tiny``, else a packaged model imported (no hub)."""
    name = getattr(llm, "model", None) or "tiny"
    if name == "tiny" or Path(name).is_dir():
        return name
    from trainer.model_import import import_model

    return str(import_model(name, settings.data_dir / "models"))


def _max_steps(algo: Any, tasks: int) -> int | None:
    """The trainer's ``--max-steps``: ``max_steps``, or ``VERL``'s ``total_epochs`` over the training tasks. Pure."""
    steps_for = getattr(algo, "steps_for", None)
    return steps_for(tasks) if steps_for else algo.max_steps


def _verl_model(algo: Any) -> Any:
    """``VERL(config)``'s ``actor_rollout_ref.model.path``, as the policy when no ``main_llm`` resource names one."""
    from types import SimpleNamespace

    return SimpleNamespace(model=algo.model) if getattr(algo, "model", None) else None


def serve_command(port: int, engine: str = "torch", model: str | None = None, lora_rank: int = 0) -> list[str]:
    """The policy server's ``rolloutbus`` command: the demo's, with ``--engine vllm`` for vLLM's engine (``make
    vllm``); ``model`` for SFT's collection (GRPO's server waits for the trainer's version 0); a LoRA trainer's
    versions (``lora_rank``) are served by their adapters alone. Pure."""
    return ["serve", "--port", str(port), "--threads", "1", "--max-batch", "32", *engine_args(engine),
            *(["--model", model] if model else []),
            *(["--lora-rank", str(lora_rank)] if lora_rank > 0 else [])]


def train_command(algo: Any, model: str, extra: list[str]) -> list[str]:
    """The ``rolloutbus train`` fit starts for a GRPO-family algorithm: its learning settings as flags, then ``extra``
    (the algorithm's ``train_args`` and the validation flags, which win). Pure."""
    return ["train", "--model", model, "--groups-per-step", str(algo.groups_per_step), "--lr", str(algo.lr),
            "--kl-beta", str(algo.kl_beta), "--max-staleness", "2", "--threads", "1", "--seed", str(algo.seed),
            "--policy-loss", algo.policy_loss, "--updates-per-batch", str(algo.updates_per_batch),
            "--mini-batches", str(algo.mini_batches), *extra]


def lora_rank_of(train_args: list[str], default: int) -> int:
    """The LoRA rank the trainer runs with: the last ``--lora-rank`` among its flags, else ``default`` (its
    ``ROLLOUTBUS_LORA_RANK``); one that is not a whole number is one line. Pure."""
    import argparse

    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    p.add_argument("--lora-rank", type=int, default=default)
    try:
        return int(p.parse_known_args(train_args)[0].lora_rank)
    except (argparse.ArgumentError, ValueError) as exc:
        raise ConfigError(f"train_args: {exc}") from None


serve_start_s = engine_start_s  # how long the policy server may take to answer (the demo's)


def first_rollouts_warning(agent_match: str | None, rollouts: int, failed: int, error: str | None, trained: int,
                           group_size: int) -> str | None:
    """The line fit says once a group's worth of training rollouts finished, when they cannot teach: every one
    failed (a dataset row the agent cannot read, say), or ``agent_match`` selected none of their calls. Pure."""
    if rollouts < group_size:
        return None
    if failed == rollouts:
        return (f"every one of the first {rollouts} rollouts failed, the first with: {error or 'no error recorded'} "
                "(a dataset row the agent cannot read? the runners' log says more)")
    if agent_match and not trained:
        return (f"agent_match {agent_match!r} selected none of the LLM calls of the first {rollouts} rollouts: nothing is "
                "trained (the agents' names: rolloutbus query \"SELECT agent_name, count() FROM transitions GROUP BY agent_name\")")
    return None


def _first_rollouts(settings: CommonSettings) -> tuple[int, int, str | None, int]:
    """(finished training rollouts, failed ones, a failure's error, trained transitions) in the store."""
    from foundation.clickhouse import connect

    client = connect(settings.dsn, database=settings.clickhouse_database, create_database=False)
    try:
        rollouts, failed, error = client.query(
            "SELECT count(), countIf(status = 'failed'), anyIf(error, status = 'failed') FROM rollouts FINAL "
            "WHERE mode = 'train' AND status != ''").result_rows[0]
        trained = int(client.query("SELECT countIf(trained) FROM transitions FINAL").result_rows[0][0])
    finally:
        client.close()
    return int(rollouts), int(failed), error or None, trained


@contextmanager
def fit_stack(trainer: Trainer) -> Iterator[tuple[CommonSettings, Any, RunScope]]:
    """The stack a fit run uses, said in its first lines: the local one, or the given addresses (checked before
    anything starts); either way in a namespace of the run's own, created, nothing of another run deleted.
    Yields the run's settings, the stack (its supervisor: ``stack.procs``) and the scope."""
    settings = load_settings(CommonSettings, {})
    scope = run_scope(settings)  # the run's own topics and database: nothing reset or deleted
    if given_addresses(settings):
        check_given(settings)  # one line for a given address that does not answer, before anything starts
    trainer.out.mkdir(parents=True, exist_ok=True)
    with local_stack(settings, trainer.out / "logs") as stack:
        for line in where_lines(scope, stack):
            trainer.say(line)
        prepare(scope, trainer.say)
        yield scope.settings, stack, scope


def process_env_of(settings: CommonSettings, scope: RunScope, **extra: str) -> dict[str, str]:
    """The environment of fit's processes: the stack's, the run's scope, ``extra``, and the script's directory
    and the working directory on PYTHONPATH (the runners unpickle the agent's class from there)."""
    script_dirs = [str(Path.cwd())] + ([str(Path(sys.argv[0]).resolve().parent)] if sys.argv and sys.argv[0] else [])
    return dict(process_env(settings), **scope.env, **extra,
                PYTHONPATH=os.pathsep.join([*script_dirs, *filter(None, [os.environ.get("PYTHONPATH")])]))


def match_args(trainer: Trainer) -> list[str]:
    """The stream worker's flags for the Trainer's ``adapter``. Pure."""
    return (["--agent-match", trainer.agent_match] if trainer.agent_match else []) + \
        (["--llm-call-match", trainer.llm_call_match] if trainer.llm_call_match else [])


def run_fit(trainer: Trainer, agent: Any, train: list[str], val: list[str], test: list[str] | None = None) -> FitResult:
    algo = trainer.algorithm or GRPO()
    if not isinstance(algo, (GRPO, SFT)):  # APO(...) runs in fit_apo.run_apo (Trainer.fit chooses)
        raise ConfigError(f"algorithm {type(algo).__name__} is not one fit runs: GRPO(...), SFT(...) or APO(...)")
    sft = isinstance(algo, SFT)
    say = trainer.say
    out = trainer.out
    t_start = time.monotonic()
    with fit_stack(trainer) as (settings, stack, scope):
        serve_port, proxy_port = free_port(), free_port()
        proxy = f"http://127.0.0.1:{proxy_port}"
        from trainer.settings import ServeSettings, TrainerSettings

        served = load_settings(ServeSettings, {}).resource_name  # the name `serve` answers to (vLLM: no other)
        ship(Adapted(agent, trainer.resources, proxy=proxy, val_temperature=None if sft else algo.val_temperature,
                     served=served), out / "agent.pickle")
        model = _model(trainer.resources.get("main_llm") or _verl_model(algo), settings)
        if getattr(algo, "ignored_line", None) and (line := algo.ignored_line()):
            say(line)
        env = process_env_of(settings, scope, ROLLOUTBUS_CHECKPOINT_DIR=str(out / "checkpoints"),
                             ROLLOUTBUS_TRAIN_TEMPERATURE=str(algo.temperature))
        sup = stack.procs
        sup.env = env
        match = match_args(trainer)
        validate: list[str] = []
        if val and sft:
            say("validate   SFT(...) does not score val_dataset (only GRPO's trainer validates each version)")
        elif val:
            (out / "validation.jsonl").write_text("".join(v + "\n" for v in val))
            validate = ["--validation-tasks", str(out / "validation.jsonl")]
        train_args = [] if sft else [*(["--train-layers", str(algo.train_layers)] if algo.train_layers else []),
                      *(["--skip-zero-variance"] if algo.skip_zero_variance else []),
                      *(["--max-steps", str(max_steps)] if (max_steps := _max_steps(algo, len(train))) else []),
                      *algo.train_args]
        live, stop_follow = Live(), threading.Event()
        follower = threading.Thread(target=follow, args=(settings, live, stop_follow), daemon=True)
        try:
            group_size = algo.samples_per_task if sft else algo.group_size
            sup.start("process", ["process", "--group-size", str(group_size), "--group-min-rollouts", "2",
                                  *([] if sft else algo.process_args()), "--sink-interval", "0.5",
                                  "--finish-grace", str(FINISH_GRACE_S),
                                  "--group-timeout", str(algo.group_timeout_s), *match])
            # SFT: the model as given answers the collection (GRPO's server waits for the trainer's version 0)
            rank = 0 if sft else served_lora_rank(lora_rank_of(train_args, load_settings(TrainerSettings).lora_rank))
            sup.start("serve", serve_command(serve_port, trainer.engine, model if sft else None, rank))
            sup.start("proxy", ["proxy", "--upstream", f"http://127.0.0.1:{serve_port}/v1", "--port", str(proxy_port)])
            if not sft:
                sup.start("train", train_command(algo, model, [*train_args, *validate]))
            follower.start()
            wait_http(f"http://127.0.0.1:{serve_port}/healthz", serve_start_s(trainer.engine), sup)
            wait_http(f"http://127.0.0.1:{proxy_port}/healthz", 60, sup)
            sup.env = dict(env, ROLLOUTBUS_LLM_PROXY_URL=proxy, **{SHIPPED_ENV: str(out / "agent.pickle")})
            sup.start("runners", ["run-agent", AGENT_SPEC, "--concurrency", str(trainer.n_runners), "--max-attempts", "1",
                                  "--timeout", str(algo.rollout_timeout_s)])
            say(f"started    stream processor, policy server :{serve_port} ({trainer.engine}), LLM proxy :{proxy_port}, trainer, "
                f"{trainer.n_runners} runners (logs in {out / 'logs'})")
            result = _sft(trainer, algo, settings, sup, live, train, model, t_start) if sft else \
                _loop(trainer, algo, settings, sup, live, train, val, t_start)
            if test:
                result.held_out = _held_out(trainer, agent, algo, settings, sup, result, model, served, test)
                time.sleep(FINISH_GRACE_S + 1.0)  # its last attempts' grace and the sink's flush, before the stack stops
            result.run, result.database = scope.run or "", settings.clickhouse_database
            if trainer.keep_store and stack.store is not None:
                stack.keep_store = True
                say(f"query      the store stays up on {stack.store.url}: rolloutbus query --run {scope.run} "
                    "\"SELECT * FROM v_reward_by_version\" (rolloutbus down stops it)")
            return result
        finally:
            stop_follow.set()


def _loop(trainer: Trainer, algo: Any, settings: CommonSettings, sup: Any, live: Live, train: list[str], val: list[str],
          t_start: float) -> FitResult:
    say = trainer.say
    from producers.curriculum import pass_rate_curriculum

    curriculum = (pass_rate_curriculum(settings, algo.selection_k, algo.selection_explore, seed=algo.seed,
                                       group_size=algo.group_size) if algo.task_selection == "pass-rate" else None)
    feeder = TaskFeeder(settings, [Row(t) for t in train], live, group_size=algo.group_size, runners=trainer.n_runners,
                        groups_per_step=algo.groups_per_step, curriculum=curriculum, pace=algo.pace)
    warnings: list[str] = []
    checked = False
    say(f"{'step':>5} {'version':>7} {'rollouts':>8} {'batch reward':>12} {'reward (last 128)':>17} {'loss':>8}  {'elapsed':>7}")
    shown, t_train = 0, time.monotonic()
    try:
        while time.monotonic() - t_train < algo.minutes * 60:
            if sup.returncode("train") == 0:
                say("training   the trainer stopped (its step limit, or validation stopped improving)")
                break
            sup.check()
            feeder.top_up()
            with live.lock:
                new, shown = live.steps[shown:], len(live.steps)
                total = sum(len(v) for v in live.rewards_by_version.values())
                recent = sum(live.recent) / len(live.recent) if live.recent else 0.0
            for s in new:
                say(f"{int(s['step']):>5} {int(s.get('version') or 0):>7} {total:>8} {s.get('reward_mean', 0):>12.3f} "
                    f"{recent:>17.3f} {s.get('loss', 0):>8.4f}  {time.monotonic() - t_start:>6.0f}s")
            if not checked and time.monotonic() - t_train > 20:
                rollouts, failed, error, trained = _first_rollouts(settings)
                checked = rollouts >= algo.group_size
                line = first_rollouts_warning(trainer.agent_match, rollouts, failed, error, trained, algo.group_size)
                if line:
                    warnings.append(line)
                    say(f"warning    {line}")
            time.sleep(0.5)
        else:
            say("training   time is up")
    finally:
        feeder.close()
    if feeder.selection_line():
        say(feeder.selection_line())
    sup.stop("train", grace=60)
    with live.lock:
        versions = dict(live.versions)
    if not versions:
        raise RolloutbusError("no resource version was published: the trainer never started (see its log)")
    validation, winner = _validation(settings, sup, versions, val, say) if val else ({}, None)
    sup.stop("runners", grace=30)
    time.sleep(FINISH_GRACE_S + 1.0)  # the last attempts' finish grace, then the sink's flush (every 0.5 s)
    with live.lock:
        result = FitResult(list(live.steps), versions, {k: list(v) for k, v in live.rewards_by_version.items()},
                           sum(len(v) for v in live.rewards_by_version.values()), time.monotonic() - t_start, warnings,
                           validation, winner if winner is not None else max(versions))
    say(f"done       {len(result.steps)} steps, {result.rollouts} rollouts in groups, {result.seconds:.0f}s")
    return result


def _sft(trainer: Trainer, algo: SFT, settings: CommonSettings, sup: Any, live: Live, train: list[str], model: str,
         t_start: float) -> FitResult:
    """Collect ``collect_minutes`` of rollouts, stop the runners, then run ``rolloutbus train --algorithm sft`` to its end."""
    say = trainer.say
    feeder = TaskFeeder(settings, [Row(t) for t in train], live, group_size=algo.samples_per_task, runners=trainer.n_runners,
                        groups_per_step=2)
    say(f"collect    {algo.collect_minutes:g} minutes of rollouts, {algo.samples_per_task} per task, on {model}")
    t0 = time.monotonic()

    def collected() -> int:
        with live.lock:
            return sum(len(v) for v in live.rewards_by_version.values())

    try:
        extended = False
        # the minutes, and past them until a first group is back (a slow start, a loaded machine), at most the
        # rollout timeout: a fine-tuning on nothing collected is no run
        while (time.monotonic() - t0 < algo.collect_minutes * 60
               or (not collected() and time.monotonic() - t0 < max(algo.collect_minutes * 60, algo.rollout_timeout_s))):
            if not extended and time.monotonic() - t0 >= algo.collect_minutes * 60:
                say(f"collect    no group back after {algo.collect_minutes:g} minutes: collecting until the first one "
                    f"(at most {algo.rollout_timeout_s:g} s in all)")
                extended = True
            sup.check()
            feeder.top_up()
            time.sleep(0.5)
    finally:
        feeder.close()
    sup.stop("runners", grace=30)
    time.sleep(FINISH_GRACE_S + 1.0)  # the last attempts' finish grace, then the sink's flush (every 0.5 s)
    with live.lock:
        rewards = [r for v in live.rewards_by_version.values() for r in v]
    say(f"collected  {len(rewards)} rollouts in groups, mean reward {sum(rewards) / max(1, len(rewards)):.3f}; "
        f"rolloutbus {' '.join(algo.command(model))}")
    sup.start("train", algo.command(model))
    while (code := sup.returncode("train")) is None:
        time.sleep(1.0)
    sup.stop("train")
    if code != 0:
        tail = (Path(trainer.out) / "logs" / "train.log").read_text(errors="replace").strip().splitlines()[-8:]
        raise RolloutbusError(f"rolloutbus train --algorithm sft exited with {code}:\n  " + "\n  ".join(tail))
    time.sleep(2.0)  # the follower reads the versions it published
    with live.lock:
        result = FitResult(list(live.steps), dict(live.versions), {k: list(v) for k, v in live.rewards_by_version.items()},
                           len(rewards), time.monotonic() - t_start, chosen=max(live.versions) if live.versions else None)
    say(f"done       SFT published version(s) {sorted(result.versions)}; {result.rollouts} rollouts collected, {result.seconds:.0f}s")
    return result


def _validation(settings: CommonSettings, sup: Any, versions: dict[int, dict[str, Any]], val: list[str],
                say: Any, wait_s: float = 90.0) -> tuple[dict[int, float], int | None]:
    """Each fully validated version's mean validation reward, the last version's waited for as the demo waits
    (its tasks published again once the trainer has stopped: :func:`rolloutbus.runs.evaluation.final_validator`);
    and the best of them (None: none fully validated)."""
    from trainer.validation import best, complete

    final = max(versions)
    validator = final_validator(settings, [Row(v) for v in val], versions[final]["config"].get("run_id", ""), final)
    try:
        deadline = time.monotonic() + wait_s
        scores = validator.poll(force=True)
        while time.monotonic() < deadline and (scores.get(final) is None or scores[final].answered < len(val)):
            sup.check()
            time.sleep(2.0)
            scores = validator.poll(force=True)
    finally:
        validator.close()
    done = {s.version: s.mean for s in complete(scores, len(val))}
    winner = best(scores, len(val))
    say("validate   " + (", ".join(f"v{v} {m:.1%}" for v, m in sorted(done.items())) or "no version fully validated")
        + (f" — version {winner.version} is the best ({versions.get(winner.version, {}).get('uri', '')})" if winner else ""))
    return done, winner.version if winner else None


def _held_out(trainer: Trainer, agent: Any, algo: Any, settings: CommonSettings, sup: Any, result: FitResult, model: str,
              served: str, test: list[str]) -> HeldOut:
    """``test`` answered by version 0 and by the version kept, each served alone from its weights (the demo's
    :func:`~rolloutbus.runs.evaluation.evaluate`: its own server and proxy, rollouts recorded as mode ``test``), the
    agent in this process at the validation temperature (greedy by default)."""
    from types import SimpleNamespace

    say = trainer.say
    first, chosen = min(result.versions), result.chosen if result.chosen is not None else max(result.versions)
    for name in ("runners", "proxy", "serve"):  # the cores go to the evaluation's server
        sup.stop(name, grace=30)
    temperature = getattr(algo, "val_temperature", 0.0)
    task = SimpleNamespace(eval_threads=2, serve_args=engine_args(trainer.engine), serve_start_s=serve_start_s(trainer.engine),
                           eval_agent=lambda url: Adapted(agent, trainer.resources, proxy=url, val_temperature=temperature,
                                                          served=served))
    problems = [Row(t) for t in test]
    threads = max(1, trainer.n_runners)
    say(f"held-out   version {first} and version {chosen} on the same {len(test)} test tasks"
        + (" (greedy)" if temperature == 0 else ""))
    # Version 0 is the model as given (its checkpoint may be pruned by now).
    first_scores = evaluate(settings, sup, model if first == 0 else version_uri(result.versions, first),
                            first, problems, "first", task, threads=threads)
    chosen_scores = list(first_scores) if chosen == first and temperature == 0 else \
        evaluate(settings, sup, version_uri(result.versions, chosen), chosen, problems, "final", task, threads=threads)
    held = HeldOut(first, chosen, first_scores, chosen_scores)
    say(f"held-out   {held.line()}")
    return held


__all__ = ["FitResult", "HeldOut", "first_rollouts_warning", "lora_rank_of", "run_fit", "serve_command", "serve_start_s",
           "served_lora_rank"]
