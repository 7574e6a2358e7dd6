"""``Trainer(algorithm=APO(...)).fit``: the user's prompt template optimized on the local stack.

The stack of :func:`rolloutbus.trainer_api.fit.run_fit` without a trainer (the local one or given
addresses, in a namespace of the run's own: :mod:`rolloutbus.runs.scope`): the stream worker, the policy server
(the model as given; its weights do not change), the LLM proxy and ``n_runners`` rollouts at once running the
agent, whose ``prompt_template`` resource is the version the runners use (:class:`PromptAdapted`). The initial
template is published on ``rb.resources`` as version 0; the first ``gradient_batch_size`` training rows run once
under it; then ``rolloutbus optimize-prompt`` runs as its own process (the command's one code path): it scores
version 0 and the candidates on the validation rows through the runners, critiques and rewrites with the
optimizer LLM (the policy server by default), records every candidate in ``prompt_candidates`` and publishes the
best one that beats version 0. :class:`APOResult` says the initial and the chosen prompt and their scores, as
the store recorded them. With a ``test_dataset``, a second ``optimize-prompt --dry-run`` scores the chosen version
and version 0 side by side on it (:func:`_held_out`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from foundation.config import CommonSettings, load_settings
from foundation.errors import ConfigError, RolloutbusError
from rolloutbus.trainer_api.agent import Adapted
from rolloutbus.trainer_api.algorithms import APO
from rolloutbus.trainer_api.fit import (AGENT_SPEC, FINISH_GRACE_S, FitResult, HeldOut, Trainer, _model, fit_stack, match_args,
                                        process_env_of, serve_command, serve_start_s)
from rolloutbus.trainer_api.resources import PromptTemplate


def prompt_resource(resources: Mapping[str, Any], name: str | None = None) -> tuple[str, PromptTemplate]:
    """The resource APO optimizes: ``name``, else the one :class:`PromptTemplate`; one clear line otherwise. Pure."""
    prompts = {k: v for k, v in resources.items() if isinstance(v, PromptTemplate)}
    if name is not None:
        if not isinstance(resources.get(name), PromptTemplate):
            raise ConfigError(f"APO(resource={name!r}) names no PromptTemplate in initial_resources "
                              f"(its PromptTemplates: {', '.join(prompts) or 'none'})")
        return name, resources[name]
    if not prompts:
        raise ConfigError("APO optimizes a prompt template: give initial_resources={\"prompt_template\": "
                          "PromptTemplate(template=\"...\", engine=\"f-string\")} and read resources[\"prompt_template\"] "
                          "in rollout()")
    if len(prompts) > 1:
        raise ConfigError(f"APO optimizes one prompt template, and initial_resources holds {len(prompts)} "
                          f"({', '.join(prompts)}): say which with APO(resource=...)")
    return next(iter(prompts.items()))


class PromptAdapted(Adapted):
    """The agent as :class:`Adapted` runs it, its prompt resource ``prompt`` the version the runner uses (the
    latest on ``rb.resources``, or the candidate a scoring task carries) instead of the initial one."""

    def __init__(self, agent: Any, resources: Mapping[str, Any], prompt: str, **kwargs: Any) -> None:
        super().__init__(agent, resources, **kwargs)
        self.prompt = prompt

    def named_resources(self, runner_resources: Mapping[str, Any], mode: str = "train") -> dict[str, Any]:
        named = super().named_resources(runner_resources, mode)
        initial, rv = self.resources[self.prompt], runner_resources.get(self.prompt)
        if rv is not None and getattr(rv, "config", {}).get("template"):
            named[self.prompt] = PromptTemplate.from_config(rv.config, initial.engine)
        return named


@dataclass
class APOResult(FitResult):
    """fit's result under APO: ``versions`` the prompt's versions on ``rb.resources`` (config and metrics),
    ``validation`` version -> validation score; the initial prompt (version 0) and the chosen one (the version
    published, else version 0) with their scores; ``candidates`` the rows of ``prompt_candidates``."""

    run_id: str = ""
    resource: str = ""
    initial_prompt: str = ""
    initial_score: float | None = None
    prompt: str = ""
    prompt_version: int = 0
    score: float | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)


def _publish(settings: CommonSettings, records: list[tuple[str, str, bytes]]) -> None:
    """(topic, key, value) records, delivered or one error."""
    from confluent_kafka import Producer

    producer = Producer({**settings.kafka_conf(), "enable.idempotence": True, "log_level": 0})
    for topic, key, value in records:
        producer.produce(topic, value, key.encode())
    if producer.flush(30):
        raise RolloutbusError(f"could not publish {len(records)} record(s) to Kafka within 30s")


def _store_rows(settings: CommonSettings, sql: str) -> list[tuple[Any, ...]]:
    from foundation.clickhouse import connect

    client = connect(settings.dsn, database=settings.clickhouse_database, create_database=False)
    try:
        return [tuple(r) for r in client.query(sql).result_rows]
    finally:
        client.close()


def _sql_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _run_train_rows(settings: CommonSettings, sup: Any, rows: list[str], timeout_s: float, say: Callable[[str], None]) -> int:
    """The training rows once each under version 0 (mode ``val``: never grouped), waited for; the number finished."""
    from schemas import Task, encode

    tag = f"apo-train-{uuid.uuid4().hex[:6]}"
    _publish(settings, [(settings.topics.tasks, f"{tag}-{i:04d}",
                         encode(Task(task_id=f"{tag}-{i:04d}", input=row, mode="val", created_ns=time.time_ns(),
                                     metadata={"question": _question(row)})))
                        for i, row in enumerate(rows)])
    say(f"gradient   {len(rows)} training rows once each under version 0, for the first critiques")
    deadline, done = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        sup.check()
        done = int(_store_rows(settings, f"SELECT count() FROM rollouts FINAL WHERE task_id LIKE '{tag}-%' "
                                         "AND finished_ns > 0")[0][0])
        if done >= len(rows):
            break
        time.sleep(2.0)
    return done


def _question(row: str) -> str:
    """What the optimizer's critique shows as the task: a row's question / prompt / text, else its JSON."""
    obj = json.loads(row)
    return next((str(obj[k]) for k in ("question", "prompt", "text", "input") if isinstance(obj.get(k), str)), row)[:500]


def _follow_log(path: Path, offset: int, say: Callable[[str], None]) -> int:
    """Say the lines ``path`` gained since ``offset``; the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return offset
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].decode(errors="replace").splitlines():
        if line.strip():
            say(f"  {line}")
    return offset + end


