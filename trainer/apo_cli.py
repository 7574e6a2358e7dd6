"""``rolloutbus optimize-prompt VAL_TASKS``: automatic prompt optimization on the bus, its own process.

It reads the prompt's latest version from ``rb.resources``, the trajectories of a prompt from ClickHouse
(``rollouts`` and ``spans``, the tables analysts use), asks the optimizer LLM (any OpenAI-compatible
endpoint: ``ROLLOUTBUS_APO_LLM_URL``) for critiques and rewrites, and scores every candidate by
publishing its validation tasks on ``rb.tasks`` (mode ``test``: never trained on) with the candidate
attached (``use_resource.<name>``), for the ordinary runners to run; the score is read back from
``rollouts``. Every candidate goes to ``prompt_candidates``; the best one that beats the incumbent is
published as the next ``prompt_template`` version, which runners use from their next rollout on.

``--dry-run`` scores the incumbent and the candidates of ``--candidates FILE`` only: no LLM, nothing
published. The search itself is :mod:`trainer.apo`.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from foundation.errors import ConfigError, KafkaUnavailable, RolloutbusError
from foundation.flags import Bounded

log = logging.getLogger(__name__)
_FLAGS = {"resource": "apo_resource", "llm_url": "apo_llm_url", "llm_model": "apo_llm_model",
          "llm_temperature": "apo_llm_temperature", "beam_width": "apo_beam_width", "branch": "apo_branch",
          "rounds": "apo_rounds", "score_timeout": "apo_score_timeout_s", "min_gain": "apo_min_gain"}
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("val_tasks", type=Path, help="validation tasks, JSONL as `rolloutbus tasks publish` reads (each line's input)")
    p.add_argument("--candidates", type=Path, help="your own candidate prompts: a JSON list (a template string, or a "
                                                   "config object per candidate) or text with candidates between '---' lines")
    p.add_argument("--initial", type=Path, help="the prompt to publish as version 0 if the resource has none yet (same formats)")
    p.add_argument("--dry-run", action="store_true", help="score the incumbent and --candidates only: no LLM, nothing published")
    p.add_argument("--resource", help="the prompt_template resource")
    p.add_argument("--llm-url", help="optimizer LLM, OpenAI-compatible base URL (key: ROLLOUTBUS_APO_LLM_KEY)")
    p.add_argument("--llm-model", help="optimizer LLM model name")
    p.add_argument("--llm-temperature", type=float, help="critique and rewrite temperature")
    p.add_argument("--beam-width", type=int, help="candidates kept per round")
    p.add_argument("--branch", type=int, help="new candidates per beam member per round")
    p.add_argument("--rounds", type=int, help="rounds of critique, rewrite and scoring")
    p.add_argument("--score-timeout", type=float, help="seconds to wait for a round's validation rollouts")
    p.add_argument("--min-gain", type=float, help="publish only a candidate whose validation score is more than this above "
                                                  "the incumbent's, e.g. 0.05")
    p.add_argument("--max-val-tasks", type=Bounded(int, ge=1), default=None, help="use only the first N validation tasks")
    p.add_argument("--run-id", help="this run's id in prompt_candidates (lowercase letters, digits, '-'; default apo-<random>)")
    p.add_argument("--out", type=Path, help="also write the run's summary here as JSON")


# --------------------------------------------------------------------------- reading the user's files
    from foundation.flags import describe_flags

    describe_flags(p, "trainer.settings:ApoSettings", _FLAGS)  # each flag's variable and default, from the settings


def parse_prompts(text: str, name: str) -> list[dict[str, str]]:
    """Prompt configs from a file's text: JSON (a string, an object, or a list of them) or plain text
    with prompts between lines of ``---``. An object is a resource config; its non-string values
    (examples as a list) are JSON-encoded; a string is ``{"template": string}``."""
    stripped = text.strip()
    if not stripped:
        raise ConfigError(f"{name} holds no prompt")
    items: list[Any]
    if stripped[0] in "[{\"":
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise ConfigError(f"{name} is not valid JSON: {exc}") from exc
        items = data if isinstance(data, list) else [data]
    else:
        items = [part.strip() for part in re.split(r"(?m)^---\s*$", stripped) if part.strip()]
    configs = []
    for n, item in enumerate(items, 1):
        if isinstance(item, str):
            config = {"template": item}
        elif isinstance(item, dict):
            config = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in item.items()}
        else:
            raise ConfigError(f"{name}: prompt {n} must be a string or an object, not {type(item).__name__}")
        if not config.get("template", "").strip():
            raise ConfigError(f"{name}: prompt {n} has no template text")
        configs.append(config)
    return configs


def _read(path: Path, flag: str) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from exc


def _task_text(task_input: str) -> str:
    try:
        obj = json.loads(task_input)
    except ValueError:
        return task_input
    if isinstance(obj, dict):
        for key in ("question", "prompt", "text", "input"):
            if isinstance(obj.get(key), str):
                return str(obj[key])
    return task_input


def _sql_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --------------------------------------------------------------------------- the process


class PromptOptimizer:
    """The bus, the store and the optimizer LLM around :func:`trainer.apo.beam_search`."""

    def __init__(self, settings: Any, val_inputs: list[str], run_id: str, say: Callable[[str], None] = print) -> None:
        from confluent_kafka import Producer

        from foundation.clickhouse import open_store

        self.s = settings
        self.name = settings.apo_resource
        self.val_inputs = val_inputs
        self.run_id = run_id
        self.say = say
        self.producer = Producer({**settings.kafka_conf(), "enable.idempotence": True, "log_level": 0})
        self.client = open_store(settings.dsn, settings.clickhouse_database, settings.clickhouse_password, settings.clickhouse_cluster)
        self.llm: Any = None
        if settings.apo_llm_url:
            from openai import OpenAI

            key = settings.apo_llm_key.get_secret_value() if settings.apo_llm_key else "unused"
            self.llm = OpenAI(base_url=settings.apo_llm_url, api_key=key, max_retries=1, timeout=600)
        self.incumbent_rv: Any = None
        self._made = 0

    def close(self) -> None:
        self.producer.flush(10)
        self.client.close()

    # ------------------------------------------------------------------ resources

    def _send(self, topic: str, key: str, value: bytes) -> None:
        errors: list[str] = []
        self.producer.produce(topic, value, key.encode(), on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
        left = self.producer.flush(30)
        if left or errors:
            raise KafkaUnavailable(f"could not publish to {topic}: {'; '.join(errors) or f'{left} undelivered after 30s'}")

    def incumbent(self, initial: dict[str, str] | None) -> Any:
        """The latest version of the prompt; publishes ``initial`` as version 0 if there is none."""
        from schemas import ResourceVersion, encode
        from trainer.resources import read_latest

        rv = read_latest(self.s.kafka_conf(), self.s.topics.resources).get(self.name)
        if rv is None:
            if initial is None:
                raise ConfigError(f"resource {self.name!r} has no version on {self.s.topics.resources}: "
                                  "give --initial FILE to publish the first one")
            rv = ResourceVersion(name=self.name, version=0, kind="prompt_template", created_ns=time.time_ns(), config=initial)
            self._send(self.s.topics.resources, self.name, encode(rv))
            self.say(f"published  {self.name} version 0 (--initial)")
        elif rv.kind != "prompt_template":
            raise ConfigError(f"resource {self.name!r} is a {rv.kind!r}, not a prompt_template")
        self.incumbent_rv = rv
        return rv

    def publish(self, best: Any, incumbent: Any) -> int:
        from schemas import ResourceVersion, encode
        from trainer.resources import read_latest

        latest = read_latest(self.s.kafka_conf(), self.s.topics.resources).get(self.name)
        version = (latest.version if latest else -1) + 1
        metrics = {"val_score": best.score, "incumbent_val_score": incumbent.score, "val_tasks": float(best.tasks)}
        if best.score_se is not None:
            metrics["val_score_se"] = best.score_se
        config = {**best.config, "apo.run": self.run_id, "apo.candidate": best.id, "apo.parent_version": str(self.incumbent_rv.version)}
        rv = ResourceVersion(name=self.name, version=version, kind="prompt_template", created_ns=time.time_ns(),
                             metrics=metrics, config=config)
        self._send(self.s.topics.resources, self.name, encode(rv))
        return version

    # ------------------------------------------------------------------ scoring through the runners

    def _resource_for(self, cand: Any) -> Any:
        from schemas import ResourceVersion

        return ResourceVersion(name=self.name, version=self.incumbent_rv.version, kind="prompt_template",
                               created_ns=time.time_ns(), config=cand.config)

    def score(self, cands: list[Any]) -> None:
        """Publish each candidate's validation tasks, wait for their rollouts in ClickHouse, fill the rewards."""
        from producers.runner import use_resource
        from schemas import Task, encode

        n = len(self.val_inputs)
        for c in cands:
            label = None if c.source == "incumbent" else c.id
            meta = {**use_resource(self._resource_for(c), label=label), "apo.run": self.run_id, "apo.candidate": c.id}
            for i, inp in enumerate(self.val_inputs):
                task = Task(task_id=f"{c.id}-{i:04d}", input=inp, mode="test", group_size=1, created_ns=time.time_ns(),
                            metadata={**meta, "apo.task": str(i), "question": _task_text(inp)[:500]})
                self.producer.produce(self.s.topics.tasks, encode(task), task.task_id.encode())
                self.producer.poll(0)
            c.tasks = n
        left = self.producer.flush(30)
        if left:
            raise KafkaUnavailable(f"{left} validation tasks not delivered to {self.s.topics.tasks} within 30s")
        ids = ", ".join(_sql_str(c.id) for c in cands)
        sql = (f"SELECT metadata['apo.candidate'] AS c, toUInt32OrZero(metadata['apo.task']) AS i, "
               f"max(ifNull(final_reward, 0)) AS r FROM rollouts FINAL "
               f"WHERE metadata['apo.run'] = {_sql_str(self.run_id)} AND metadata['apo.candidate'] IN ({ids}) AND finished_ns > 0 "
               f"GROUP BY c, i")
        by_id = {c.id: c for c in cands}
        want, t0, shown = n * len(cands), time.monotonic(), -1
        while True:
            got = 0
            for cid, i, r in self.client.query(sql).result_rows:
                if cid in by_id and i < n:
                    by_id[cid].rewards[int(i)] = float(r)
                    got += 1
            if got >= want:
                break
            waited = time.monotonic() - t0
            if waited > self.s.apo_score_timeout_s:
                for c in cands:
                    missing = n - len(c.rewards)
                    if missing:
                        c.note = f"{missing} of {n} validation tasks unfinished after {self.s.apo_score_timeout_s:.0f}s (counted 0)"
                log.warning("scoring: %d of %d validation rollouts finished after %.0fs", got, want, waited)
                break
            if got // max(1, want // 4) != shown:  # a line per quarter done
                shown = got // max(1, want // 4)
                self.say(f"scoring    {got}/{want} validation rollouts finished ({waited:.0f}s)")
            time.sleep(2.0)

    # ------------------------------------------------------------------ the optimizer LLM

    def trajectories(self, label: str, seed: int) -> tuple[list[Any], list[Any]]:
        """Low- and high-reward trajectories of the prompt recorded as ``label``, latest first, sampled."""
        from trainer.apo import Trajectory

        rows = self.client.query(
            f"SELECT rollout_id, metadata['question'], ifNull(final_reward, 0) FROM rollouts FINAL "
            f"WHERE metadata[{_sql_str('resource.' + self.name)}] = {_sql_str(label)} AND finished_ns > 0 "
            f"ORDER BY finished_ns DESC LIMIT 200").result_rows
        if not rows:
            return [], []
        best = max(r[2] for r in rows)
        lows = [r for r in rows if r[2] < best or best <= 0]
        highs = [r for r in rows if r[2] == best and best > 0]
        rng = random.Random(seed)
        lows = rng.sample(lows, min(self.s.apo_failures, len(lows)))
        highs = rng.sample(highs, min(self.s.apo_successes, len(highs)))
        chosen = [r[0] for r in lows + highs]
        steps: dict[str, list[str]] = {rid: [] for rid in chosen}
        if chosen:
            ids = ", ".join(_sql_str(r) for r in chosen)
            for rid, kind, completion, tool, args, result, error in self.client.query(
                f"SELECT rollout_id, kind, attributes['gen_ai.completion'], ifNull(tool_name, ''), ifNull(tool_arguments, ''), "
                f"ifNull(tool_result, ''), ifNull(tool_error, '') FROM spans FINAL "
                f"WHERE rollout_id IN ({ids}) AND kind IN ('llm', 'tool') ORDER BY rollout_id, sequence_id"
            ).result_rows:
                if kind == "llm":
                    steps[rid].append(f"Assistant: {completion}")
                else:
                    steps[rid].append(f"Tool {tool}({args}) -> " + (f"error: {error}" if error else result))

        def traj(r: Any) -> Any:
            return Trajectory(task=r[1] or "(task not recorded)", steps=tuple(steps[r[0]]), reward=float(r[2]))

        return [traj(r) for r in lows], [traj(r) for r in highs]

    def _chat(self, messages: list[dict[str, str]]) -> str:
        try:
            reply = self.llm.chat.completions.create(model=self.s.apo_llm_model, messages=messages,
                                                     temperature=self.s.apo_llm_temperature, max_tokens=self.s.apo_llm_max_tokens)
        except Exception as exc:  # noqa: BLE001 - the client raises many kinds; one line says which endpoint
            raise RolloutbusError(f"the optimizer LLM at {self.s.apo_llm_url} failed: {str(exc).splitlines()[0] if str(exc) else exc!r}") from exc
        return reply.choices[0].message.content or ""

    def expand(self, beam: list[Any], round_: int) -> list[Any]:
        """``branch`` children per beam member: critique its trajectories, rewrite; all at once (the server batches)."""
        from trainer.apo import Candidate, critique_messages, parse_rewrite, rewrite_messages

        jobs = []
        for parent in beam:
            label = str(self.incumbent_rv.version) if parent.source == "incumbent" else parent.id
            for b in range(self.s.apo_branch):
                self._made += 1
                jobs.append((parent, label, b, f"{self.run_id}-r{round_}-{self._made}"))

        # The store is read here, one query at a time (a client is one session); the LLM calls run at once.
        shown = {cid: self.trajectories(label, seed=zlib.crc32(cid.encode())) for _p, label, _b, cid in jobs}

        def one(job: tuple[Any, str, int, str]) -> Any:
            parent, _label, _b, cid = job
            failures, successes = shown[cid]
            critique = self._chat(critique_messages(parent.template, failures, successes)).strip()
            text, note = parse_rewrite(self._chat(rewrite_messages(parent.template, critique)), parent.template)
            return Candidate(id=cid, config={**parent.config, "template": text}, source="optimizer", round=round_,
                             parent_id=parent.id, critique=critique, note=note)

        with ThreadPoolExecutor(max(1, len(jobs))) as pool:
            children = list(pool.map(one, jobs))
        for c in children:
            self.say(f"candidate  {c.id} (from {c.parent_id}){' — ' + c.note if c.note else ''}:\n"
                     f"           critique: {' '.join(c.critique.split())[:300]}\n"
                     f"           prompt:   {' '.join(c.template.split())[:300]}")
        return children

    # ------------------------------------------------------------------ the record

    def record(self, cands: list[Any]) -> None:
        now = time.time_ns()
        cols = ["run_id", "candidate_id", "resource_name", "round", "parent_id", "source", "template", "config", "critique",
                "score", "score_se", "tasks", "finished", "published_version", "note", "created_ns", "updated_ns"]
        rows = [[self.run_id, c.id, self.name, c.round, c.parent_id, c.source, c.template,
                 {k: v for k, v in c.config.items() if k != "template"}, c.critique, c.score, c.score_se, c.tasks,
                 len(c.rewards), c.published_version, c.note, c.created_ns or now, now] for c in cands]
        for c in cands:
            c.created_ns = c.created_ns or now
        self.client.insert("prompt_candidates", rows, column_names=cols)


