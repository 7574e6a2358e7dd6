"""Serving benchmark: a real model behind ``rolloutbus serve``, called by the official ``openai`` client.

Completion tokens per second at concurrency 1 and 16 (16 agents must share forward passes, not queue
for 16 sequential generations), with the SQL agent's prompt (schema + worked examples + a question);
then the agent's whole loop, greedy, on the demo's 150 held-out questions, 16 at once (what the demo's
evaluation of one version costs; a rewrite turn resends the previous one, which prefix caching reuses).
Prints one table; the model is imported first if needed (``rolloutbus model import``).

    .venv/bin/python -m bench.bench_serve [--model smollm2-135m-instruct] [--requests 32] [--threads 2] [--engine vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, http_ok, stop_process, wait_ready


async def _load(base: str, questions: list[str], concurrency: int, max_tokens: int) -> tuple[float, int, list[float]]:
    from openai import AsyncOpenAI

    from rolloutbus.demo import sql

    client = AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    tokens = 0

    async def one(q: str) -> None:
        nonlocal tokens
        async with sem:
            t0 = time.perf_counter()
            r = await client.chat.completions.create(model="policy", messages=sql.messages(q), max_tokens=max_tokens,  # type: ignore[arg-type]
                                                     temperature=1.0)
            latencies.append(time.perf_counter() - t0)
            tokens += r.usage.completion_tokens if r.usage else 0

    t0 = time.perf_counter()
    await asyncio.gather(*(one(q) for q in questions))
    await client.close()
    return time.perf_counter() - t0, tokens, sorted(latencies)


async def _agent_loop(base: str, questions: list[Any], concurrency: int, max_tokens: int) -> tuple[float, int, int, float]:
    """The SQL agent's loop, greedy: on an error the next turn resends the chat so far plus the error."""
    from openai import AsyncOpenAI

    from rolloutbus.demo import sql
    from rolloutbus.demo.sql_agent import MAX_REWRITES

    client = AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(concurrency)
    calls = tokens = 0
    right = 0.0

    async def one(q: Any) -> None:
        nonlocal calls, tokens, right
        async with sem:
            db = sql.connect()
            messages = sql.messages(q.text)
            for _ in range(1 + MAX_REWRITES):
                r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=max_tokens,  # type: ignore[arg-type]
                                                         temperature=0.0)
                calls += 1
                tokens += r.usage.completion_tokens if r.usage else 0
                text = r.choices[0].message.content or ""
                ok, result = sql.execute(db, sql.extract_sql(text))
                if ok:
                    right += float(sql.execution_match(sql.connect(), list(result), q.gold))
                    break
                messages += [{"role": "assistant", "content": text}, sql.retry_message(result)]

    t0 = time.perf_counter()
    await asyncio.gather(*(one(q) for q in questions))
    await client.close()
    return time.perf_counter() - t0, calls, tokens, right / len(questions)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--agent-questions", type=int, default=150, help="held-out questions for the agent-loop run (0 skips it)")
    ap.add_argument("--engine", choices=["torch", "vllm"], default="torch", help="rolloutbus serve's engine (vllm: `make vllm` first)")
    args = ap.parse_args()

    from rolloutbus.demo import sql
    from trainer.model_import import import_model

    data = Path(os.environ.get("ROLLOUTBUS_DATA_DIR", Path.home() / ".rolloutbus"))
    model = import_model(args.model, data / "models")
    questions = [q.text for q in sql.questions()][: args.requests]
    port = free_port()
    env = dict(os.environ, ROLLOUTBUS_DATA_DIR=tempfile.mkdtemp(prefix="bench-serve-"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", "serve", "--model", str(model), "--no-follow",
                             "--port", str(port), "--threads", str(args.threads), "--max-batch", "16", "--engine", args.engine],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        try:
            wait_ready("serve", lambda: http_ok(f"{base}/models"), proc, timeout=600 if args.engine == "vllm" else 180)
        except RuntimeError:
            print("serve did not start", file=sys.stderr)
            return 1
        asyncio.run(_load(base, questions[:2], 2, 4))  # warm-up
        rows = []
        for conc in (1, 16):
            n = min(len(questions), 8) if conc == 1 else len(questions)
            wall, tokens, lat = asyncio.run(_load(base, questions[:n], conc, args.max_tokens))
            rows.append((conc, n, tokens, wall, tokens / wall, lat[len(lat) // 2], lat[-1]))
        loop = None
        if args.agent_questions:
            _, held_out = sql.split(sql.questions(), 150, seed=0)  # the demo's held-out set
            loop = asyncio.run(_agent_loop(base, held_out[: args.agent_questions], 16, args.max_tokens))
    finally:
        stop_process(proc, 30)
    print(f"serve --engine {args.engine} {model.name}, {args.threads} torch threads (torch engine), SQL-agent prompts, max_tokens {args.max_tokens}, temperature 1")
    print(f"{'concurrency':>11} {'requests':>8} {'tokens':>7} {'wall s':>7} {'tokens/s':>9} {'p50 s':>6} {'max s':>6}")
    for conc, n, tokens, wall, tps, p50, pmax in rows:
        print(f"{conc:>11} {n:>8} {tokens:>7} {wall:>7.1f} {tps:>9.1f} {p50:>6.1f} {pmax:>6.1f}")
    print(f"batching speed-up (tokens/s at 16 / at 1): {rows[1][4] / rows[0][4]:.1f}x")
    if loop is not None:
        wall, calls, tokens, acc = loop
        print(f"agent loop (the demo's greedy evaluation): {args.agent_questions} held-out questions, 16 agents at once, "
              f"{calls} calls (a rewrite resends the chat so far), {tokens} tokens: {wall:.1f} s, {tokens / wall:.1f} tokens/s, "
              f"execution match {acc:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
