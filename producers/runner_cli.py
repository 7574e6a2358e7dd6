"""``rolloutbus run-agent module:Agent``: run an agent on tasks from rb.tasks (``ROLLOUTBUS_RUNNER_*``)."""

from __future__ import annotations

import argparse

from foundation.flags import Bounded


# flag dest → settings field: what the flags set, and where their help's variable and default come from
_FLAGS = {"concurrency": "runner_concurrency", "group": "runner_group", "max_attempts": "runner_max_attempts",
          "timeout": "runner_timeout_s"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("agent", help="the agent, as package.module:AgentClass (a rolloutbus.LitAgent class or instance, an @agl.rollout function, or a function of the records (task, resources, rollout))")
    parser.add_argument("--concurrency", type=int, default=None, help="rollouts at once")
    parser.add_argument("--group", default=None, help="consumer group")
    parser.add_argument("--max-attempts", type=int, default=None, help="attempts per rollout")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before an attempt ends as timeout")
    parser.add_argument("--max-tasks", type=Bounded(int, ge=1), default=None, help="exit after this many tasks")
    from foundation.flags import describe_flags

    describe_flags(parser, "producers.settings:RunnerSettings", _FLAGS)  # each flag's variable and default, from the settings


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from producers.runner import TaskRunner, load_agent
    from producers.settings import RunnerSettings
    from producers.transport import SpanTransport
    from foundation.entry import settings_from_args

    s = settings_from_args(RunnerSettings, args, _FLAGS)
    agent = load_agent(args.agent)
    transport = SpanTransport.from_settings(s, spool_name="runner")
    runner = TaskRunner(
        agent, s.kafka_conf(), s.topics, transport, group=s.runner_group, concurrency=s.runner_concurrency,
        max_attempts=s.runner_max_attempts, timeout_s=s.runner_timeout_s, heartbeat_s=s.runner_heartbeat_s,
    )
    log = logging.getLogger(__name__)
    log.info("running %s on %s (group %s, %d at once)", args.agent, s.topics.tasks, s.runner_group, s.runner_concurrency)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop)
        stats = await runner.run(max_tasks=args.max_tasks)
        log.info("done: %s", stats)

    try:
        asyncio.run(main())
    finally:
        runner.resources.stop()
        transport.close(30)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m producers.runner_cli AGENT``: the same as ``rolloutbus run-agent``."""
    from foundation.entry import run_command

    return run_command("rolloutbus run-agent", add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