def _optimize(sup: Any, name: str, cmd: list[str], say: Callable[[str], None]) -> None:
    """``rolloutbus optimize-prompt`` as process ``name`` to its end, its lines relayed; the others watched meanwhile."""
    from rolloutbus.runs.procs import ProcessDied

    say(f"optimize   rolloutbus {' '.join(cmd)}")
    log = sup.start(name, cmd).log
    offset = 0
    while (code := sup.returncode(name)) is None:
        offset = _follow_log(log, offset, say)
        try:
            sup.check()
        except ProcessDied:
            if sup.returncode(name) is None:  # another process died, not this one ending meanwhile
                raise
        time.sleep(1.0)
    _follow_log(log, offset, say)
    sup.stop(name)
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-8:]
        raise RolloutbusError(f"rolloutbus optimize-prompt exited with {code}:\n  " + "\n  ".join(tail))


def _record(settings: CommonSettings, name: str, run_id: str, want: int, wait_s: float = 30.0) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """The prompt's versions in ``resource_versions`` (up to ``want``, waited for: the sink flushes every 0.5 s)
    and the run's rows of ``prompt_candidates``."""
    deadline = time.monotonic() + wait_s
    while True:
        rows = _store_rows(settings, f"SELECT version, config, metrics FROM resource_versions FINAL WHERE name = {_sql_str(name)} "
                                     "ORDER BY version")
        if (rows and max(r[0] for r in rows) >= want) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    versions = {int(v): {"config": dict(c), "metrics": dict(m)} for v, c, m in rows}
    cols = ("candidate_id", "source", "round", "parent_id", "template", "score", "score_se", "tasks", "finished",
            "published_version", "note")
    cands = [dict(zip(cols, r)) for r in _store_rows(
        settings, f"SELECT {', '.join(cols)} FROM prompt_candidates FINAL WHERE run_id = {_sql_str(run_id)} ORDER BY created_ns, candidate_id")]
    return versions, cands


