"""Agent Lightning's logging helpers under ``import rolloutbus as agl``: ``setup_logging(level)`` sends the project's
loggers (``rolloutbus``, ``producers``, ``streams``, ``trainer``, ``foundation``) to the console at ``level``, in the
format the ``rolloutbus`` commands log in; ``setup_module_logging(level, name=...)`` one logger;
``configure_logger`` is the old name (deprecated there too). The ``color`` and ``files`` arguments are accepted and
not used: the console lines stay plain (what the commands' logs show)."""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

PACKAGES = ("rolloutbus", "producers", "streams", "trainer", "foundation")


def setup_module_logging(level: int | str = "INFO", *, name: str = "rolloutbus", console: bool = True,
                         propagate: bool = False, **unused: Any) -> logging.Logger:
    """The logger ``name`` at ``level``, with one console handler (stdout) when ``console`` (replacing those it had)."""
    from foundation.entry import LOG_FORMAT

    logger = logging.getLogger(name)
    logger.setLevel(level if isinstance(level, int) else level.upper())
    logger.propagate = propagate
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    if console:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
    return logger


def setup_logging(level: int | str = "INFO", *, console: bool = True, propagate: bool = False,
                  submodule_levels: dict[str, int | str] | None = None, apply_to: list[str] | None = None,
                  **unused: Any) -> None:
    """The project's loggers (and ``apply_to``'s) at ``level``; ``submodule_levels`` sets some apart
    (``{"streams.worker": "DEBUG"}``)."""
    for name in (*PACKAGES, *(apply_to or [])):
        setup_module_logging(level, name=name, console=console, propagate=propagate)
    for name, sub in (submodule_levels or {}).items():
        logging.getLogger(name).setLevel(sub if isinstance(sub, int) else sub.upper())


def configure_logger(level: int = logging.INFO, name: str = "rolloutbus") -> logging.Logger:
    """Deprecated (as in Agent Lightning): :func:`setup_logging`."""
    warnings.warn("configure_logger is deprecated in favor of setup_logging", DeprecationWarning, stacklevel=2)
    return setup_module_logging(level, name=name)


__all__ = ["configure_logger", "setup_logging", "setup_module_logging"]
