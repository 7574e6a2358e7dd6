"""Agents the fault tests run under the real task runner (``tests.faults.fault_agents:Steady``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from producers import emit_llm_call, emit_state
from rolloutbus import LitAgent


class Steady(LitAgent):
    """Three spans over ~0.3 s, reward from the task: slow enough that a SIGKILL lands mid-rollout."""

    name = "steady"

    async def rollout(self, task: Any, resources: Any, rollout: Any) -> float:
        x = task.get("x", 0) if isinstance(task, dict) else 0
        emit_state(json.dumps({"x": x}))
        await asyncio.sleep(0.1)
        emit_llm_call([1, 2], [3, 4], [-0.5, -0.5], model="tiny")
        await asyncio.sleep(0.1)
        emit_state("done")
        await asyncio.sleep(0.1)
        return float(x % 2)
