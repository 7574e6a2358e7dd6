"""Function agents, as Agent Lightning's decorators make them: ``@rollout`` (or ``@llm_rollout`` / ``@prompt_rollout``)
over ``def agent(task, llm[, rollout]) -> float`` or ``def agent(task, prompt_template[, rollout]) -> float``, sync or
async, gives a :class:`~rolloutbus.trainer_api.agent.LitAgent` that ``Trainer.fit`` and ``dev`` run: the first
:class:`~rolloutbus.trainer_api.resources.LLM` (or :class:`~rolloutbus.trainer_api.resources.PromptTemplate`) among the
rollout's resources is passed as ``llm`` (``prompt_template``), the attempt as ``rollout`` when the function takes it.
The object still calls the function directly (``agent(task, llm)``).

``strip_proxy`` is accepted for Agent Lightning's code and changes nothing: the LLM ``fit`` hands an agent is already
an endpoint it can call (the proxy's; each call carries its attempt in headers, not in the URL).

A decorated function is sent to ``fit``'s runner processes by its module and name (as pickle sends a function), so
it must be defined at a module's top level (the script's own is fine).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import pickle
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from rolloutbus.trainer_api.agent import LitAgent
from rolloutbus.trainer_api.resources import LLM, PromptTemplate

log = logging.getLogger(__name__)
T = TypeVar("T")


class FunctionalLitAgent(LitAgent[T]):
    """A rollout function as an agent: ``rollout(task, resources, rollout)`` calls it with the resources it names."""

    def __init__(self, rollout_func: Callable[..., Any], *, strip_proxy: bool = True) -> None:
        super().__init__()
        self._rollout_func = rollout_func
        self._strip_proxy = strip_proxy
        self._params = inspect.signature(rollout_func).parameters
        functools.update_wrapper(self, rollout_func)  # type: ignore[arg-type]
        self.name = rollout_func.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._rollout_func(*args, **kwargs)

    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self._rollout_func)

    def rollout(self, task: T, resources: Mapping[str, Any], rollout: Any) -> Any:
        """The function's result (an awaitable for an async one: the runner awaits it)."""
        kwargs: dict[str, Any] = {}
        if "rollout" in self._params:
            kwargs["rollout"] = rollout
        if "llm" in self._params:
            kwargs["llm"] = _first(resources, LLM, "LLM")
        if "prompt_template" in self._params:
            kwargs["prompt_template"] = _first(resources, PromptTemplate, "prompt template")
        return self._rollout_func(task, **kwargs)

    async def rollout_async(self, task: T, resources: Mapping[str, Any], rollout: Any) -> Any:
        out = self.rollout(task, resources, rollout)
        return await out if inspect.isawaitable(out) else out

    def __reduce__(self) -> tuple[Any, ...]:
        module, qualname = self._rollout_func.__module__, self._rollout_func.__qualname__
        if "<" in qualname:  # a lambda or a function defined inside another: no name to find it by
            raise pickle.PicklingError(f"the rollout function {qualname} is not at a module's top level, so the runner "
                                       "processes cannot import it: define it at the top of a module or script")
        return (_named_agent, (module, qualname, self._strip_proxy))


def _named_agent(module: str, qualname: str, strip_proxy: bool) -> FunctionalLitAgent[Any]:
    """What unpickling a :class:`FunctionalLitAgent` gives: the agent the module defines under that name (the
    decorated function), or the plain function there wrapped again."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found if isinstance(found, FunctionalLitAgent) else FunctionalLitAgent(found, strip_proxy=strip_proxy)


def _first(resources: Mapping[str, Any], kind: type, what: str) -> Any:
    found: list[tuple[str, Any]] = []
    for name, value in resources.items():  # one resource under two keys (main_llm and its old key) counts once
        if isinstance(value, kind) and all(value is not v for _, v in found):
            found.append((name, value))
    if not found:
        raise ValueError(f"no {what} resource among the rollout's resources ({', '.join(resources) or 'none'})")
    if len(found) > 1:
        log.warning("several %s resources (%s): the agent gets the first, %r", what, ", ".join(n for n, _ in found), found[0][0])
    return found[0][1]


def _check(func: Any, resource: str) -> None:
    params = list(inspect.signature(func).parameters)
    if len(params) < 2 or params[0] != "task" or resource not in params:
        raise ValueError(f"{getattr(func, '__name__', func)}{inspect.signature(func)}: a rollout function takes (task, "
                         f"{resource}[, rollout])")


def llm_rollout(func: Callable[..., Any] | None = None, *, strip_proxy: bool = True) -> Any:
    """``@llm_rollout`` over ``(task, llm[, rollout])``, sync or async (also ``@llm_rollout(strip_proxy=...)``)."""

    def wrap(f: Callable[..., Any]) -> FunctionalLitAgent[Any]:
        _check(f, "llm")
        return FunctionalLitAgent(f, strip_proxy=strip_proxy)

    return wrap if func is None else wrap(func)


def prompt_rollout(func: Callable[..., Any] | None = None) -> Any:
    """``@prompt_rollout`` over ``(task, prompt_template[, rollout])``, sync or async."""

    def wrap(f: Callable[..., Any]) -> FunctionalLitAgent[Any]:
        _check(f, "prompt_template")
        return FunctionalLitAgent(f)

    return wrap if func is None else wrap(func)


def rollout(func: Callable[..., Any]) -> FunctionalLitAgent[Any]:
    """``@rollout``: :func:`llm_rollout` or :func:`prompt_rollout`, by the function's parameters."""
    params = inspect.signature(func).parameters
    if "llm" in params:
        return llm_rollout(func)  # type: ignore[no-any-return]
    if "prompt_template" in params:
        return prompt_rollout(func)  # type: ignore[no-any-return]
    raise NotImplementedError(f"{func.__name__}{inspect.signature(func)} is not a rollout function: expected (task, "
                              "llm[, rollout]) or (task, prompt_template[, rollout]), sync or async")


__all__ = ["FunctionalLitAgent", "llm_rollout", "prompt_rollout", "rollout"]