def run_optimizer(s: Any, val_inputs: list[str], seeds: list[dict[str, str]], initial: dict[str, str] | None, *,
                  dry_run: bool, run_id: str, say: Callable[[str], None] = print) -> dict[str, Any]:
    """One optimization run; returns its summary (what ``--out`` writes)."""
    from trainer.apo import Candidate, beam_search, winner

    t0 = time.monotonic()
    opt = PromptOptimizer(s, val_inputs, run_id, say)
    try:
        rv = opt.incumbent(initial)
        config = {k: v for k, v in rv.config.items() if not k.startswith("apo.")}
        inc = Candidate(id=f"{run_id}-v{rv.version}", config=config, source="incumbent")
        users = [Candidate(id=f"{run_id}-u{i}", config={**config, **seed}, source="user") for i, seed in enumerate(seeds, 1)]
        say(f"optimize   {s.apo_resource} version {rv.version}: {len(users)} candidate(s) of yours, "
            + ("dry run (score only)" if dry_run else f"{s.apo_rounds} round(s), beam {s.apo_beam_width}, branch {s.apo_branch}")
            + f", {len(val_inputs)} validation tasks each; run {run_id}")
        pool = beam_search(inc, users, rounds=0 if dry_run else s.apo_rounds, beam_width=s.apo_beam_width,
                           expand=opt.expand, score=opt.score, record=opt.record, say=lambda m: say(f"search     {m}"))
        best = None if dry_run else winner(inc, pool, s.apo_min_gain)
        if best is not None:
            best.published_version = opt.publish(best, inc)
            opt.record([best])
            say(f"published  {s.apo_resource} version {best.published_version}: {best.id}, validation {best.score:.3f} "
                f"vs the incumbent's {inc.score:.3f}")
        elif not dry_run:
            margin = f" by more than {s.apo_min_gain:g}" if s.apo_min_gain else ""
            say(f"kept       {s.apo_resource} version {rv.version}: no candidate beat its validation score {inc.score:.3f}{margin}")
        return {
            "run_id": run_id, "resource": s.apo_resource, "incumbent_version": rv.version, "dry_run": dry_run,
            "seconds": round(time.monotonic() - t0, 1), "published_version": best.published_version if best else None,
            "published_candidate": best.id if best else None,
            "candidates": [{"id": c.id, "source": c.source, "round": c.round, "parent_id": c.parent_id, "score": c.score,
                            "score_se": c.score_se, "tasks": c.tasks, "note": c.note, "critique": c.critique,
                            "config": c.config, "rewards": [c.rewards.get(i, 0.0) for i in range(c.tasks)]} for c in pool],
        }
    finally:
        opt.close()


