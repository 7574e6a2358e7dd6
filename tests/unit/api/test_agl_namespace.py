"""``import rolloutbus as agl`` is Agent Lightning's namespace for the write-ups' code: the names are there (and in
``dir()``), and ``agl.emit_*`` record spans inside a rollout and do nothing outside one (a warning once), as Agent
Lightning's do, never raising into the agent."""

from __future__ import annotations

import logging

import pytest

import rolloutbus as agl
from producers import rollout
from tests.unit.producers.test_context_emit import Recorder

WRITE_UPS = ["emit_state", "emit_action", "emit_reward", "emit_message", "emit_object", "emit_exception",
             "LitAgent", "Trainer", "LLM", "NamedResources", "Rollout", "GRPO", "APO", "SFT", "VERL", "PromptTemplate"]


def test_the_write_ups_names_are_on_the_module_and_in_dir() -> None:
    listed = dir(agl)
    for name in WRITE_UPS:
        assert name in listed, name
        assert getattr(agl, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'emit_nothing'"):
        agl.emit_nothing  # noqa: B018


def test_agl_emit_records_inside_a_rollout_and_only_warns_once_outside(caplog: pytest.LogCaptureFixture) -> None:
    from rolloutbus.trainer_api import emit as agl_emit

    agl_emit._warned.clear()
    with caplog.at_level(logging.WARNING, logger="rolloutbus.trainer_api.emit"):
        for _ in range(3):  # a plain function, no rollout: nothing recorded, nothing raised
            agl.emit_state({"q": "how many?"})
            agl.emit_action("SELECT 1")
            agl.emit_reward(1.0)
            agl.emit_message("hi")
            agl.emit_object({"a": 1})
            agl.emit_exception(ValueError("x"))
    warned = [r.getMessage().split(" ")[0] for r in caplog.records]
    assert sorted(warned) == sorted(f"agl.{n}" for n in ("emit_state", "emit_action", "emit_reward", "emit_message",
                                                          "emit_object", "emit_exception")), "one warning per helper"

    rec = Recorder()
    with rollout("task-1", mode="train", transport=rec):  # type: ignore[arg-type]
        agl.emit_state({"q": "how many?"})
        agl.emit_action("SELECT 1")
        agl.emit_reward(0.5)
    assert [s.kind for s in rec.spans()] == ["state", "action", "reward"]
    assert rec.spans()[-1].reward is not None and rec.spans()[-1].reward.value == 0.5
