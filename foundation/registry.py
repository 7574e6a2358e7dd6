"""Named choices a user picks by name — credit modes, advantage estimators, policy losses, training algorithms —
each added with one decorator where it is defined (verl's ``register_adv_est`` / ``register_policy_loss`` in the
same spirit). The CLI's choices, the settings' validation and the docs' tables read :meth:`Registry.names`, so a
new entry needs no other edit. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from foundation.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind by name, in the order registered; each with a one-line description (its docstring's
    first line unless given)."""

    def __init__(self, kind: str, providers: dict[str, str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._help: dict[str, str] = {}
        # name prefix -> the module that registers those names when imported ("verl:" -> verl's library, heavy
        # to import): imported the first time a name with the prefix is asked for, never before.
        self._providers = dict(providers or {})
        self._provided: set[str] = set()

    def register(self, name: str, help: str | None = None, *, replace: bool = False) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` over a function or class. A second entry under one name is an
        error unless ``replace`` (a test, or a user's own version of a built-in)."""

        def add(entry: T) -> T:
            if name in self._entries and not replace:
                raise ConfigError(f"a {self.kind} named {name!r} is registered already")
            self._entries[name] = entry
            doc = help if help is not None else (getattr(entry, "__doc__", None) or "").strip().split("\n")[0]
            self._help[name] = doc
            return entry

        return add

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._help.pop(name, None)

    def _provide(self, name: str) -> None:
        """Import the provider of ``name``'s prefix, once: it registers its entries. One that does not import is one
        line naming what it needs."""
        import importlib

        for prefix, module in self._providers.items():
            if name.startswith(prefix) and module not in self._provided:
                self._provided.add(module)
                try:
                    importlib.import_module(module)
                except ImportError as exc:
                    raise ConfigError(f"{self.kind} {name!r}: the names {prefix}* come from {module}, which does not "
                                      f"import here: {exc}") from None

    def get(self, name: str) -> T:
        """The entry named ``name``; an unknown name is one line that lists the known ones."""
        if name not in self._entries:
            self._provide(name)
        try:
            return self._entries[name]
        except KeyError:
            more = "".join(f", {p}…" for p in self._providers)
            raise ConfigError(f"{self.kind} {name!r} is not one of: {', '.join(self._entries)}{more}") from None

    def check(self, name: str) -> str:
        """``name`` when registered (for a settings validator), else the same error as :meth:`get`."""
        self.get(name)
        return name

    def names(self) -> list[str]:
        """The names registered so far (a provider's appear once one of them was asked for)."""
        return list(self._entries)

    def choices(self) -> list[str]:
        """What a flag's ``choices=`` takes: the names, and each provider's prefix shown as ``prefix…``; a name is in
        it when :meth:`get` would find it (a provider's name imports its provider)."""
        return _Choices(self)

    def help(self, name: str) -> str:
        return self._help.get(name, "")

    def table(self) -> str:
        """A markdown table of the entries (name, description): what the docs show."""
        rows = [f"| `{n}` | {self._help[n]} |" for n in self._entries]
        return "\n".join([f"| {self.kind} | what it does |", "|---|---|", *rows])

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name not in self._entries:
            self._provide(name)
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)


class _Choices(list):  # type: ignore[type-arg]
    """A registry's names for argparse: listed as the names and ``prefix…``, tested by the registry."""

    def __init__(self, registry: Registry[object]) -> None:
        super().__init__([*registry.names(), *(f"{p}…" for p in registry._providers)])
        self._registry = registry

    def __contains__(self, name: object) -> bool:
        return name in self._registry


def registered_in(path: str) -> Callable[[object, str], str]:
    """A pydantic field validator (``field_validator("credit")(registered_in("streams.credit:CREDIT"))``): the value
    must name an entry of the registry at ``path`` (``module:ATTR``, imported when a value is checked, so the
    settings stay light), else a ValueError the settings loader names the flag and the variable in."""
    import importlib

    def check(cls: object, value: str) -> str:
        module, attr = path.split(":")
        registry: Registry[object] = getattr(importlib.import_module(module), attr)
        if value not in registry:
            raise ValueError(f"not a registered {registry.kind} ({', '.join(registry.names())})")
        return value

    return check


PLUGINS_ENV = "ROLLOUTBUS_PLUGINS"


def load_plugins(modules: str | None = None) -> list[str]:
    """Import the user's modules that register entries (``ROLLOUTBUS_PLUGINS``, comma-separated module names, on
    the process's path): a process started by ``fit`` or by hand then knows the user's credit modes, estimators
    and losses before it reads its settings. A module that does not import is one line naming it."""
    import importlib
    import os

    names = [m.strip() for m in (modules if modules is not None else os.environ.get(PLUGINS_ENV, "")).split(",") if m.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"{PLUGINS_ENV} names {name!r}, which does not import: {exc}") from None
    return names


__all__ = ["PLUGINS_ENV", "Registry", "load_plugins", "registered_in"]
