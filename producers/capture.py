"""Agent frameworks whose runs are captured, by name: the one place to add one (a function that instruments an
OpenTelemetry ``TracerProvider`` under ``@CAPTURES.register("name")``). Each here installs the OpenInference
instrumentation the framework's users trace with; the spans then reach the bus through the provider's processors
(:func:`producers.otel.instrument`, or an OTLP exporter to the gateway). The framework and its instrumentation are
the user's install (``pip install openinference-instrumentation-<framework>``); a missing one is one line naming it.

``capture("langchain", provider=provider)``, or ``instrument(provider, capture=["langchain"])``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from foundation.errors import ConfigError
from foundation.registry import Registry

CAPTURES: Registry[Callable[[Any], None]] = Registry("agent-framework capture")


def _instrumentor(module: str, cls: str, package: str) -> Any:
    try:
        return getattr(importlib.import_module(module), cls)()
    except ImportError as exc:
        raise ConfigError(f"capturing needs {package} (pip install {package}): {exc}") from None


def _openinference(name: str, module: str, cls: str, what: str) -> None:
    """Register ``name``: OpenInference's instrumentation ``module.cls`` (package ``openinference-instrumentation-*``)."""
    package = "openinference-instrumentation-" + module.rsplit(".", 1)[1].replace("_", "-")

    def instrument(provider: Any) -> None:
        _instrumentor(module, cls, package).instrument(tracer_provider=provider)

    CAPTURES.register(name, f"{what}: OpenInference's instrumentation")(instrument)


_openinference("langchain", "openinference.instrumentation.langchain", "LangChainInstrumentor", "LangChain and LangGraph")


@CAPTURES.register("openai-agents")
def openai_agents(provider: Any) -> None:
    """the OpenAI Agents SDK: OpenInference's instrumentation, the SDK's own upload to OpenAI's servers removed"""
    instrumentor = _instrumentor("openinference.instrumentation.openai_agents", "OpenAIAgentsInstrumentor",
                                 "openinference-instrumentation-openai-agents")
    from agents import set_trace_processors

    set_trace_processors([])  # nothing leaves the machine: the SDK's default processor uploads traces to OpenAI
    instrumentor.instrument(tracer_provider=provider)


_openinference("autogen", "openinference.instrumentation.autogen_agentchat", "AutogenAgentChatInstrumentor",
               "AutoGen agentchat")
_openinference("crewai", "openinference.instrumentation.crewai", "CrewAIInstrumentor", "CrewAI")


def capture(*names: str, provider: Any) -> None:
    """Instrument ``provider`` for each framework named (:data:`CAPTURES`); an unknown name is one line listing them."""
    for name in names:
        CAPTURES.get(name)(provider)


__all__ = ["CAPTURES", "capture"]
