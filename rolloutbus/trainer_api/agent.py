"""The agent class — the one there is, the write-ups' shape: subclass :class:`LitAgent` and write
``rollout(task, resources, rollout)`` returning the reward; ``resources["main_llm"]`` is the model being trained (an
:class:`~rolloutbus.trainer_api.resources.LLM`), a prompt a :class:`~rolloutbus.trainer_api.resources.PromptTemplate`,
``rollout`` a :class:`~rolloutbus.trainer_api.resources.Rollout`, ``self.tracer`` the tracer.

What runs it is an :class:`producers.litagent.AttemptRunner` (context, spans, retries, timeouts): :class:`Adapted`,
which turns the runner's resources and rollout context into these names (``rolloutbus run-agent``, ``Trainer.fit``,
``Trainer.dev``, ``LitAgent.run``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Generic, TypeVar

from foundation.errors import ConfigError
from producers.context import RolloutContext
from producers.litagent import AttemptResult, AttemptRunner
from rolloutbus.trainer_api.resources import LLM, Rollout, from_version
from rolloutbus.trainer_api.tracing import Tracer, tracing

T = TypeVar("T")
VALIDATION_MODES = ("val", "test")  # rollouts that score the policy (the trainer's validation is mode test)
MAIN_LLM = "main_llm"  # the key of the model being trained, as the write-ups name it
POLICY = "policy"  # its name on rb.resources, and its key in the agent class's resources before this release
log = logging.getLogger(__name__)


class LitAgent(Generic[T]):
    """Base class of a write-ups-style agent: implement ``rollout(task, resources, rollout) -> float | None``."""

    name: str | None = None

    def __init__(self) -> None:  # the write-ups call super().__init__()
        pass

    @property
    def tracer(self) -> Tracer:
        return Tracer()

    def rollout(self, task: T, resources: Mapping[str, Any], rollout: Rollout) -> float | None:
        raise NotImplementedError("implement rollout(task, resources, rollout) -> float | None")

    def as_runner_agent(self) -> Adapted:
        """What ``rolloutbus run-agent --agent module:name`` runs for this agent: the bus's resources as
        :class:`~rolloutbus.trainer_api.resources.LLM` / ``PromptTemplate`` (:func:`~rolloutbus.trainer_api.resources.
        from_version`), under their names on ``rb.resources``, the trained model (``policy`` there) as ``main_llm``."""
        return Adapted(self, {})

    def run(self, task: Any, resources: Mapping[str, Any] | None = None, *, task_id: str = "", **kwargs: Any) -> AttemptResult:
        """Run one attempt in this thread, as the runners do (its spans on ``rb.spans``): ``resources`` as on
        ``rb.resources`` (name → version record); → how it ended (:class:`~producers.litagent.AttemptResult`)."""
        return self.as_runner_agent().run(task, resources, task_id=task_id, **kwargs)

    async def arun(self, task: Any, resources: Mapping[str, Any] | None = None, *, task_id: str = "",
                   **kwargs: Any) -> AttemptResult:
        """:meth:`run` on the running event loop (``timeout``, ``heartbeat_s`` as the runners give them)."""
        return await self.as_runner_agent().arun(task, resources, task_id=task_id, **kwargs)


def check_agent(agent: Any) -> None:
    """One clear line for an object that cannot be an agent."""
    if isinstance(agent, type):
        raise ConfigError(f"pass an instance of {agent.__name__}, not the class: {agent.__name__}(...)")
    if not callable(getattr(agent, "rollout", None)):
        raise ConfigError(f"{type(agent).__name__} has no rollout(task, resources, rollout) method: subclass "
                          "rolloutbus.LitAgent and implement it")
    if isinstance(agent, LitAgent) and type(agent).rollout is LitAgent.rollout:
        raise ConfigError(f"{type(agent).__name__} does not implement rollout(task, resources, rollout)")


class Adapted(AttemptRunner):
    """A write-ups-style agent as the runners run agents. ``resources``: the Trainer's initial resources;
    ``proxy``: the LLM proxy's base URL (``fit``), so ``main_llm`` points there; None (``dev``): as given.
    ``served``: the model name the policy server answers to under ``fit`` (vLLM's knows no other), given to the
    agent as ``LLM.model``. ``val_temperature``: the LLMs' temperature in validation rollouts (mode ``val`` /
    ``test``; None: as given)."""

    def __init__(self, agent: Any, resources: Mapping[str, Any], proxy: str | None = None,
                 val_temperature: float | None = None, served: str | None = None) -> None:
        check_agent(agent)
        self.agent = agent
        self.resources = dict(resources)
        self.proxy = proxy
        self.val_temperature = val_temperature
        self.served = served
        self.name = getattr(agent, "name", None) or type(agent).__name__

    def named_resources(self, runner_resources: Mapping[str, Any], mode: str = "train") -> dict[str, Any]:
        """The Trainer's resources, each LLM pointed at the proxy and named as served under ``fit`` (at
        ``val_temperature`` in a validation rollout); then the runner's (bus) resources as the records they are, or,
        with no Trainer resources (``rolloutbus run-agent``), an LLM or a prompt template as one
        (:func:`~rolloutbus.trainer_api.resources.from_version`)."""
        named: dict[str, Any] = {}
        for key, value in self.resources.items():
            if isinstance(value, LLM) and self.proxy:
                value = replace(value, endpoint=self.proxy, proxied=True, model=self.served or value.model)
            if isinstance(value, LLM) and mode in VALIDATION_MODES and self.val_temperature is not None:
                value = replace(value, sampling_parameters={**value.sampling_parameters, "temperature": self.val_temperature})
            named[key] = value
        for key, value in runner_resources.items():
            if key not in named:
                named[key] = (None if self.resources else from_version(value)) or value
        if POLICY in named and MAIN_LLM not in named:  # the trained model under the write-ups' key; its old key answers too
            return _Named({**named, MAIN_LLM: named[POLICY]}, aliases={POLICY: MAIN_LLM})
        return named

    def rollout(self, task: Any, resources: Mapping[str, Any], rollout: RolloutContext) -> float | None:
        with tracing():  # the proxy's headers on every LLM call, whether or not the agent touches self.tracer
            out = self.agent.rollout(task, self.named_resources(resources, rollout.mode), Rollout.of(rollout))
            if inspect.isawaitable(out):
                out = asyncio.run(_await(out))  # this attempt's own thread (the runner's worker, or the dry run's)
        return out  # type: ignore[no-any-return]


async def _await(aw: Any) -> Any:
    return await aw


class _Named(dict):  # type: ignore[type-arg]
    """An agent's resources where an old key still answers, for one release: reading it says once which key it is now
    (``resources["policy"]`` → ``resources["main_llm"]``)."""

    warned: set[str] = set()

    def __init__(self, items: Mapping[str, Any], aliases: Mapping[str, str]) -> None:
        super().__init__(items)
        self.aliases = dict(aliases)

    def _said(self, key: Any) -> None:
        if key in self.aliases and key not in _Named.warned:
            _Named.warned.add(key)
            log.warning("resources[%r] is resources[%r] under its old name; the old name goes in the next release",
                        key, self.aliases[key])

    def __getitem__(self, key: Any) -> Any:
        self._said(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            self._said(key)
        return super().get(key, default)


__all__ = ["LitAgent", "Adapted", "check_agent"]
