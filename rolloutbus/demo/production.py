"""The production demo (``rolloutbus demo --production``): the agent serves requests that carry no task id,
as a deployed agent does; a simulated user sends feedback for a fraction of them, seconds to minutes later
(:func:`producers.emit_feedback`); the stream worker applies it within its window and trains each such
rollout once with a running baseline (``--feedback-baseline loo``, or ``prompt``: streams.baselines).

Nothing is replayed: every request is one rollout, answered once, by whichever version serves it. The
agent's own reward is unknown when it answers (it returns none); the user's judgement — whether the answer
was right — is what :class:`ServedAgent` keeps for :class:`SimulatedUser` to send later. The rest of the
run (the stack, the processes, the live table, the held-out evaluation, the report) is the demo's
(:mod:`rolloutbus.demo.driver`).
"""

from __future__ import annotations

import heapq
import importlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rolloutbus.demo.config import ProductionConfig
from rolloutbus.trainer_api import LitAgent, Rollout


BASELINES = {"loo": "reward − the agent's running leave-one-out mean", "prompt": "reward − the running mean of the same prompt's "
             "earlier feedback", "none": "the reward"}


def feedback_delay(rng: random.Random, fraction: float, lo: float, hi: float) -> float | None:
    """Seconds until the user's feedback on one answer, or None (this one gets none). Pure given ``rng``:
    log-uniform, so most feedback comes in seconds and some minutes later."""
    if rng.random() >= fraction:
        return None
    return math.exp(rng.uniform(math.log(lo), math.log(hi))) if hi > lo else lo


class ServedAgent(LitAgent):
    """A task's agent as deployed: ``inner`` answers; its reward is not known when it answers (none is
    recorded), the verdict goes to ``judged(rollout_id, verdict)`` — what the user will say later."""

    def __init__(self, inner: LitAgent, judged: Callable[[str, float], None]) -> None:
        self.inner, self.judged = inner, judged
        self.name = inner.name

    def rollout(self, task: Any, resources: Mapping[str, Any], rollout: Rollout) -> None:
        verdict = self.inner.rollout(task, resources, rollout)
        self.judged(rollout.rollout_id, float(verdict or 0.0))
        return None


@dataclass
class UserStats:
    served: int = 0
    failed: int = 0
    feedback_sent: int = 0
    feedback_positive: int = 0
    left_unsent: int = 0  # due after the run stopped


class SimulatedUser:
    """Schedules feedback on answers (:func:`feedback_delay`) and sends what is due (:meth:`send_due`)."""

    def __init__(self, cfg: ProductionConfig, seed: int, send: Callable[[str, float], Any]) -> None:
        self.cfg, self.send = cfg, send
        self.rng = random.Random(seed)
        self.due: list[tuple[float, str, float]] = []
        self.lock = threading.Lock()
        self.stats = UserStats()

    def judged(self, rollout_id: str, verdict: float) -> None:
        with self.lock:
            self.stats.served += 1
            delay = feedback_delay(self.rng, self.cfg.feedback_fraction, self.cfg.delay_min_s, self.cfg.delay_max_s)
            if delay is not None:
                heapq.heappush(self.due, (time.monotonic() + delay, rollout_id, verdict))

    def send_due(self, now: float | None = None) -> int:
        """Send the feedback whose time has come; → how many."""
        now = time.monotonic() if now is None else now
        out = []
        with self.lock:
            while self.due and self.due[0][0] <= now:
                _, rid, value = heapq.heappop(self.due)
                out.append((rid, value))
        for rid, value in out:
            if self.send(rid, value) is not None:
                with self.lock:
                    self.stats.feedback_sent += 1
                    self.stats.feedback_positive += value >= 1.0
        return len(out)

    def drop_rest(self) -> None:
        with self.lock:
            self.stats.left_unsent += len(self.due)
            self.due.clear()


def agent_class(spec: str) -> type[LitAgent]:
    """``module:Class`` (the task's ``run-agent`` argument) → the class."""
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type) and issubclass(cls, LitAgent), spec
    return cls


