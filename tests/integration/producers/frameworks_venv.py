"""The agent frameworks the write-ups name, in virtualenvs of their own, for the capture tests
(``test_framework_capture.py``): LangGraph, the OpenAI Agents SDK, AutoGen (agentchat) and CrewAI, each with
the OpenInference instrumentation its users trace with, OpenTelemetry's SDK and OTLP exporter, and the agent
library's own dependencies (the agents import ``producers`` from the checkout, as a user's agent imports the
base install).

Their pins conflict with the project's (openai 3.x, CrewAI's chromadb and its own openai pin), so they are not
in the test extra. Made once by :func:`foundation.venvs.ensure_venv` on Python >= 3.12 under
``~/.cache/rolloutbus/test-agent-frameworks`` and ``test-agent-crewai`` (``ROLLOUTBUS_TEST_FRAMEWORKS_VENVS``
names another folder); a failed install fails the tests with pip's last line.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from foundation import venvs

REPO = Path(__file__).resolve().parents[3]
# The agent library's own dependencies (pyproject's base install): the agents import rolloutbus's producers as a
# user's agent does, beside their framework.
BASE = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
OTEL = ["opentelemetry-sdk==1.45.2", "opentelemetry-exporter-otlp-proto-http==1.45.2"]
# One venv for the three that resolve together; CrewAI in one of its own: every CrewAI its OpenInference
# instrumentation accepts (>= 1.10.1) conflicts with this set's openai-agents/autogen-ext (pip: ResolutionImpossible).
PINS = {
    "frameworks": [
        "langgraph==1.2.24", "langchain-openai==1.7.4",
        "openai-agents==0.24.0",
        "autogen-agentchat==0.7.5", "autogen-ext[openai]==0.7.5",
        "openinference-instrumentation-langchain==0.1.80", "openinference-instrumentation-openai-agents==2.6.0",
        "openinference-instrumentation-autogen-agentchat==0.1.22",
        *OTEL, *BASE,
    ],
    "crewai": ["crewai==1.15.30", "openinference-instrumentation-crewai==1.1.21", *OTEL, *BASE],
}
# CrewAI and its dependencies reach for the network at import or first call unless told not to.
ENV = {"CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "false", "CREWAI_TRACING_ENABLED": "false",
       "LITELLM_LOCAL_MODEL_COST_MAP": "True", "ANONYMIZED_TELEMETRY": "False"}


class FrameworksInstallError(venvs.VenvError):
    """The agent frameworks could not be installed into their virtualenv."""


def ensure_venv(name: str) -> Path:
    """The python of venv ``name`` (a key of :data:`PINS`), installing it on first use (a few minutes, once)."""
    root = Path(os.environ.get("ROLLOUTBUS_TEST_FRAMEWORKS_VENVS", venvs.CACHE))
    return venvs.ensure_venv(
        root / f"test-agent-{name}", PINS[name], error=FrameworksInstallError,
        base=lambda: venvs.find_python("ROLLOUTBUS_TEST_FRAMEWORKS_PYTHON", "the agent frameworks", FrameworksInstallError))
