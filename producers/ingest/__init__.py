"""The ingest service: the server processes that take spans and tasks from outside and put them on the bus.

An agent does not install this (its library is :mod:`producers`; this package needs the ``gateway``
extra: aiohttp, prometheus-client). It may import the agent library (the span transport, the mapping of
an OpenTelemetry span); the agent library never imports it.

* :mod:`~producers.ingest.gateway` (``rolloutbus gateway``, :mod:`~producers.ingest.gateway_cli`): OTLP/HTTP
  ``/v1/traces`` (decoding: :mod:`~producers.ingest.otlp_decoding`), beside Agent Lightning's APIs
  (:mod:`producers.ingest.agl`), ``/healthz`` and ``/metrics``;
* :mod:`~producers.ingest.front_door`: what every gateway route does first (token, body limit, body read,
  error shape), with the credential check :mod:`~producers.ingest.auth` and the refusals' exceptions
  :mod:`~producers.ingest.errors` (no HTTP server: what decodes a body raises them too);
* :mod:`~producers.ingest.resources`: the newest versions on rb.resources, one follower per gateway;
* :mod:`~producers.ingest.llm_proxy` (``rolloutbus proxy``, :mod:`~producers.ingest.llm_proxy_cli`): the
  OpenAI-compatible LLM proxy that records token ids (agents reach it with :mod:`producers.proxy`);
* :mod:`~producers.ingest.settings`: the settings of both processes.
"""