class SFTFirst:
    """``--sft-first``: the deployment serves the warm-up, untrained, for ``sft_at`` of the training time (the
    feedback is applied and its batches wait on rb.batches); then ``rolloutbus train --algorithm sft`` fine-tunes
    on the positively judged task-less rollouts (the best one per prompt; ``<out>/logs/sft.log``) and publishes
    its versions; then the feedback trainer starts from the SFT's checkpoint (the same checkpoint directory) and
    trains on the feedback, the waiting batches first: rejection-sampling fine-tuning, then RL."""

    def __init__(self, prod: ProductionConfig, sup: Any, train_argv: list[str], base: str, after_s: float, say: Any) -> None:
        self.prod, self.sup, self.train_argv, self.base, self.after_s, self.say = prod, sup, train_argv, base, after_s, say
        self.t0 = time.monotonic()
        self.state = "serve"
        self.proc: Any = None
        self.started = self.ended = 0.0

    @property
    def seconds(self) -> float:
        """How long the SFT ran (so far): the demo adds it to the training time, the RL phase keeps its share."""
        return (self.ended or time.monotonic()) - self.started if self.started else 0.0

    def command(self) -> list[str]:
        """The SFT's command line: the feedback trainer's ``--train-layers`` too (the SQL task trains the top 10), since
        that trainer goes on from this checkpoint: the same layers trained, the same optimizer state."""
        layers = [a for flag, a in zip(self.train_argv, self.train_argv[1:]) if flag == "--train-layers"][-1:]
        return ["train", "--algorithm", "sft", "--model", self.base, "--threads", "1", "--sft-where", "r.task_id = ''",
                "--sft-min-reward", "1", "--sft-key", "prompt", "--sft-top-k", "1", "--sft-epochs", str(self.prod.sft_epochs),
                "--sft-lr", str(self.prod.sft_lr), "--sft-batch-size", str(self.prod.sft_batch_size), *(["--train-layers", *layers] if layers else [])]

    @staticmethod
    def first_version(said: list[str]) -> int | None:
        """The first version the SFT published (its ``SFT epoch N: ... policy version V`` lines). The feedback trainer
        trains on answers served from it on: the batches that waited were answered by the warm-up the SFT replaced,
        and its right ones are what the SFT trained on (run 1 of --task sql took them first and fell to 0%)."""
        versions = [int(line.rsplit(" ", 1)[1]) for line in said if line.startswith("SFT epoch") and line.rsplit(" ", 1)[1].isdigit()]
        return min(versions) if versions else None

    def poll(self) -> None:
        import subprocess
        import sys

        if self.state == "serve" and time.monotonic() - self.t0 >= self.after_s:
            self.say(f"sft        {time.monotonic() - self.t0:.0f} s served untrained: rolloutbus {' '.join(self.command())}")
            log = self.sup.log_dir / "sft.log"
            with open(log, "wb") as out:  # this run's lines only: they are read back below
                self.proc = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", *self.command()], stdout=out,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.sup.env,
                                             start_new_session=True)
            self.state, self.started = "sft", time.monotonic()
        elif self.state == "sft" and self.proc.poll() is not None:
            self.ended = time.monotonic()
            log = (self.sup.log_dir / "sft.log").read_text(errors="replace").splitlines()
            said = [ln for ln in log if ln.startswith("SFT")]
            if self.proc.returncode != 0:
                from foundation.errors import RolloutbusError

                raise RolloutbusError(f"the SFT exited with {self.proc.returncode}: " + " / ".join((said or log)[-4:]))
            for line in said:
                self.say(f"sft        {line}")
            first = self.first_version(said)
            self.say("sft        done: the feedback trainer starts from its checkpoint" + (
                f", on answers served from version {first} on" if first is not None else ""))
            self.sup.start("train", [*self.train_argv, *(["--min-version", str(first)] if first is not None else [])])
            self.state = "rl"

    def close(self) -> None:
        import os
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Traffic:
    """Requests with no task id, ``concurrency`` at once, from the training problems at random, each served
    once by the newest version; the user's feedback sent as it falls due. The demo's loop calls
    :meth:`top_up` (as it does the task feeder's) and :meth:`close` when time is up."""

    def __init__(self, settings: Any, problems: list[Any], agent: LitAgent, prod: ProductionConfig, concurrency: int,
                 seed: int, say: Any, sft: SFTFirst | None = None) -> None:
        from producers.runner import ResourceFollower
        from producers.settings import AgentSettings
        from producers.transport import SpanTransport

        self.say, self.sft = say, sft
        # the follower's version changes would interleave the live table (run-agent logs them in its own file)
        logging.getLogger("producers.runner").setLevel(logging.WARNING)
        agent_settings = AgentSettings(data_dir=settings.data_dir)
        self.spans = SpanTransport.from_settings(agent_settings, spool_name="demo-production")
        self.feedback = SpanTransport(agent_settings.kafka_conf(), settings.topics.feedback, settings.data_dir / "spool",
                                      spool_name="demo-feedback")
        self.user = SimulatedUser(prod, seed + 101, self._send)
        self.agent = ServedAgent(agent, self.user.judged)
        self.problems = problems
        self.resources = ResourceFollower(settings.kafka_conf(), settings.topics.resources).start()
        self.stop = threading.Event()
        self.interval = 1.0 / prod.rate if prod.rate > 0 else 0.0
        self.next_slot = time.monotonic()
        self.slot_lock = threading.Lock()
        self.threads = [threading.Thread(target=self._serve, args=(seed * 1000 + i,), name=f"demo-traffic-{i}", daemon=True)
                        for i in range(concurrency)]
        for t in self.threads:
            t.start()

    def _send(self, rollout_id: str, value: float) -> str | None:
        from producers.emit import emit_feedback

        return emit_feedback(rollout_id, value, transport=self.feedback, metadata={"source": "demo user"})

    def _serve(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            if self.interval:  # the request rate: one slot every interval, whichever agent is free takes it
                with self.slot_lock:
                    now = time.monotonic()
                    slot = self.next_slot = max(now, self.next_slot + self.interval)
                if self.stop.wait(max(0.0, slot - now)):
                    break
            problem = rng.choice(self.problems)
            policy = self.resources.current().get("policy")
            res = self.agent.run(problem.to_json(), {}, task_id="", mode="train",
                                 resource_version=policy.version if policy is not None else None, transport=self.spans)
            if res.status != "succeeded":
                with self.user.lock:
                    self.user.stats.failed += 1
                time.sleep(0.5)  # the server may be restarting: not a hot loop

    @property
    def paused_s(self) -> float:
        """Seconds the training clock stood still (the SFT of ``--sft-first``)."""
        return self.sft.seconds if self.sft is not None else 0.0

    def top_up(self) -> None:
        self.user.send_due()
        if self.sft is not None:
            self.sft.poll()

    def close(self) -> None:
        if self.sft is not None:
            self.sft.close()
        self.stop.set()
        for t in self.threads:
            t.join(120)
        self.user.send_due()
        self.user.drop_rest()
        self.spans.close(30)
        self.feedback.close(30)
        s = self.user.stats
        self.say(f"traffic    {s.served} requests served without a task id ({s.failed} failed), feedback sent on "
                 f"{s.feedback_sent} ({s.feedback_positive} positive); {s.left_unsent} still due at the end were not sent")


def start_traffic(settings: Any, cfg: Any, task: Any, proxy_url: str, say: Any, sup: Any = None,
                  train_argv: list[str] | None = None) -> Traffic:
    """The deployment's traffic for the demo's ``task`` (its sampling agent behind ``proxy_url``); with
    ``--sft-first``, ``train_argv`` (the trainer's command, not started yet) is started after the SFT."""
    prod: ProductionConfig = cfg.production
    import os

    # the task's agent as run-agent would start it: its environment (sampling temperature, rewrites) applies
    os.environ.update(task.env)
    agent = agent_class(task.agent)(proxy=proxy_url)
    say(f"traffic    {'up to ' + format(prod.rate, 'g') + ' requests a second, ' if prod.rate else ''}{cfg.runners} at once, no task ids; the user judges {prod.feedback_fraction:.0%} of the answers "
        f"{prod.delay_min_s:g}–{prod.delay_max_s:g} s later (log-uniform); the worker applies feedback within "
        f"{prod.window_s:g} s and trains each judged rollout once, advantage = " + BASELINES[prod.baseline])
    sft = SFTFirst(prod, sup, train_argv or [], str(task.model), prod.sft_at * cfg.minutes * 60, say) if prod.sft_first else None
    return Traffic(settings, task.train, agent, prod, cfg.runners, cfg.seed, say, sft)


def production_report(settings: Any, say: Any, steps: list[dict[str, Any]] | None = None, sent: int | None = None) -> dict[str, int]:
    """What the feedback did, from ClickHouse: task-less rollouts stored, judged, sent to training; dead letters by
    reason; and from the trainer's steps (``steps``: their metrics, as the demo followed them) what it took."""
    from foundation.clickhouse import connect

    client = connect(settings.dsn, database=settings.clickhouse_database, create_database=False)
    try:
        stored, judged, trained, versions = client.query(
            "SELECT count(), countIf(metadata['rolloutbus.feedback_id'] != ''), countIf(startsWith(group_id, 'feedback:')), "
            "uniqExactIf(resource_version, startsWith(group_id, 'feedback:')) "
            "FROM rollouts FINAL WHERE mode = 'train' AND task_id = ''").result_rows[0]
        dead = client.query("SELECT reason, count() FROM dead_letters WHERE stage = 'streams.feedback' GROUP BY reason "
                            "ORDER BY reason").result_rows
        n_steps = client.query("SELECT uniqExact(step) FROM train_steps").result_rows[0][0]
    finally:
        client.close()
    say("")
    say("[bold]feedback[/bold] (task-less rollouts, as recorded in ClickHouse):")
    say(f"  {stored} rollouts without a task id stored; {judged} got the user's feedback, applied once; "
        f"{trained} trained on it (one-rollout batches, served by {versions} versions); {n_steps} optimiser steps")
    if steps:  # a step's counters are what came since the step before
        took = int(sum(float(s.get("groups", 0)) for s in steps))
        stale = int(sum(float(s.get("batches_dropped_stale", 0)) for s in steps))
        say(f"  the trainer's steps took {took} of those batches; {stale} came more than --max-staleness versions late (or "
            "before --min-version) and were dropped (a trainer slower than the traffic: the rest were still waiting)")
    if sent is not None and sent > judged + sum(int(n) for _, n in dead):
        say(f"  {sent - judged - sum(int(n) for _, n in dead)} feedback sent were not applied yet when the worker stopped "
            "(its feedback stage behind the traffic)")
    say("  dead-lettered feedback: " + (", ".join(f"{r} {n}" for r, n in dead) if dead else "none"))
    return {"stored": int(stored), "judged": int(judged), "trained": int(trained), "steps": int(n_steps),
            "dead": sum(int(n) for _, n in dead)}


__all__ = ["ProductionConfig", "SFTFirst", "ServedAgent", "SimulatedUser", "Traffic", "agent_class", "feedback_delay",
           "production_report", "start_traffic"]