def _held_out(sup: Any, algo: APO, out: Path, cmd_args: tuple[str, str, str, str], initial: PromptTemplate, chosen: int,
              test: list[str], say: Callable[[str], None]) -> HeldOut:
    """``test`` answered under the chosen version (the latest: the incumbent of a dry run) and under version 0 (its
    one candidate), the same tasks in the same order: a paired before/after."""
    (out / "test.jsonl").write_text("".join(json.dumps({"input": t}) + "\n" for t in test))
    (out / "initial.json").write_text(json.dumps([initial.config()]))
    name, url, model, run_id = cmd_args
    held = APO(optimizer_url=algo.optimizer_url, optimizer_model=algo.optimizer_model, score_timeout_s=algo.score_timeout_s,
               apo_args=["--dry-run"])
    summary_path = out / f"{run_id}-heldout.json"
    say(f"held-out   version 0 and version {chosen} on the same {len(test)} test tasks")
    _optimize(sup, "heldout", held.command(str(out / "test.jsonl"), name, url, model, f"{run_id}-heldout", str(summary_path),
                                           str(out / "initial.json")), say)
    cands = json.loads(summary_path.read_text())["candidates"]
    now, first = next(c for c in cands if c["source"] == "incumbent"), next(c for c in cands if c["source"] == "user")
    result = HeldOut(0, chosen, [float(r) for r in first["rewards"]], [float(r) for r in now["rewards"]])
    say(f"held-out   {result.line()}")
    return result


