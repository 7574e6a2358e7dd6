"""Stream processing: spans → trajectories → transitions → rewards → credit → GRPO groups.

The math lives in pure modules (``assembly``, ``transitions``, ``rewards``, ``credit``, ``grouping``)
that import nothing from faust, Kafka or ClickHouse. ``sink`` writes to ClickHouse; ``spans_stage`` and
``groups_stage`` are the two stages, ``checkpoint`` the one commit point both ask, ``frontier`` the
admission of faust's records; ``app`` is the faust-streaming wiring; ``cli`` is ``rolloutbus process``.
"""
