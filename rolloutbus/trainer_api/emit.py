"""Agent Lightning's ``agl.emit_*`` under ``import rolloutbus as agl``: :mod:`producers.emit`'s helpers, one span each
on the current rollout, except that outside a rollout they do what Agent Lightning's do there: nothing, with one
warning per helper (``producers.emit`` raises :class:`~foundation.errors.RolloutContextError` by default, so that our
own agents learn of a missing ``with rollout(...)`` at once). Never an exception into the agent's code."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from producers import emit as _emit
from producers.context import current_rollout

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
_warned: set[str] = set()


def _quiet_outside(fn: F, label: str | None = None) -> F:
    """``fn`` inside a rollout; outside one, nothing (a warning the first time, naming ``fn``, or ``label``)."""
    said = label or fn.__name__

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if current_rollout() is None:
            if said not in _warned:
                _warned.add(said)
                log.warning("agl.%s called outside a rollout: nothing recorded (run the agent under Trainer.fit/dev, "
                            "or wrap it in `with producers.rollout(...)`); said once", said)
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



def _flat(values: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dict(values).items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@_quiet_outside
def emit_annotation(annotation: Any, propagate: bool = True) -> None:
    """Agent Lightning's annotation: one span (kind ``span``, name ``agentlightning.annotation``) whose attributes
    are ``annotation``, nested dicts flattened to dotted keys. ``propagate=False`` records nothing, as there."""
    if propagate:
        _emit.emit_span("span", ANNOTATION, _flat(annotation))


ANNOTATION = "agentlightning.annotation"
OPERATION = "agentlightning.operation"


class Operation:
    """``with agl.operation(**attributes) as op:`` (``op.set_input(...)``, ``op.set_output(...)``) or ``@agl.operation``
    over a function: one span (kind ``span``, name ``agentlightning.operation``) from the block's start to its end,
    with the attributes, the input and the output as JSON, ``ERROR`` and the exception's line when the block raises
    (the exception goes on). Outside a rollout: nothing recorded (said once, as every ``agl.emit_*``)."""

    def __init__(self, attributes: dict[str, Any], propagate: bool = True) -> None:
        self.attributes = dict(attributes)
        self.propagate = propagate
        self._start = 0

    def set_input(self, *args: Any, **kwargs: Any) -> None:
        self.attributes["operation.input"] = {"args": list(args), "kwargs": kwargs} if args else kwargs

    def set_output(self, output: Any) -> None:
        self.attributes["operation.output"] = output

    def __enter__(self) -> Operation:
        self._start = time.time_ns()
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if not self.propagate:
            return
        fields: dict[str, Any] = {"start_time_ns": self._start, "end_time_ns": time.time_ns(),
                                  "status_code": "ERROR" if exc is not None else "OK"}
        if exc is not None:
            fields["status_message"] = f"{type(exc).__name__}: {exc}"
        _record_operation(self.attributes, fields)

    def __call__(self, fn: F) -> F:
        name = self.attributes.get("operation.name", getattr(fn, "__name__", "operation"))
        if asyncio.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def acall(*args: Any, **kwargs: Any) -> Any:
                with Operation({**self.attributes, "operation.name": name}, self.propagate) as op:
                    op.set_input(*args, **kwargs)
                    out = await fn(*args, **kwargs)
                    op.set_output(out)
                    return out

            return acall  # type: ignore[return-value]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            with Operation({**self.attributes, "operation.name": name}, self.propagate) as op:
                op.set_input(*args, **kwargs)
                out = fn(*args, **kwargs)
                op.set_output(out)
                return out

        return call  # type: ignore[return-value]


def _record(attributes: dict[str, Any], fields: dict[str, Any]) -> None:
    _emit.emit_span("span", OPERATION, attributes, **fields)


_record_operation = _quiet_outside(_record, "operation")


def operation(fn: Any = None, *, propagate: bool = True, name: str | None = None, **attributes: Any) -> Any:
    """Agent Lightning's ``operation``: ``@agl.operation``, ``@agl.operation(name=..., **attributes)`` or ``with
    agl.operation(**attributes) as op`` (see :class:`Operation`)."""
    if name is not None:
        attributes["operation.name"] = name
    op = Operation(attributes, propagate)
    return op(fn) if fn is not None else op


__all__ = ["emit_action", "emit_annotation", "operation", "Operation", "emit_exception", "emit_message", "emit_object", "emit_reward", "emit_span", "emit_state",
           "emit_tool_call"]
