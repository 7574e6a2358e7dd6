"""rolloutbus: reinforcement learning for any LLM agent, built on a message bus.

The import packages are ``producers`` (agent side), ``schemas`` (the Avro contract), ``streams``
(stream processors), ``trainer`` (GRPO) and this one, ``rolloutbus``, which holds what they share:
the error tree, settings, the Kafka and ClickHouse plumbing, and the ``rolloutbus`` command.
"""

__version__ = "0.1.0"
