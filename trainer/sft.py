"""Supervised fine-tuning on (prompt, response) pairs — loss on the response tokens only.

Used to warm the tiny policy up on synthetic demonstrations before GRPO, and as an algorithm on the bus
(``rolloutbus train --algorithm sft``, :mod:`trainer.sft_cli`: the transitions that pass a filter). A prompt is either raw text (encoded after ``<bos>``) or a list of chat messages (the chat
template, ending with the assistant marker); the response is text, followed by ``<|end|>`` so the
model learns to stop.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from trainer.grpo import token_logprobs
from trainer.tokenizer import Tokenizer

Prompt = str | Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class SFTConfig:
    epochs: int = 1
    lr: float = 3e-3  # measured on the tiny model: 1e-2 and above stalls at a plateau
    batch_size: int = 16
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0


def encode_pair(tok: Tokenizer, prompt: Prompt, response: str) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids ending with the turn-end token)."""
    p = tok.encode(prompt, add_bos=True) if isinstance(prompt, str) else tok.apply_chat_template(prompt)
    r = tok.encode(response) + [tok.stop_ids[0]] if tok.stop_ids else tok.encode(response)
    return p, r


def sft_loss(model: Any, batch: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int = 0) -> torch.Tensor:
    """Mean negative log-likelihood of the response tokens (token-mean over the batch)."""
    device = next(model.parameters()).device
    width = max(len(p) + len(r) for p, r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(batch):
        seq = list(p) + list(r)
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        mask[i, len(p) : len(seq)] = 1
    ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
    lp = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
    return -(lp * mask).sum() / mask.sum().clamp(min=1)


def sft(
    model: Any, tok: Tokenizer, pairs: Sequence[tuple[Prompt, str]], config: SFTConfig | None = None
) -> list[float]:
    """Fine-tune ``model`` in place on ``pairs``; returns the loss of every optimiser step."""
    return sft_ids(model, [encode_pair(tok, p, r) for p, r in pairs], config, tok.pad_id)


def sft_ids(model: Any, data: Sequence[tuple[Sequence[int], Sequence[int]]], config: SFTConfig | None = None,
            pad_id: int = 0) -> list[float]:
    """:func:`sft` on pairs already token ids (prompt ids, response ids): the transitions SFT on the bus reads
    (:mod:`trainer.sft_data`). Returns the loss of every optimiser step."""
    cfg = config or SFTConfig()
    if not data:
        return []
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    losses: list[float] = []
    model.train()
    try:
        for _ in range(cfg.epochs):
            order = list(range(len(data)))
            rng.shuffle(order)
            for start in range(0, len(order), cfg.batch_size):
                batch = [data[i] for i in order[start : start + cfg.batch_size]]
                loss = sft_loss(model, batch, pad_id)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                opt.step()
                losses.append(float(loss.item()))
    finally:
        model.eval()
    return losses


__all__ = ["SFTConfig", "encode_pair", "sft", "sft_ids", "sft_loss"]
