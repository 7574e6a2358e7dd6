"""Agent Lightning's status and mode names as types, for code that annotates with them (``agl.RolloutMode``,
``agl.RolloutStatus``, ``agl.AttemptStatus``): the values the gateway's Agent Lightning store takes and answers
(tests/unit/api/test_agl_namespace.py ties them to ``producers.ingest.agl``)."""

from __future__ import annotations

from typing import Literal

RolloutMode = Literal["train", "val", "test"]
RolloutStatus = Literal["queuing", "preparing", "running", "succeeded", "failed", "cancelled", "requeuing"]
AttemptStatus = Literal["preparing", "running", "failed", "succeeded", "unresponsive", "timeout"]

__all__ = ["AttemptStatus", "RolloutMode", "RolloutStatus"]
