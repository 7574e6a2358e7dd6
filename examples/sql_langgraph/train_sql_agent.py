"""Train the write-ups' LangGraph SQL agent with GRPO: only write_query's and rewrite_query's LLM calls become
transitions (``agent_match="write|rewrite"``); check_query's are recorded and stored, never trained on.

    python examples/sql_langgraph/train_sql_agent.py                 # smollm2-135m-instruct, 10 minutes
    python examples/sql_langgraph/train_sql_agent.py --engine vllm   # served by vLLM (`make vllm` once): faster rollouts
    python examples/sql_langgraph/train_sql_agent.py --engine vllm --runners 4 --validation 0 --minutes 15 --held-out 150
        # the runs docs/training.md reports: held-out +3.3, +4.0, +2.7, -2.0, +2.7 points, the last version kept
    python examples/sql_langgraph/train_sql_agent.py --model tiny --minutes 1.5 --train 16   # a smoke run

The policy is a packaged model (``rolloutbus model import``: nothing comes from a model hub) or ``tiny``;
everything runs on the local stack, logs under ``--out``/logs.
"""

from __future__ import annotations

import argparse

import rolloutbus as agl
from data import datasets
from sql_agent import LitSQLAgent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--runners", type=int, default=10)
    p.add_argument("--train", type=int, default=0, help="use only the first N training tasks (0: all)")
    p.add_argument("--validation", type=int, default=30, help="validation tasks scored for each version")
    p.add_argument("--held-out", type=int, default=60,
                   help="test tasks answered by version 0 and the version kept, after training (0: none); a third on the "
                        "training databases, the rest on databases never trained on")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--truncate-length", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--train-layers", type=int, default=10, help="train the top N decoder layers (0: all)")
    p.add_argument("--precision", choices=("fp32", "bf16-mixed"), default="bf16-mixed",
                   help="the trainer's forward passes: bf16-mixed (bfloat16 autocast, float32 weights; twice fp32's speed on a CPU "
                        "with AMX) or fp32")
    p.add_argument("--engine", choices=("torch", "vllm"), default="torch",
                   help="the policy server: the project's (torch) or vLLM's, installed once by `make vllm` (not with tiny)")
    p.add_argument("--out", default="sql-langgraph-output")
    p.add_argument("--keep-store", action="store_true", help="leave the local store up to query the run")
    args = p.parse_args()

    agent = LitSQLAgent(max_turns=args.max_turns, truncate_length=args.truncate_length)
    # The demo's SQL settings: a 135M model on a CPU, small groups, the top layers trained.
    algorithm = agl.GRPO(group_size=4, groups_per_step=2, lr=1e-4, kl_beta=0.02, minutes=args.minutes,
                         train_layers=args.train_layers or None, train_args=["--micro-batch-tokens", "2048", "--precision", args.precision])
    trainer = agl.Trainer(
        n_runners=args.runners,
        algorithm=algorithm,
        adapter={"agent_match": "write|rewrite"},  # optimize both query stages
        initial_resources={"main_llm": agl.LLM(model=args.model, sampling_parameters={"temperature": 0.7, "max_tokens": args.max_tokens})},
        out=args.out,
        keep_store=args.keep_store,
        engine=args.engine,
    )
    train_data, val_data, test_data = datasets(validation=args.validation, test=args.held_out)
    trained_dbs = {row["db_id"] for row in train_data}
    if args.train:
        train_data = train_data[: args.train]
    result = trainer.fit(agent, train_dataset=train_data, val_dataset=val_data, test_dataset=test_data if args.held_out else None)
    held = result.held_out
    if held is not None:
        for name, seen in (("new questions on the training databases", True), ("databases never trained on", False)):
            idx = [i for i, row in enumerate(test_data) if (row["db_id"] in trained_dbs) == seen]
            if idx:
                before, after = (sum(s[i] for i in idx) / len(idx) for s in (held.first_scores, held.chosen_scores))
                print(f"held-out   {name} ({len(idx)}): {before:.1%} -> {after:.1%}")


if __name__ == "__main__":
    main()