def run(args: argparse.Namespace) -> int:
    from producers.tasks_cli import parse_tasks
    from foundation.config import load_settings
    from trainer.settings import ApoSettings

    values = {k: getattr(args, k) for k in _FLAGS if getattr(args, k, None) is not None}
    overrides = {_FLAGS[k]: v for k, v in values.items()}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = args.data_dir
    s = load_settings(ApoSettings, overrides, {f: "--" + k.replace("_", "-") for k, f in _FLAGS.items()})
    run_id = args.run_id or f"apo-{uuid.uuid4().hex[:8]}"
    if not _ID.match(run_id):
        raise ConfigError(f"bad --run-id {run_id!r}: lowercase letters, digits and '-' only, at most 63")
    seeds = parse_prompts(_read(args.candidates, "--candidates"), str(args.candidates)) if args.candidates else []
    initial = parse_prompts(_read(args.initial, "--initial"), str(args.initial))[0] if args.initial else None
    if args.dry_run and not seeds:
        raise ConfigError("--dry-run scores your own prompts: give them with --candidates FILE")
    if not args.dry_run and not s.apo_llm_url:
        raise ConfigError("no optimizer LLM: set ROLLOUTBUS_APO_LLM_URL (or --llm-url) to an OpenAI-compatible base URL, "
                          "or score your own prompts with --dry-run --candidates FILE")
    tasks = parse_tasks(_read(args.val_tasks, "validation tasks").splitlines())
    if not tasks:
        raise ConfigError(f"{args.val_tasks} holds no validation task")
    inputs = [t.input for t in tasks][: args.max_val_tasks]
    summary = run_optimizer(s, inputs, seeds, initial, dry_run=args.dry_run, run_id=run_id)
    print(f"{'candidate':<24} {'source':<9} {'round':>5} {'score':>7} {'± se':>6}  note")
    for c in summary["candidates"]:
        score = f"{c['score']:.3f}" if c["score"] is not None else "-"
        se = f"{c['score_se']:.3f}" if c["score_se"] is not None else "-"
        print(f"{c['id']:<24} {c['source']:<9} {c['round']:>5} {score:>7} {se:>6}  {c['note']}")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    return 0


__all__ = ["PromptOptimizer", "parse_prompts", "run_optimizer"]
