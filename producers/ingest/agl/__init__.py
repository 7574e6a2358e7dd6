"""Agent Lightning's own APIs on the bus, served by the gateway; each file names the version it serves.

* 0.3's LightningStore API (``/v1/agl/...``): :mod:`~producers.ingest.agl.v0_3_store` (its calls mapped
  onto our records, pure), :mod:`~producers.ingest.agl.v0_3_queue_records` (its queue calls' records, pure) and
  :mod:`~producers.ingest.agl.v0_3_store_http` (the routes);
* 1.x's server API (``/api/...``): :mod:`~producers.ingest.agl.v1_api` (pure),
  :mod:`~producers.ingest.agl.v1_events` (its agents' events → spans, pure) and
  :mod:`~producers.ingest.agl.v1_api_http` (the routes, the events route among them);
* both: the rollout queue on rb.tasks, :mod:`~producers.ingest.agl.claims` (the claim bookkeeping, pure)
  and :mod:`~producers.ingest.agl.queue` (its consumer and commits).
"""
