"""Runs under Agent Lightning 0.3.0's own interpreter (see al_venv.py), never under ours.

Its own algorithm and trainer with the gateway as the store, the store URL the only change: ``Trainer(algorithm=
Baseline(...), store=LightningStoreClient(url), strategy=ClientServerExecutionStrategy(managed_store=False))`` and ``fit`` on a task
of this project (sums: the agent's answer is checked, the reward is 1.0 when right). Its Baseline enqueues the
dataset (``enqueue_rollout``, throttled by ``query_rollouts(status_in=["queuing", "requeuing"])``), polls each
rollout (``get_rollout_by_id``) until it ended and reads its attempts and spans (``query_attempts``,
``query_spans``); its runner dequeues, traces the agent and ends each attempt.

    python al_algorithm_driver.py STORE_URL OUT

Writes JSON to OUT: the rollouts its algorithm saw end, and the lines it logged.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import sys

from agentlightning.algorithm.fast import Baseline
from agentlightning.execution.client_server import ClientServerExecutionStrategy
from agentlightning.litagent import LitAgent
from agentlightning.store.client_server import LightningStoreClient
from agentlightning.tracer.otel import OtelTracer
from agentlightning.trainer import Trainer

LINES: list[str] = []


class Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        LINES.append(record.getMessage())


class Sums(LitAgent):
    """Adds the task's two numbers (wrong on purpose when the task says so); 1.0 for the right sum."""

    def rollout(self, task, resources, rollout):  # noqa: ANN001, ANN201
        answer = task["a"] + task["b"] + (1 if task.get("slip") else 0)
        return 1.0 if answer == task["a"] + task["b"] else 0.0


def main(url: str, out: str) -> None:
    faulthandler.dump_traceback_later(200, exit=True)  # a hang says where, before the test's own limit
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("agentlightning").addHandler(Keep())
    logging.getLogger("agentlightning").setLevel(logging.INFO)
    store = LightningStoreClient(url)
    train = [{"a": 1, "b": 2}, {"a": 3, "b": 4, "slip": True}]
    val = [{"a": 5, "b": 6}, {"a": 7, "b": 8, "slip": True}]
    trainer = Trainer(algorithm=Baseline(n_epochs=1, train_split=0.5, polling_interval=0.5), store=store,
                      tracer=OtelTracer(), n_runners=1,
                      # its runner in a process of its own, given the same store (the gateway), no store server of
                      # its own in between (managed_store=False); one client is not shared between two event loops
                      strategy=ClientServerExecutionStrategy(n_runners=1, managed_store=False))
    trainer.fit(Sums(), train_dataset=train, val_dataset=val)
    json.dump({"lines": LINES}, open(out, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
