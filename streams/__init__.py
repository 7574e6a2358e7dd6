"""Stream processing: spans → trajectories → transitions → rewards → credit → GRPO groups.

The math lives in pure modules (``assembly``, ``transitions``, ``rewards``, ``credit``, ``grouping``)
that import nothing from faust, Kafka or ClickHouse. ``sink`` writes to ClickHouse; ``app`` is the
faust-streaming shell; ``cli`` is ``rolloutbus process``.
"""
