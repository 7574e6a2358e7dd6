"""``rolloutbus dashboard``: a live web page over the ClickHouse store — learning curves, pipeline health,
trajectories opened span by span, and a read-only SQL box. One aiohttp process; charts by uPlot, vendored
from npm at build time (``make dashboard-assets``), never fetched at run time."""
