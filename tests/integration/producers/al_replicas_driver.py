"""Runs under Agent Lightning 0.3.0's own interpreter (see al_venv.py), never under ours.

Its own store client (``LightningStoreClient``), one per gateway replica, each call's write on one replica and its
read on the other: a rollout started and enqueued, span sequence ids from both at once, a span with an id of its
own, an attempt that failed and a new one (``start_attempt``), ``update_rollout``, a worker's heartbeat,
``add_resources`` / ``query_resources`` and ``statistics``.

    python al_replicas_driver.py STORE_URL_A STORE_URL_B OUT

Writes JSON to OUT: what each read answered. Only the standard library and agentlightning are imported.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agentlightning.store.client_server import LightningStoreClient
from agentlightning.types import LLM, Span

REWARD_SPAN = {"trace_id": "932b80eaf7b949439da9a67c7d6bdf6d", "span_id": "d71aba97775a5473", "parent_id": None,
               "name": "agentlightning.annotation", "status": {"status_code": "OK", "description": None},
               "attributes": {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 0.5},
               "events": [], "links": [], "start_time": 1795471492.2, "end_time": 1795471492.2,
               "context": {"trace_id": "932b80eaf7b949439da9a67c7d6bdf6d", "span_id": "d71aba97775a5473",
                           "is_remote": False, "trace_state": {}},
               "parent": None, "resource": {"attributes": {}, "schema_url": ""}}


async def main(url_a: str, url_b: str, out: str) -> None:
    a, b = LightningStoreClient(url_a), LightningStoreClient(url_b)
    got: dict[str, object] = {}
    try:
        started = await a.start_rollout(input={"q": "1+1?"}, mode="train")
        rid, first = started.rollout_id, started.attempt.attempt_id
        latest = await b.get_latest_attempt(rid)
        got["latest_on_b"] = [latest.attempt_id == first, latest.sequence_id, latest.status] if latest else None

        ids = await asyncio.gather(*[(a if n % 2 else b).get_next_span_sequence_id(rid, first) for n in range(20)])
        got["ids"] = sorted(ids)
        span = await a.add_span(Span.model_validate({**REWARD_SPAN, "rollout_id": rid, "attempt_id": first,
                                                     "sequence_id": 100}))
        got["added_id"] = span.sequence_id if span is not None else None
        got["next_after_100"] = await b.get_next_span_sequence_id(rid, first)

        await a.update_attempt(rid, first, status="failed")
        got["status_after_failed"] = (await b.get_rollout_by_id(rid)).status
        retry = await b.start_attempt(rid, worker_id="w-2")
        got["retry"] = [retry.attempt.sequence_id, retry.status, retry.attempt.worker_id]
        attempts = await a.query_attempts(rid, sort_by="sequence_id", sort_order="asc")
        got["attempts_on_a"] = [[x.sequence_id, x.status] for x in attempts]
        await b.update_attempt(rid, retry.attempt.attempt_id, status="succeeded")
        got["status_after_succeeded"] = (await a.get_rollout_by_id(rid)).status

        queued = await b.enqueue_rollout(input={"q": "2+2?"}, mode="val")
        listed = await a.query_rollouts(rollout_id_in=[queued.rollout_id])
        got["enqueued_on_a"] = [[r.rollout_id == queued.rollout_id, r.status] for r in listed]
        updated = await a.update_rollout(rid, metadata={"note": "kept"})
        got["update_reply"] = updated.metadata
        got["update_on_b"] = (await b.get_rollout_by_id(rid)).metadata

        await a.update_worker("w-9", heartbeat_stats={"cpu": 0.25})
        worker = await b.get_worker_by_id("w-9")
        got["worker_on_b"] = worker.heartbeat_stats if worker else None

        added = await a.add_resources({"main": LLM(endpoint="http://llm.example:8000/v1", model="tiny")})
        found = await a.query_resources(resources_id=added.resources_id)
        got["resources"] = [added.resources_id, [u.resources_id for u in found]]
        # A set added on one replica reads by id on the other at once, a second one too; the history pages.
        by_id = await b.get_resources_by_id(added.resources_id)
        got["resources_by_id_on_b"] = [by_id.resources_id, sorted(by_id.resources)] if by_id else None
        second = await b.add_resources({"main": LLM(endpoint="http://llm.example:8000/v1", model="tiny-2")})
        again = await a.get_resources_by_id(second.resources_id)
        got["second_on_a"] = [again.resources_id == second.resources_id, again.resources["main"].model] if again else None
        ours = [added.resources_id, second.resources_id]
        pages = [await (a if n else b).query_resources(sort_by="resources_id", sort_order="asc",
                                                       limit=1, offset=n) for n in range(2)]
        everything = await b.query_resources(sort_by="resources_id", sort_order="asc")
        got["resources_pages"] = [[[u.resources_id for u in page], page.limit, page.offset, page.total] for page in pages]
        got["resources_all"] = [[u.resources_id for u in everything], everything.total, ours]
        stats = await b.statistics()
        got["statistics"] = [stats["total_rollouts"], stats["total_attempts"], stats["total_workers"]]
    finally:
        await a.close()
        await b.close()
    with open(out, "w") as f:
        json.dump(got, f)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
