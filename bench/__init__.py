"""The benchmarks: each prints a table (or one JSON object with ``--json``); none is a timed test.

Run one from the checkout's root as a module, ``python -m bench.bench_e2e`` (or all of them through
``rolloutbus bench``). The helpers they share: :mod:`bench.common` (a broker, fresh topics, the processes
under test and what they cost), :mod:`bench.report` (quantiles, the table, the JSON line, progress),
:mod:`bench.loadgen` (keep-alive HTTP connections fed from one queue), :mod:`bench.workload` (the seeded
spans), the benches' virtualenvs are made by :mod:`foundation.venvs`.

This file imports nothing: ``bench.agentlightning_store`` and ``bench.workload`` also run under Agent
Lightning's own interpreter, which has none of our dependencies.
"""
