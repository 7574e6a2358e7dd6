"""Real instrumentation through an agent framework: LangChain's ``ChatOpenAI`` (``langchain-openai``),
pointed at ``rolloutbus proxy`` in front of ``rolloutbus serve``, invoked for several turns inside a
rollout, with the OpenTelemetry GenAI instrumentation from PyPI (``opentelemetry-instrumentation-openai-v2``)
exporting OTLP to the gateway.

LangChain makes its calls with the official ``openai`` client (``client.with_raw_response.create``),
so the openai-v2 instrumentation sees each one and emits a ``chat <model>`` span with ``gen_ai.*``
attributes and the response id. We use it rather than a LangChain-specific instrumentation (OpenLLMetry's
``opentelemetry-instrumentation-langchain``) because it is the OpenTelemetry project's own, already in the
test extra, and its spans carry the response id the proxy's span is joined on. What a user sees is then
the same as for the bare client: two views of each call on ``rb.spans``, one step per call in
ClickHouse with the proxy's token ids.
"""

from __future__ import annotations

from typing import Any

import pytest

from test_gateway_otlp import gateway  # noqa: F401 - the fixture
from test_openai_instrumentation import check_one_step_per_call, run_agent, served  # noqa: F401 - served: the fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# The agent as a LangChain user writes it: ChatOpenAI with the proxy's base URL, LangChain's message
# types, the conversation growing turn by turn; the stock OTel SDK and the instrumentation from PyPI.
AGENT = """
import json, sys
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from producers import get_transport, rollout
from producers.otel import RolloutSpanProcessor
from producers.proxy import proxy_headers, proxy_url

gateway, proxy, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
provider = TracerProvider(resource=Resource.create({"service.name": "langchain-agent"}))
provider.add_span_processor(RolloutSpanProcessor(export=False))  # attribution only; OTLP does the export
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=gateway + "/v1/traces",
                                                                headers={"Authorization": "Bearer s3cret"})))
OpenAIInstrumentor().instrument(tracer_provider=provider)

answers = []
with rollout("task-lc", rollout_id="ro-lc", attempt_id="at-lc") as r:
    llm = ChatOpenAI(model="policy", base_url=proxy_url(proxy), api_key="unused", max_tokens=6, temperature=1.0,
                     max_retries=0, timeout=60)
    messages = [HumanMessage("Count: 1 2 3")]
    for _ in range(calls):
        # proxy_headers() numbers each call within the attempt, so it goes with the call, not the model.
        ai = llm.invoke(messages, extra_headers=proxy_headers())
        answers.append({"id": ai.response_metadata["id"], "text": ai.content})
        messages += [ai, HumanMessage("go on")]
    r.set_reward(1.0)
provider.shutdown()
get_transport().flush(30)
print(json.dumps(answers))
"""


@pytest.fixture
def langchain_installed() -> None:
    try:
        import langchain_openai  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"this test needs langchain-openai (pip install -e '.[test]'): {exc}")


def test_langchain_chat_openai_through_proxy_is_one_step_per_call(
    langchain_installed: None, served: str, gateway: Any, kafka_conf: dict[str, Any], topics: Any,  # noqa: F811
    test_env: dict[str, str],
) -> None:
    base, _ = gateway
    answers = run_agent(AGENT, base, served, test_env)
    check_one_step_per_call(answers, "ro-lc", "at-lc", "langchain-agent", kafka_conf, topics, test_env)
