"""A version evaluated on its own: greedy answers to held-out problems through a server and a proxy of its own
(the rollouts recorded, mode ``test``), and the trainer's validation carried on once the trainer has stopped."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from foundation.config import CommonSettings
from foundation.errors import RolloutbusError
from rolloutbus.localproc import free_port
from rolloutbus.runs.live import wait_http
from rolloutbus.runs.procs import Supervisor


class EvalTask(Protocol):
    """How a task's versions are evaluated: the server's threads, flags and start-up time, and the agent."""

    eval_threads: int
    serve_args: list[str]
    serve_start_s: float

    def eval_agent(self, url: str) -> Any: ...


def evaluate(settings: CommonSettings, sup: Supervisor, uri: str, version: int, problems: list[Any],
             name: str, task: EvalTask, threads: int = 8) -> list[float]:
    """Greedy evaluation of one version on ``problems``, through its own server and proxy (recorded, mode test)."""
    from producers.settings import AgentSettings
    from producers.transport import SpanTransport

    serve_port, proxy_port = free_port(), free_port()
    sup.start(f"eval-serve-v{version}", ["serve", "--model", uri, "--no-follow", "--port", str(serve_port),
                                         "--threads", str(task.eval_threads), "--max-batch", str(threads), *task.serve_args])
    sup.start(f"eval-proxy-v{version}", ["proxy", "--upstream", f"http://127.0.0.1:{serve_port}/v1", "--port", str(proxy_port)])
    try:
        wait_http(f"http://127.0.0.1:{serve_port}/healthz", task.serve_start_s, sup)
        wait_http(f"http://127.0.0.1:{proxy_port}/healthz", 60, sup)
        # The run's topics (a fit run has its own prefix; the environment holds the user's)
        transport = SpanTransport.from_settings(AgentSettings(data_dir=settings.data_dir, topic_prefix=settings.topic_prefix),
                                                spool_name=f"demo-eval-{name}")
        agent = task.eval_agent(f"http://127.0.0.1:{proxy_port}")
        try:
            def one(i_p: tuple[int, Any]) -> float:
                i, p = i_p
                res = agent.run(json.loads(p.to_json()), {}, task_id=f"heldout-{i:04d}", mode="test",
                                resource_version=version, transport=transport)
                return float(res.reward or 0.0) if res.status == "succeeded" else 0.0

            with ThreadPoolExecutor(threads) as pool:
                return list(pool.map(one, enumerate(problems)))
        finally:
            transport.close(30)
    finally:
        sup.stop(f"eval-proxy-v{version}")
        sup.stop(f"eval-serve-v{version}")


def final_validator(settings: CommonSettings, validation: list[Any], run_id: str, version: int) -> Any:
    """The trainer's validation of its last version (``validation``: problems with ``to_json()``), carried on
    once the trainer has stopped."""
    from confluent_kafka import Producer

    from foundation.clickhouse import connect
    from trainer.validation import Validator

    producer = Producer({**settings.kafka_conf(), "enable.idempotence": True, "log_level": 0})

    def publish(topic: str, key: str, value: bytes) -> None:
        producer.produce(topic, key=key.encode(), value=value)
        producer.flush(10)

    v = Validator([q.to_json() for q in validation], run_id, settings.topics.tasks, publish,
                  lambda: connect(settings.dsn, database=settings.clickhouse_database, create_database=False))
    v.published.append(version)
    return v


def version_uri(versions: dict[int, dict[str, Any]], version: int) -> str:
    """A version's weights; an older checkpoint the trainer pruned is refused with the setting that keeps it."""
    uri = versions[version]["uri"]
    if not Path(uri).exists():
        raise RolloutbusError(f"version {version}'s checkpoint {uri} was pruned: raise ROLLOUTBUS_KEEP_CHECKPOINTS")
    return str(uri)


__all__ = ["EvalTask", "evaluate", "final_validator", "version_uri"]
