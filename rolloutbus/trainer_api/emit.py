"""Agent Lightning's ``agl.emit_*`` under ``import rolloutbus as agl``: :mod:`producers.emit`'s helpers, one span each
on the current rollout, except that outside a rollout they do what Agent Lightning's do there: nothing, with one
warning per helper (``producers.emit`` raises :class:`~foundation.errors.RolloutContextError` by default, so that our
own agents learn of a missing ``with rollout(...)`` at once). Never an exception into the agent's code."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from producers import emit as _emit
from producers.context import current_rollout

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
_warned: set[str] = set()


def _quiet_outside(fn: F) -> F:
    """``fn`` inside a rollout; outside one, nothing (a warning the first time, naming ``fn``)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if current_rollout() is None:
            if fn.__name__ not in _warned:
                _warned.add(fn.__name__)
                log.warning("agl.%s called outside a rollout: nothing recorded (run the agent under Trainer.fit/dev, "
                            "or wrap it in `with producers.rollout(...)`); said once", fn.__name__)
            return None
        return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


emit_state = _quiet_outside(_emit.emit_state)
emit_action = _quiet_outside(_emit.emit_action)
emit_reward = _quiet_outside(_emit.emit_reward)
emit_message = _quiet_outside(_emit.emit_message)
emit_object = _quiet_outside(_emit.emit_object)
emit_exception = _quiet_outside(_emit.emit_exception)
emit_tool_call = _quiet_outside(_emit.emit_tool_call)
emit_span = _quiet_outside(_emit.emit_span)

__all__ = ["emit_action", "emit_exception", "emit_message", "emit_object", "emit_reward", "emit_span", "emit_state",
           "emit_tool_call"]