def run_apo(trainer: Trainer, agent: Any, train: list[str], val: list[str], test: list[str] | None = None) -> APOResult:
    """fit under ``APO(...)``: see the module's docstring."""
    from trainer.settings import ServeSettings

    from rolloutbus.runs.live import wait_http
    from rolloutbus.localproc import free_port
    from rolloutbus.trainer_api.shipped import ENV as SHIPPED_ENV, ship
    from schemas import ResourceVersion, encode

    algo: APO = trainer.algorithm
    name, initial = prompt_resource(trainer.resources, algo.resource)
    say = trainer.say
    out = trainer.out
    val_rows = val or train
    run_id = f"apo-{uuid.uuid4().hex[:8]}"
    t_start = time.monotonic()
    with fit_stack(trainer) as (settings, stack, scope):  # as run_fit's: given addresses checked before anything
        if not val:
            say("validate   no val_dataset: APO scores the prompts on the training rows")
        (out / "validation.jsonl").write_text("".join(json.dumps({"input": v}) + "\n" for v in val_rows))
        if algo.candidates:
            (out / "candidates.json").write_text(json.dumps([{**initial.config(), "template": t} for t in algo.candidates]))
        serve_port, proxy_port = free_port(), free_port()
        proxy = f"http://127.0.0.1:{proxy_port}"
        served = load_settings(ServeSettings, {}).resource_name  # the name `serve` answers to (vLLM: no other)
        ship(PromptAdapted(agent, trainer.resources, name, proxy=proxy, val_temperature=algo.val_temperature, served=served),
             out / "agent.pickle")
        model = _model(trainer.resources.get("main_llm"), settings)
        env = process_env_of(settings, scope)
        sup = stack.procs
        sup.env = env
        _publish(settings, [(settings.topics.resources, name, encode(ResourceVersion(
            name=name, version=0, kind="prompt_template", created_ns=time.time_ns(), config=initial.config())))])
        say(f"published  {name} version 0: the initial template")
        sup.start("process", ["process", "--sink-interval", "0.5", "--finish-grace", str(FINISH_GRACE_S), *match_args(trainer)])
        sup.start("serve", serve_command(serve_port, trainer.engine, model))
        sup.start("proxy", ["proxy", "--upstream", f"http://127.0.0.1:{serve_port}/v1", "--port", str(proxy_port)])
        wait_http(f"http://127.0.0.1:{serve_port}/healthz", serve_start_s(trainer.engine), sup)
        wait_http(f"http://127.0.0.1:{proxy_port}/healthz", 60, sup)
        sup.env = dict(env, ROLLOUTBUS_LLM_PROXY_URL=proxy, **{SHIPPED_ENV: str(out / "agent.pickle")})
        sup.start("runners", ["run-agent", AGENT_SPEC, "--concurrency", str(trainer.n_runners), "--max-attempts", "1",
                              "--timeout", str(algo.rollout_timeout_s)])
        sup.env = env
        say(f"started    stream processor, policy server :{serve_port} ({trainer.engine}; the optimizer LLM "
            f"{'too' if not algo.optimizer_url else 'at ' + algo.optimizer_url}), LLM proxy :{proxy_port}, "
            f"{trainer.n_runners} runners (logs in {out / 'logs'})")
        gradient = train[: algo.gradient_batch_size]
        ran = _run_train_rows(settings, sup, gradient, algo.score_timeout_s, say) if gradient else 0
        summary_path = out / f"{run_id}.json"
        key = algo.optimizer_key()
        sup.env = dict(env, ROLLOUTBUS_APO_LLM_KEY=key) if key else env
        _optimize(sup, "optimize", algo.command(str(out / "validation.jsonl"), name, f"http://127.0.0.1:{serve_port}/v1", served,
                                                run_id, str(summary_path), str(out / "candidates.json") if algo.candidates else None),
                  say)
        summary = json.loads(summary_path.read_text())
        chosen = summary["published_version"] or 0
        versions, cands = _record(settings, name, run_id, chosen)
        held = _held_out(sup, algo, out, (name, f"http://127.0.0.1:{serve_port}/v1", served, run_id), initial, chosen,
                         test, say) if test else None
        sup.stop("runners", grace=30)
        if trainer.keep_store and stack.store is not None:
            stack.keep_store = True
            say(f"query      the store stays up on {stack.store.url}: rolloutbus query --run {scope.run} "
                "\"SELECT * FROM prompt_candidates FINAL\" (rolloutbus down stops it)")
    by_id = {c["id"]: c for c in summary["candidates"]}
    first = next(c for c in summary["candidates"] if c["source"] == "incumbent")
    best = by_id.get(summary["published_candidate"] or "", first)
    validation = {0: first["score"]} if first["score"] is not None else {}
    if summary["published_version"] is not None and best["score"] is not None:
        validation[chosen] = best["score"]
    scored = ran + sum(c["tasks"] for c in summary["candidates"]) + (2 * len(held.first_scores) if held else 0)
    result = APOResult(steps=[], versions=versions, rewards_by_version={}, rollouts=scored, seconds=time.monotonic() - t_start,
                       validation=validation, chosen=chosen, held_out=held, run_id=run_id, resource=name,
                       initial_prompt=initial.template, initial_score=first["score"], prompt=best["config"].get("template", ""),
                       prompt_version=chosen, score=best["score"], candidates=cands, run=scope.run or "",
                       database=settings.clickhouse_database)
    say(f"done       {name}: version {chosen} chosen, validation {_pct(result.score)} against version 0's "
        f"{_pct(result.initial_score)}; {len(cands)} candidates in prompt_candidates (run {run_id}), {result.seconds:.0f}s")
    return result


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


__all__ = ["APOResult", "PromptAdapted", "prompt_resource", "run_apo"]
