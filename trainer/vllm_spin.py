"""vLLM's shared-memory queues spin: shorten how long (opt-in, ``ROLLOUTBUS_VLLM_BUSY_LOOP_S``).

vLLM's engine core and its worker pass every step through shared-memory ring buffers
(``vllm/distributed/device_communicators/shm_broadcast.py``). A reader that finds nothing new spins on
``sched_yield()`` for ``SpinCondition.busy_loop_s`` (1 s, not settable by environment in vLLM 0.32.0) after its last
read before it waits on the writer's zmq notification. Under continuous generation the last read is always recent,
so the engine core spins while the worker computes each step: on the CPU backend, a core held whatever is generated
(the learning bench measured serve's engine at 331-350 CPU-seconds of 600 on 2 cores, with or without pacing). A
trainer sharing those cores gets what the spin leaves.

With ``ROLLOUTBUS_VLLM_BUSY_LOOP_S`` set (seconds, e.g. ``0``), :func:`install` makes that the default of every
``SpinCondition`` the engine's processes create: a reader then waits on the notification the writer already sends
after every write (a few tens of microseconds to wake, against a decode step of tens of milliseconds on the CPU).
Unset, vLLM is untouched.

Runs in vLLM's processes, in vLLM's own virtualenv, through the ``sitecustomize`` that
:func:`trainer.vllm_serve.extension_path` writes: standard library only. When the module no longer has
``SpinCondition(busy_loop_s=...)`` (a vLLM upgrade), the engine fails to start with the reason, rather than spin
unnoticed.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import os
import sys
from typing import Any

ENV = "ROLLOUTBUS_VLLM_BUSY_LOOP_S"
MODULE = "vllm.distributed.device_communicators.shm_broadcast"


class SpinPatchError(RuntimeError):
    """vLLM's shm_broadcast changed: the spin can no longer be shortened this way."""


def patch(module: Any, busy_loop_s: float) -> None:
    """Make ``busy_loop_s`` the default of ``module.SpinCondition``; :class:`SpinPatchError` when it has none."""
    cls = getattr(module, "SpinCondition", None)
    if cls is not None and getattr(cls.__init__, "_rolloutbus_busy_loop_s", None) is not None:
        return  # patched already
    if cls is None or "busy_loop_s" not in inspect.signature(cls.__init__).parameters:
        raise SpinPatchError(f"{ENV} is set, but {MODULE} has no SpinCondition(busy_loop_s=...) any more (a vLLM upgrade): "
                             f"unset {ENV}, or update trainer/vllm_spin.py")
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("busy_loop_s", busy_loop_s)
        original(self, *args, **kwargs)

    __init__._rolloutbus_busy_loop_s = busy_loop_s  # type: ignore[attr-defined]
    cls.__init__ = __init__


class _Finder(importlib.abc.MetaPathFinder):
    """Patches :data:`MODULE` as it is first imported."""

    def __init__(self, busy_loop_s: float) -> None:
        self.busy_loop_s = busy_loop_s

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, busy = spec.loader, self.busy_loop_s

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                patch(module, busy)

        spec.loader = _Loader()
        return spec


def install(environ: Any = None) -> bool:
    """With :data:`ENV` set, patch :data:`MODULE` when it is imported (now, if it already is). True when installed."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not value:
        return False
    try:
        busy = float(value)
    except ValueError:
        raise SpinPatchError(f"{ENV} must be seconds (e.g. 0), got {value!r}") from None
    if busy < 0:
        raise SpinPatchError(f"{ENV} must be seconds (e.g. 0), got {value!r}")
    if MODULE in sys.modules:
        patch(sys.modules[MODULE], busy)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(busy))
    return True


SITECUSTOMIZE = "from trainer.vllm_spin import install\ninstall()\n"

__all__ = ["ENV", "MODULE", "SITECUSTOMIZE", "SpinPatchError", "install", "patch"]
