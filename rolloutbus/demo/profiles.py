"""The demo's defaults by task and mode, declared once as a table of profiles: a config dataclass's field defaults are
the plain run's, and each profile whose condition holds overrides some of them, in table order (a later one wins),
before the flags. The flags' help is written from the same table, so what ``--help`` says is what the run applies.
Pure."""

from __future__ import annotations

import dataclasses
from typing import Any

# (label shown in the help, condition on the run's mode, the fields it sets)
Profile = tuple[str, dict[str, Any], dict[str, Any]]


def apply(cfg: Any, profiles: tuple[Profile, ...], mode: dict[str, Any]) -> None:
    """Set on ``cfg`` the fields of every profile whose condition ``mode`` meets, in order."""
    for _, when, values in profiles:
        if all(mode[k] == v for k, v in when.items()):
            for name, value in values.items():
                setattr(cfg, name, value)


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.0e}".replace("e-0", "e-") if 0 < abs(value) < 1e-3 else f"{value:g}"
    return str(value)


def help_for(cls: type, profiles: tuple[Profile, ...], name: str) -> str:
    """``default X; --task sql Y; ...``: a field's default and each profile's value for it."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    parts = [f"default {_shown(fields[name].default)}"]
    parts += [f"{label} {_shown(values[name])}" for label, _, values in profiles if name in values]
    return "; ".join(parts)


__all__ = ["Profile", "apply", "help_for"]
