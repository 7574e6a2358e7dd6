"""A steady agent workload for the fault tests, run as its own process.

``python tests/faults/emitter.py OUT_FILE --rollouts N --rate R --tasks T`` (or ``--per-task K``): opens
rollouts through the real producer API (rollout context, ``emit_*``, the span transport with its on-disk spool), one JSON line
per finished rollout in OUT_FILE: rollout id, attempt id, task id, spans emitted. The transport's spool
lives under ``$ROLLOUTBUS_DATA_DIR``. Exits after closing the transport (everything delivered or spooled).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from producers import SpanTransport, emit_llm_call, emit_reward, emit_state, emit_tool_call, rollout  # noqa: E402
from producers.settings import AgentSettings  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--rollouts", type=int, default=40)
    ap.add_argument("--rate", type=float, default=20.0, help="rollouts per second")
    ap.add_argument("--tasks", type=int, default=10, help="distinct task ids (group size = rollouts / tasks)")
    ap.add_argument("--per-task", type=int, default=0,
                    help="this many consecutive rollouts share a task (a group's members close in time), not round-robin")
    ap.add_argument("--prefix", default="em")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--duration", type=float, default=0.0, help="run this long instead of --rollouts (soak)")
    a = ap.parse_args()
    s = AgentSettings()
    transport = SpanTransport.from_settings(s, spool_name=f"emitter-{a.prefix}")
    started = time.monotonic()
    i = 0
    with a.out.open("a") as out:
        while (a.duration and time.monotonic() - started < a.duration) or (not a.duration and i < a.rollouts):
            task = f"{a.prefix}-task{i // a.per_task if a.per_task else i % a.tasks}"
            with rollout(task, transport=transport, resource_version=1, agent_name="steady") as ctx:
                for t in range(a.turns):
                    emit_state({"turn": t, "i": i})
                    emit_llm_call([1, 2, 3, t], [4, 5, i % 1000], [-0.1, -0.2, -0.3], model="tiny")
                    emit_tool_call("calc", {"x": t}, result=str(t))
                emit_reward(float(i % 2))
            # What the agent handed to the transport (not yet necessarily delivered).
            if not a.duration:
                out.write(json.dumps({"rid": ctx.rollout_id, "att": ctx.attempt_id, "task": task, "n": ctx.span_count}) + "\n")
                out.flush()
            i += 1
            time.sleep(max(0.0, started + i / a.rate - time.monotonic()))
    left = transport.close(60)
    print(json.dumps({"rollouts": i, "left_in_spool": left, "pid": os.getpid(), **transport.stats()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
