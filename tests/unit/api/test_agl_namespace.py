"""``import rolloutbus as agl`` is Agent Lightning's namespace for the write-ups' code: the names are there (and in
``dir()``), and ``agl.emit_*`` record spans inside a rollout and do nothing outside one (a warning once), as Agent
Lightning's do, never raising into the agent."""

from __future__ import annotations

import logging
import re
from pathlib import Path

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


# The public names of agentlightning 0.3.0 that are not modules (``dir(agentlightning)``, taken from the package).
AL_0_3_0 = """
APO Adapter AgentLightningClient AgentLightningServer AgentOpsTracer Algorithm Attempt AttemptStatus
AttemptedRollout AttributeValue Attributes Baseline ClientServerExecutionStrategy
CollectionBasedLightningStore Dataset DevTaskLoader DummyTracer EnqueueRolloutRequest Event ExecutionEvent
ExecutionStrategy FastAlgorithm FilterField FilterOptions GenericResponse Hook InMemoryLightningStore LLM
LLMProxy LegacyAgentRunner LightningEnvVar LightningStore LightningStoreCapabilities LightningStoreClient
LightningStoreServer LightningStoreStatistics LightningStoreThreaded Link LitAgent LitAgentRunner
LlmProxyTraceToTriplet MultiprocessingEvent NamedResources OtelResource OtelTraceAdapter OtelTracer
PaginatedResult ParallelWorkerBase PromptTemplate ProxyLLM Resource ResourceUnion ResourcesUpdate Rollout
RolloutConfig RolloutLegacy RolloutMode RolloutRawResult RolloutRawResultLegacy RolloutStatus Runner
SharedMemoryExecutionStrategy SortOptions Span SpanAttributeNames SpanContext SpanCoreFields SpanLike
SpanNames SpanRecordingContext StatusCode Task TaskIfAny TaskInput ThreadingEvent TraceAdapter TraceState
TraceStatus TraceToMessages TraceToTripletBase Tracer TracerTraceToTriplet Trainer Triplet VERL Worker
WorkerStatus algo build_component clear_active_tracer configure_logger emit_annotation emit_exception
emit_message emit_object emit_reward find_final_reward find_reward_spans get_active_tracer get_message_value
get_object_value get_reward_value get_rewards_from_span is_reward_span lightning_cli llm_rollout operation
prompt_rollout resolve_bool_env_var resolve_int_env_var resolve_str_env_var rollout set_active_tracer
setup_logging setup_module_logging
""".split()
DOC = Path(__file__).resolve().parents[3] / "docs" / "agent-lightning.md"


def test_every_name_of_agent_lightning_0_3_is_here_or_its_stand_in_is_documented() -> None:
    section = DOC.read_text().split("### `import rolloutbus as agl`: Agent Lightning 0.3's names")[1].split("\n### ")[0]
    table = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `")]
    documented = {name for cell in table for name in re.findall(r"`([A-Za-z_]+)`", cell)}
    here = set(dir(agl))
    assert len(AL_0_3_0) == 115
    assert not [n for n in AL_0_3_0 if n not in here and n not in documented], "neither on agl nor in the table"
    assert not documented & here, "in the table of names that are not here, yet on the module"
    assert not documented - set(AL_0_3_0), "the table names something Agent Lightning 0.3 does not have"
    said = section.split("| Agent Lightning 0.3 | here |")[0]
    assert all(f"`{n}`" in said for n in AL_0_3_0 if n in here), "a name on the module the section does not list"


def test_the_status_and_mode_types_are_the_values_the_gateways_store_takes() -> None:
    from typing import get_args

    from producers.ingest.agl.v0_3_queue_records import MODES
    from producers.ingest.agl.v0_3_store import ATTEMPT_STATUSES, ROLLOUT_STATUSES

    assert set(get_args(agl.RolloutMode)) == set(MODES)
    assert set(get_args(agl.RolloutStatus)) == set(ROLLOUT_STATUSES)
    assert set(get_args(agl.AttemptStatus)) == ATTEMPT_STATUSES


def test_annotation_and_operation_record_one_span_each_inside_a_rollout() -> None:
    rec = Recorder()
    with rollout("task-1", mode="train", transport=rec):  # type: ignore[arg-type]
        agl.emit_annotation({"tag": "x", "meta": {"k": 1}})
        with agl.operation(step="plan") as op:
            op.set_input(query="q")
            op.set_output("done")

        @agl.operation(name="lookup")
        def lookup(key: str) -> str:
            return key.upper()

        assert lookup("a") == "A"
        with pytest.raises(ValueError):
            with agl.operation():
                raise ValueError("bad")
    spans = rec.spans()
    assert [(s.name, s.status_code) for s in spans] == [("agentlightning.annotation", "UNSET"), ("agentlightning.operation", "OK"),
                                                        ("agentlightning.operation", "OK"), ("agentlightning.operation", "ERROR")]
    assert spans[0].attributes == {"tag": "x", "meta.k": "1"}
    assert spans[1].attributes == {"step": "plan", "operation.input": '{"query": "q"}', "operation.output": "done"}
    assert spans[2].attributes["operation.name"] == "lookup" and spans[2].attributes["operation.output"] == "A"
    assert spans[3].status_message == "ValueError: bad" and spans[1].end_time_ns >= spans[1].start_time_ns
    agl.emit_annotation({"outside": True})  # outside a rollout: nothing, no error
    with agl.operation():
        pass


def test_setup_logging_sends_the_projects_loggers_to_the_console(capsys: pytest.CaptureFixture[str]) -> None:
    agl.setup_logging("DEBUG", submodule_levels={"streams.worker": "WARNING"})
    try:
        logging.getLogger("streams.credit").debug("a debug line")
        logging.getLogger("streams.worker").info("not shown")
        out = capsys.readouterr().out
        assert "DEBUG streams.credit: a debug line" in out and "not shown" not in out
    finally:
        for name in ("rolloutbus", "producers", "streams", "trainer", "foundation", "streams.worker"):
            logger = logging.getLogger(name)
            logger.handlers.clear()
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
