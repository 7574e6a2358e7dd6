"""How ``Trainer.fit`` hands its agent object to the runner processes (``rolloutbus run-agent
rolloutbus.trainer_api.shipped:agent``): pickled to a file named by ``ROLLOUTBUS_SHIPPED_AGENT``.

An agent class defined in the user's script (module ``__main__``) is found as ``multiprocessing``'s spawn
finds it: the script is run again as ``__mp_main__`` (its ``if __name__ == "__main__":`` block does not
run) and stands for ``__main__`` while unpickling. ``ROLLOUTBUS_TRAINER_CHILD`` is set meanwhile, so a
script that calls ``fit`` unguarded fails with one line instead of starting a second run.
"""

from __future__ import annotations

import os
import pickle
import sys
import types
from pathlib import Path
from typing import Any

from foundation.errors import ConfigError

ENV = "ROLLOUTBUS_SHIPPED_AGENT"
CHILD_ENV = "ROLLOUTBUS_TRAINER_CHILD"


def ship(agent: Any, path: Path) -> None:
    """Pickle ``agent`` to ``path`` with the script to re-run when its class lives in ``__main__``."""
    main = sys.modules.get("__main__")
    # an instance's __module__ is its class's, a decorated function's (FunctionalLitAgent) the function's
    main_file = getattr(main, "__file__", None) if getattr(agent.agent, "__module__", None) == "__main__" else None
    try:
        body = pickle.dumps(agent)
    except Exception as exc:  # noqa: BLE001 - what pickle raises varies (PicklingError, TypeError, AttributeError)
        raise ConfigError(f"the agent cannot be sent to the runner processes (pickle: {exc}); keep what it holds "
                          "picklable (settings, not clients or open connections)") from exc
    path.write_bytes(pickle.dumps({"main": str(Path(main_file).resolve()) if main_file else None, "agent": body}))


def _run_main(path: str) -> None:
    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    sys.path.insert(0, str(Path(path).parent))
    code = compile(Path(path).read_text(), path, "exec")
    sys.modules["__mp_main__"] = module
    exec(code, module.__dict__)  # noqa: S102 - the user's own script, as multiprocessing's spawn runs it
    sys.modules["__main__"] = module


def load(path: str | None = None) -> Any:
    """The shipped agent (an :class:`~rolloutbus.trainer_api.agent.Adapted`)."""
    path = path or os.environ.get(ENV)
    if not path:
        raise ConfigError(f"{ENV} is not set: this agent is started by Trainer.fit")
    box = pickle.loads(Path(path).read_bytes())
    os.environ[CHILD_ENV] = "1"
    if box["main"]:
        _run_main(box["main"])
    return pickle.loads(box["agent"])


def __getattr__(name: str) -> Any:
    if name == "agent":
        return load()
    raise AttributeError(name)


__all__ = ["ENV", "CHILD_ENV", "ship", "load"]
