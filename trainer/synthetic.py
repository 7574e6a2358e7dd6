"""Synthetic GRPO groups sampled from a policy — for tests, the benchmark and smoke runs.

Each group is one arithmetic prompt answered ``group_size`` times by the policy; the reward is 1 when
the response starts with the right answer, plus a tiny length-based term so groups rarely have zero
variance; advantages are group-normalised exactly as the stream processor does it.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import torch

from schemas.models import GroupBatch, Transition
from trainer.grpo import group_advantages
from trainer.model import generate_batch
from trainer.tokenizer import Tokenizer


def sample_groups(
    model: Any,
    tok: Tokenizer,
    n_groups: int = 8,
    group_size: int = 4,
    max_new_tokens: int = 16,
    seed: int = 0,
    resource_version: int | None = 0,
) -> list[GroupBatch]:
    """``n_groups`` GroupBatch records with real behaviour log-probs from ``model``."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(n_groups):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        prompt = tok.apply_chat_template([{"role": "user", "content": f"What is {a}+{b}?"}])
        outs = generate_batch(
            model, [prompt] * group_size, max_new_tokens=max_new_tokens, temperature=1.0,
            stop_ids=tok.stop_ids, pad_id=tok.pad_id, generator=gen,
        )
        rewards = [float(tok.decode(o.token_ids).strip().startswith(str(a + b))) + 0.01 * len(o.token_ids) for o in outs]
        advs = group_advantages(torch.tensor(rewards)).tolist()
        gid = uuid.UUID(int=rng.getrandbits(128)).hex
        rids = [f"{gid}-{i}" for i in range(group_size)]
        transitions = [
            Transition(
                rollout_id=rid, attempt_id=f"{rid}-a", task_id=gid, span_id=f"{rid}-s", turn=0,
                resource_version=resource_version, prompt_token_ids=prompt, response_token_ids=o.token_ids,
                response_logprobs=o.logprobs, response_mask=[1] * len(o.token_ids), reward=r, return_=r, advantage=adv,
            )
            for rid, o, r, adv in zip(rids, outs, rewards, advs)
        ]
        groups.append(
            GroupBatch(
                group_id=gid, task_id=gid, resource_version=resource_version, created_ns=time.time_ns(),
                group_size=group_size, rollout_ids=rids, rewards=rewards, advantages=advs, transitions=transitions,
            )
        )
    return groups



def prompt_groups(vocab: int, n_groups: int, group_size: int, prompt_tokens: int, response_tokens: int, seed: int = 0) -> list[GroupBatch]:
    """Groups of random token ids: each group's rollouts share a prompt of ``prompt_tokens`` and have their own response
    of about ``response_tokens`` (behaviour log-probs -5, advantages +-1): the trainer's shape without a sampler."""
    rng = random.Random(seed)
    low = min(100, vocab // 4)
    groups = []
    for g in range(n_groups):
        prompt = [rng.randrange(low, vocab) for _ in range(prompt_tokens)]
        ts = []
        for i in range(group_size):
            n = max(1, response_tokens + rng.randint(-response_tokens // 4, response_tokens // 4))
            resp = [rng.randrange(low, vocab) for _ in range(n)]
            ts.append(Transition(rollout_id=f"r{g}-{i}", attempt_id=f"a{g}-{i}", task_id=f"t{g}", span_id=f"s{g}-{i}", turn=0,
                                 prompt_token_ids=prompt, response_token_ids=resp, response_logprobs=[-5.0] * n,
                                 response_mask=[1] * n, reward=float(i % 2), return_=float(i % 2), advantage=1.0 if i % 2 else -1.0))
        groups.append(GroupBatch(group_id=f"g{g}", task_id=f"t{g}", created_ns=0, group_size=group_size,
                                 rollout_ids=[t.rollout_id for t in ts], rewards=[t.reward for t in ts],
                                 advantages=[t.advantage for t in ts], transitions=ts))
    return groups


__all__ = ["prompt_groups", "sample_groups"]
