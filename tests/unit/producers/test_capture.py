"""Agent-framework capture is registered in one place (``producers.capture.CAPTURES``): the four frameworks the
write-ups name, one decorator to add another, ``instrument(capture=[...])`` instruments the provider it sets up, an
unknown name or a missing instrumentation package is one line. (Each real framework is captured end to end in
tests/integration/producers/test_framework_capture.py, through this registry.)"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider

from foundation.errors import ConfigError
from producers.capture import CAPTURES, capture
from producers.otel import RolloutSpanProcessor, instrument


def test_the_write_ups_frameworks_are_registered() -> None:
    assert CAPTURES.names() == ["langchain", "openai-agents", "autogen", "crewai"]
    assert "LangGraph" in CAPTURES.help("langchain")


def test_instrument_captures_a_registered_framework_on_its_provider() -> None:
    seen: list[TracerProvider] = []

    @CAPTURES.register("toy")
    def toy(provider: TracerProvider) -> None:
        """a test's framework"""
        seen.append(provider)

    try:
        provider = TracerProvider()
        assert isinstance(instrument(provider, capture=["toy"]), RolloutSpanProcessor)
        assert seen == [provider]
    finally:
        CAPTURES.unregister("toy")
    with pytest.raises(ConfigError, match="agent-framework capture 'toy' is not one of: langchain, openai-agents"):
        capture("toy", provider=TracerProvider())


def test_a_framework_whose_instrumentation_is_not_installed_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "openinference.instrumentation.crewai", None)  # import fails, as when not installed
    with pytest.raises(ConfigError, match="capturing needs openinference-instrumentation-crewai \\(pip install"):
        capture("crewai", provider=TracerProvider())
