"""A registry's providers: a name under a provider's prefix imports the provider (which registers it) the first time
it is asked for, never before; a provider that does not import, or a name it does not register, is one line."""

from __future__ import annotations

import argparse
import sys

import pytest

from foundation.errors import ConfigError
from foundation.registry import Registry


def test_a_prefixed_name_imports_its_provider_once(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    registry: Registry[object] = Registry("toy", providers={"ext:": "toy_provider_mod"})
    (tmp_path / "toy_provider_mod.py").write_text(
        "import sys\nREG = sys.modules['__toy_registry__']\nREG.register('ext:one', 'from the provider')(object())\n"
        "IMPORTS = sys.modules.setdefault('__toy_imports__', [])\nIMPORTS.append(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "__toy_registry__", registry)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "__toy_imports__", [])  # type: ignore[arg-type]
    registry.register("plain")(object())
    assert registry.names() == ["plain"] and "toy_provider_mod" not in sys.modules
    parser = argparse.ArgumentParser()
    parser.add_argument("--x", choices=registry.choices())
    assert parser.parse_args(["--x", "ext:one"]).x == "ext:one"
    assert "ext:one" in registry and registry.names() == ["plain", "ext:one"]
    with pytest.raises(ConfigError, match=r"toy 'ext:two' is not one of: plain, ext:one, ext:…"):
        registry.get("ext:two")
    assert sys.modules["__toy_imports__"] == [1]
    monkeypatch.delitem(sys.modules, "toy_provider_mod")


def test_a_provider_that_does_not_import_is_one_line() -> None:
    registry: Registry[object] = Registry("toy", providers={"ext:": "no_such_provider_module"})
    with pytest.raises(ConfigError, match="the names ext:\\* come from no_such_provider_module, which does not import here"):
        registry.get("ext:one")
    assert "other" not in registry
