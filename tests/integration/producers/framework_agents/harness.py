"""What every framework agent here shares, as a user's agent process would set it up: the stock OpenTelemetry
SDK exporting OTLP to the gateway, rolloutbus's span processor stamping the open rollout's ids on every span,
the framework's instrumentation (``producers.capture``), and one rollout around the framework's run.

``python <agent>.py GATEWAY PROXY`` prints one JSON line: ``{"calls": [{"agent": ..., "text": ...}, ...]}``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from producers import get_transport, rollout
from producers.capture import capture
from producers.otel import RolloutSpanProcessor
from producers.proxy import AGENT_HEADER, proxy_url

MODEL = "policy"
TOKEN = "s3cret"  # the test gateway's


def agent_headers(name: str) -> dict[str, str]:
    """The header that names the agent on the proxy's span of each call this agent's client makes: the proxy
    alone holds the token ids, and no framework passes its agent's name to the HTTP request."""
    return {AGENT_HEADER: name}


def run(framework: str, captured: str, body: Callable[[str], list[dict[str, Any]]]) -> None:
    """``captured``: the framework's name in ``producers.capture.CAPTURES``, whose instrumentation traces it."""
    gateway, proxy = sys.argv[1], sys.argv[2]
    provider = TracerProvider(resource=Resource.create({"service.name": f"{framework}-agent"}))
    provider.add_span_processor(RolloutSpanProcessor(export=False))  # attribution only; OTLP does the export
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=gateway + "/v1/traces",
                                                                    headers={"Authorization": f"Bearer {TOKEN}"})))
    capture(captured, provider=provider)
    with rollout(f"task-{framework}", rollout_id=f"ro-{framework}", attempt_id=f"at-{framework}") as r:
        calls = body(proxy_url(proxy))
        r.set_reward(1.0)
    provider.shutdown()
    get_transport().flush(30)
    print(json.dumps({"calls": calls}))
