"""Shortening vLLM's shared-memory spin (pure, on a stand-in module): opt-in, patched on import, loud on a change."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from trainer import vllm_spin
from trainer.vllm_spin import ENV, SpinPatchError, install, patch


def _module(with_param: bool = True) -> ModuleType:
    m = ModuleType("stand_in")
    if with_param:
        class SpinCondition:
            def __init__(self, is_reader: bool, context: object, notify_address: str, busy_loop_s: float = 1) -> None:
                self.busy_loop_s = busy_loop_s
    else:
        class SpinCondition:  # type: ignore[no-redef]
            def __init__(self, is_reader: bool, context: object, notify_address: str) -> None:
                pass
    m.SpinCondition = SpinCondition  # type: ignore[attr-defined]
    return m


def test_the_patch_changes_the_default_and_leaves_a_given_value_alone() -> None:
    m = _module()
    patch(m, 0.0)
    patch(m, 0.5)  # once only
    assert m.SpinCondition(True, None, "ipc://x").busy_loop_s == 0.0
    assert m.SpinCondition(True, None, "ipc://x", busy_loop_s=2).busy_loop_s == 2


def test_a_vllm_without_the_parameter_is_a_loud_error() -> None:
    with pytest.raises(SpinPatchError, match="no SpinCondition\\(busy_loop_s=...\\) any more"):
        patch(_module(with_param=False), 0.0)


def test_unset_it_does_nothing_and_a_bad_value_is_refused() -> None:
    assert install({}) is False and install({ENV: " "}) is False
    for bad in ("soon", "-1"):
        with pytest.raises(SpinPatchError, match="must be seconds"):
            install({ENV: bad})


def test_set_it_patches_the_module_when_it_is_first_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fake_shm_broadcast.py").write_text(
        "class SpinCondition:\n    def __init__(self, is_reader, busy_loop_s=1):\n        self.busy_loop_s = busy_loop_s\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(vllm_spin, "MODULE", "fake_shm_broadcast")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    assert install({ENV: "0"}) is True
    import fake_shm_broadcast  # type: ignore[import-not-found]

    try:
        assert fake_shm_broadcast.SpinCondition(True).busy_loop_s == 0.0
    finally:
        sys.modules.pop("fake_shm_broadcast", None)


def test_the_engine_gets_the_sitecustomize_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.vllm_serve import extension_path

    monkeypatch.delenv(ENV, raising=False)
    assert not (extension_path() / "sitecustomize.py").exists()
    monkeypatch.setenv(ENV, "0")
    site = extension_path() / "sitecustomize.py"
    assert site.read_text() == vllm_spin.SITECUSTOMIZE and (site.parent / "trainer" / "vllm_spin.py").exists()
