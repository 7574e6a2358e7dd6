"""The torch reference backend: one GRPO optimiser step on a list of ``GroupBatch`` records.

Each transition becomes one row ``prompt + response``; the loss mask is the transition's
``response_mask`` (1 = tokens the policy produced, 0 = tool/observation tokens spliced into a
multi-turn response; empty = all ones); the behaviour log-probs are the ones recorded at sampling time
(empty = on-policy: the current policy's own, detached, so the ratio is 1). Rows are packed into
micro-batches of at most ``micro_batch_tokens`` padded tokens and gradients accumulate across them
with the full batch's normalisers, so memory is bounded by the setting and the update equals the
full-batch one.

``autocast`` (``torch.bfloat16``: bf16 mixed precision) runs the forward passes under ``torch.autocast``
while the weights, the gradients and AdamW's state stay in float32: the GPU check measured a step of a
1B model 7.5x faster than float32 (TF32 off) on an H200, with gradients as close to the exact step as a
model stored in bfloat16 (bench/results/gpu-2026-11-27.md). The log-probabilities and the loss are
computed in float32 either way.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from foundation.errors import TrainingError
from schemas.models import GroupBatch
from trainer.grpo import GRPOConfig, grpo_loss, token_logprobs
from trainer.model import max_positions
from trainer.policy_losses import updates_refused


@dataclass
class Sample:
    """One training row, token-aligned: ``mask``/``old_logp`` have one entry per id in ``ids``."""

    ids: list[int]
    mask: list[int]
    old_logp: list[float] | None
    advantage: float
    weight: float = 1.0


@dataclass
class BuildReport:
    samples: list[Sample] = field(default_factory=list)
    skipped_too_long: int = 0
    skipped_malformed: int = 0
    empty_response: int = 0


def samples_from_groups(
    groups: Sequence[GroupBatch], weights: Sequence[float] | None = None, max_len: int | None = None
) -> BuildReport:
    """Transitions → rows. Rows that cannot be trained on are counted, not raised."""
    rep = BuildReport()
    for gi, g in enumerate(groups):
        w = 1.0 if weights is None else float(weights[gi])
        for t in g.transitions:
            p, r = t.prompt_token_ids, t.response_token_ids
            if not r:
                rep.empty_response += 1
                continue
            rmask = t.response_mask or [1] * len(r)
            if len(rmask) != len(r) or (t.response_logprobs and len(t.response_logprobs) != len(r)) or not p:
                rep.skipped_malformed += 1
                continue
            if max_len is not None and len(p) + len(r) > max_len:
                rep.skipped_too_long += 1
                continue
            old = [0.0] * len(p) + list(t.response_logprobs) if t.response_logprobs else None
            rep.samples.append(Sample(list(p) + list(r), [0] * len(p) + [1 if m else 0 for m in rmask], old, float(t.advantage), w))
    return rep


def micro_batches(samples: Sequence[Sample], micro_batch_tokens: int) -> list[list[Sample]]:
    """Pack rows (longest first) so ``rows * padded_len <= micro_batch_tokens``; a longer row goes alone."""
    order = sorted(samples, key=lambda s: len(s.ids), reverse=True)
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    width = 0
    for s in order:
        w = max(width, len(s.ids))
        if cur and w * (len(cur) + 1) > micro_batch_tokens:
            out.append(cur)
            cur, w = [], len(s.ids)
        cur.append(s)
        width = w
    if cur:
        out.append(cur)
    return out


MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth a forward of their own
# Nor a run that saves fewer positions than MIN_SAVED_POSITIONS, or than SHARE_BREAK_EVEN / the model's parameters: the
# prefix's own forward and a micro-batch per run cost about the same however small the model, what they save is in
# proportion to its size (tokens per CPU-second, shared over whole, groups of 4, bench/bench_trainer_tokens.py: the
# calculator's 0.34M-parameter model 0.78x at 48-token prompts, 1.46x at 128, 2.50x at 400; SmolLM2-135M 1.14x at 40,
# 1.27x at 64, 2.32x at 256).
MIN_SAVED_POSITIONS = 32
SHARE_BREAK_EVEN = 1e8  # parameter-positions: 293 positions for the calculator's model, MIN_SAVED_POSITIONS for SmolLM2


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def first_scored(s: Sample) -> int:
    """The first position whose logit the loss reads (it predicts the first trained token); a shared prefix
    must end before it, so every logit needed comes from the rows' own forward."""
    try:
        return s.mask.index(1) - 1
    except ValueError:
        return len(s.ids) - 1


def shared_batches(samples: Sequence[Sample], micro_batch_tokens: int,
                   min_saved: int = MIN_SAVED_POSITIONS) -> list[tuple[int, list[Sample]]]:
    """Micro-batches of rows that share a prefix, each with the length of that prefix (0: none shared).

    The rollouts of a group share their prompt (a single-turn task's whole prompt, a multi-turn one's growing
    history). Sorted by their tokens, rows that share a prefix lie next to each other; the sorted list is cut into
    runs that save the most positions (a run of ``k`` rows sharing ``p`` tokens saves ``(k - 1) * p``; shares under
    :data:`MIN_SHARED_PREFIX` tokens and runs saving under ``min_saved`` positions count for nothing), a shared prefix
    ending before any row's first scored position.
    A run is packed so that ``prefix + rows * (width - prefix) <= micro_batch_tokens``, its prefix computed once
    per micro-batch; rows that share with no one are packed as :func:`micro_batches` packs them."""
    order = sorted(samples, key=lambda s: s.ids)
    n = len(order)
    lcp = [_common_prefix(order[i - 1].ids, order[i].ids) for i in range(1, n)]
    best = [0] * (n + 1)  # best[j]: the most positions saved over order[:j]
    cut = [0] * (n + 1)  # where the last run of order[:j] starts
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1], j - 1
        shared = first_scored(order[j - 1])
        for i in range(j - 2, -1, -1):  # the run order[i:j]
            shared = min(shared, lcp[i], first_scored(order[i]))
            if shared < MIN_SHARED_PREFIX:
                break
            if (j - i - 1) * shared >= min_saved and best[i] + (j - i - 1) * shared > best[j]:
                best[j], cut[j] = best[i] + (j - i - 1) * shared, i
    runs: list[tuple[int, list[Sample]]] = []
    j = n
    while j > 0:
        i = cut[j]
        run = order[i:j]
        runs.append((min([first_scored(s) for s in run] + lcp[i:j - 1]) if j - i > 1 else 0, run))
        j = i
    out: list[tuple[int, list[Sample]]] = []
    alone: list[Sample] = []
    for shared, members in reversed(runs):
        if not shared:
            alone.extend(members)
            continue
        cur: list[Sample] = []
        width = 0
        for s in sorted(members, key=lambda s: len(s.ids), reverse=True):
            w = max(width, len(s.ids))
            if cur and shared + (w - shared) * (len(cur) + 1) > micro_batch_tokens:
                out.append((shared if len(cur) > 1 else 0, cur))
                cur, w = [], len(s.ids)
            cur.append(s)
            width = w
        out.append((shared if len(cur) > 1 else 0, cur))
    return out + [(0, mb) for mb in micro_batches(alone, micro_batch_tokens)]


def computed_tokens(batches: Sequence[tuple[int, Sequence[Sample]]]) -> int:
    """Positions the forward passes run over, padding included: a shared prefix once per micro-batch."""
    return sum(prefix + len(mb) * (max(len(s.ids) for s in mb) - prefix) for prefix, mb in batches)


def collate(samples: Sequence[Sample], pad_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Rows → right-padded tensors: input_ids, attention_mask, loss_mask, old_logp, has_old, advantages, weights."""
    n, width = len(samples), max(len(s.ids) for s in samples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    old = torch.zeros((n, width), dtype=torch.float32)
    has_old = torch.zeros((n, 1), dtype=torch.bool)
    for i, s in enumerate(samples):
        L = len(s.ids)
        ids[i, :L] = torch.tensor(s.ids, dtype=torch.long)
        attn[i, :L] = 1
        mask[i, :L] = torch.tensor(s.mask, dtype=torch.long)
        if s.old_logp is not None:
            old[i, :L] = torch.tensor(s.old_logp, dtype=torch.float32)
            has_old[i] = True
    return {
        "input_ids": ids.to(device),
        "attention_mask": attn.to(device),
        "loss_mask": mask.to(device),
        "old_logp": old.to(device),
        "has_old": has_old.to(device),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
        "weights": torch.tensor([s.weight for s in samples], dtype=torch.float32, device=device),
    }


def masked_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                    temperature: float = 1.0, through_root: bool = False, prefix: int = 0, lockstep: bool = False) -> torch.Tensor:
    """:func:`token_logprobs` where ``loss_mask`` is 1, zero elsewhere — with the LM head applied to those
    positions only.

    A response is a few dozen tokens after a prompt of hundreds; projecting every position onto the
    vocabulary (49k wide for a real tokenizer) was most of a step's compute and memory. Exact: the same
    numbers at the masked positions. Models without a separable decoder/head fall back to full logits.

    ``prefix`` > 0: the rows' first ``prefix`` tokens are the same (:func:`shared_batches`) and end before the
    first scored position. They run through the model once, as one row; the rows continue from its keys and
    values, repeated per row, and the gradient of every row flows back into that one computation. The same
    numbers as running each row whole, to float rounding. ``lockstep`` (several ranks sharing prefixes): ranks run the
    same forwards in the same order, FSDP2's gathers being collective, so a micro-batch that shares nothing makes the
    first call too, on one token.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if head is None or decoder is None:
        return token_logprobs(model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits, input_ids,
                              temperature)
    rows, cols = torch.nonzero(loss_mask[:, 1:] > 0, as_tuple=True)  # position t-1 predicts token t
    if prefix and (bool((cols < prefix).any()) or not bool(attention_mask[:, :prefix].all())):
        raise ValueError(f"a shared prefix of {prefix} tokens must end before the first scored position")
    kw: dict[str, Any] = {}
    first = None
    if prefix:
        # FSDP2 gathers the root's parameters in the root's forward only: on several ranks both parts go through it.
        run = model if through_root else decoder
        first = run(input_ids=input_ids[:1, :prefix], use_cache=True, **({"logits_to_keep": 1} if through_root else {}))
        cache = first.past_key_values
        cache.batch_repeat_interleave(input_ids.shape[0])
        kw = {"past_key_values": cache, "use_cache": True}
    elif through_root and lockstep:
        first = model(input_ids=input_ids[:1, :1], use_cache=False, logits_to_keep=1)
    ids = input_ids[:, prefix:]
    if through_root:
        # HF's logits_to_keep applies the head to the columns some row needs; then pick each row's positions.
        keep = torch.unique(cols)
        full = model(input_ids=ids, attention_mask=attention_mask, logits_to_keep=keep - prefix, **({"use_cache": False} | kw)).logits
        logits = full[rows, torch.searchsorted(keep, cols)].float()
    else:
        hidden = decoder(input_ids=ids, attention_mask=attention_mask, **({"use_cache": False} | kw)).last_hidden_state
        logits = head(hidden[rows, cols - prefix]).float()
    # FSDP2 gathers a module's parameters for backward when a gradient reaches that forward's output; the prefix's
    # output reaches the loss only through the keys and values (not a tensor it hooks), so its logits join it at 0.
    extra = 0.0 * first.logits.float().sum() if first is not None and through_root else None
    return _picked(logits, input_ids, rows, cols, temperature, extra)


def shared_lower_layers(model: Any, ref: Any) -> int:
    """How many of the policy's lowest decoder layers the reference can take from the policy's forward: layers frozen
    in the policy (as ``--train-layers`` freezes them) and equal to the reference's, over frozen, equal embeddings.
    0 where there is no reference, no ``layers`` stack, or nothing frozen and equal. At most all but one layer."""
    if ref is None or not _layer_inputs_carry_over(model):
        return 0
    try:
        dec, rdec = model.get_decoder(), ref.get_decoder()
        layers, rlayers = list(dec.layers), list(rdec.layers)
        emb, remb, _ = dec.get_input_embeddings(), rdec.get_input_embeddings(), rdec.norm
    except (AttributeError, NotImplementedError):
        return 0

    def frozen_and_equal(a: Any, b: Any) -> bool:
        sa, sb = a.state_dict(), b.state_dict()
        return (not any(p.requires_grad for p in a.parameters()) and sa.keys() == sb.keys()
                and all(sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k].to(sa[k].device)) for k in sa))

    if len(layers) != len(rlayers) or len(layers) < 2 or not frozen_and_equal(emb, remb):
        return 0
    k = 0
    while k < len(layers) - 1 and frozen_and_equal(layers[k], rlayers[k]):
        k += 1
    return k


def _layer_inputs_carry_over(model: Any) -> bool:
    """Whether what the decoder hands one layer is what it hands every layer above: not so for models that mix layer
    types (sliding-window and full attention, per-type rotary bases: Gemma 2/3, Cohere 2, Qwen with sliding windows),
    nor before transformers 4.56, whose decoders pass the cache as ``past_key_value`` and build no cache from a config."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    types = getattr(getattr(model, "config", None), "layer_types", None)
    return (major, minor) >= (4, 56) and (not types or len(set(types)) == 1)


class LayerInputs:
    """What the policy's decoder hands its layer ``k`` on each forward call (a forward pre-hook, removed on exit): the
    reference's upper layers start from it when its lower ones are the policy's (:func:`shared_lower_layers`)."""

    def __init__(self, model: Any, k: int) -> None:
        self.layer = model.get_decoder().layers[k]
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __enter__(self) -> "LayerInputs":
        self._handle = self.layer.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()

    def _hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls.append((tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args), dict(kwargs)))


def upper_logprobs(ref: Any, k: int, calls: list[tuple[tuple[Any, ...], dict[str, Any]]], input_ids: torch.Tensor,
                   loss_mask: torch.Tensor, temperature: float = 1.0, prefix: int = 0) -> torch.Tensor:
    """:func:`masked_logprobs` of the reference from its layer ``k`` up, each forward call starting from what the
    policy's layer ``k`` was given (:class:`LayerInputs`: the hidden states, the causal mask, the positions). With a
    shared prefix the first call is the prefix's: its keys and values go to the reference's own cache, repeated per
    row for the second."""
    from transformers import DynamicCache

    dec, head = ref.get_decoder(), ref.get_output_embeddings()
    rows, cols = torch.nonzero(loss_mask[:, 1:] > 0, as_tuple=True)
    cache = DynamicCache(config=ref.config) if prefix else None
    hidden = None
    for i, (args, kwargs) in enumerate(calls):
        h, rest = (args[0], args[1:]) if args else (kwargs["hidden_states"], ())
        kw = {key: v for key, v in kwargs.items() if key != "hidden_states"}
        kw["past_key_values"] = cache
        for layer in list(dec.layers)[k:]:
            out = layer(h, *rest, **kw)
            h = out[0] if isinstance(out, tuple) else out
        if prefix and i == 0:
            cache.batch_repeat_interleave(input_ids.shape[0])  # type: ignore[union-attr]
        hidden = h
    if hidden is None or len(calls) != (2 if prefix else 1):
        raise ValueError(f"expected {2 if prefix else 1} forward call(s) of the policy's layer {k}, saw {len(calls)}")
    logits = head(dec.norm(hidden)[rows, cols - prefix]).float()
    return _picked(logits, input_ids, rows, cols, temperature)


def _picked(logits: torch.Tensor, input_ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, temperature: float,
            extra: torch.Tensor | None = None) -> torch.Tensor:
    """Per-position log-probabilities of the targets from the logits of the ``(rows, cols)`` positions, zero elsewhere."""
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[rows, cols + 1]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if extra is not None:
        picked = picked + extra
    out = torch.zeros(input_ids.shape, dtype=picked.dtype, device=picked.device)
    return out.index_put((rows, cols + 1), picked)


def group_stats(groups: Sequence[GroupBatch]) -> dict[str, float]:
    """Reward, success and advantage statistics of a train batch (what analysts plot next to the loss; the trackers'
    ``train/*``)."""
    rewards = [r for g in groups for r in g.rewards]
    advs = [t.advantage for g in groups for t in g.transitions]

    def _mean(x: list[float]) -> float:
        return sum(x) / len(x) if x else 0.0

    am = _mean(advs)
    return {
        "reward_mean": _mean(rewards),
        "reward_max": max(rewards) if rewards else 0.0,
        "reward_min": min(rewards) if rewards else 0.0,
        "success_rate": _mean([1.0 if r > 0 else 0.0 for r in rewards]),  # final reward > 0, as rollouts/success counts it
        "advantage_mean": am,
        "advantage_std": math.sqrt(_mean([(a - am) ** 2 for a in advs])) if advs else 0.0,
        "advantage_max": max(advs) if advs else 0.0,
        "advantage_min": min(advs) if advs else 0.0,
        "groups": float(len(groups)),
        "zero_variance_groups": float(sum(1 for g in groups if g.zero_variance)),
    }


def mini_batch_cuts(groups: int, mini_batches: int) -> list[tuple[int, int]]:
    """``groups`` cut into ``mini_batches`` contiguous runs of near-equal length (fewer when there are fewer groups; one
    empty run when there are none): a group is never split, as verl's mini-batches keep a prompt's responses. Pure."""
    k = max(1, min(mini_batches, groups))
    return [(i * groups // k, (i + 1) * groups // k) for i in range(k)]


_TOKEN_MEANS = ("kl", "clip_fraction", "ratio_mean")
_COUNTS = ("micro_batches", "response_tokens", "tokens", "tokens_computed", "samples")


def merge_mini_batches(passes: Sequence[tuple[dict[str, float], float]]) -> tuple[dict[str, float], float]:
    """One pass over a batch from its mini-batches' (metrics, gradient norm): the losses and the norm averaged over the
    mini-batches (each is its own mini-batch's mean), the token means weighted by their response tokens, the counts
    summed, the ratio's extremes kept. One mini-batch: its own. Pure."""
    if len(passes) == 1:
        return passes[0]
    ms = [m for m, _ in passes]
    weights = [m["response_tokens"] for m in ms]
    total = sum(weights) or 1.0
    out = dict(ms[0])
    out.update({k: sum(m[k] for m in ms) / len(ms) for k in ("loss", "pg_loss")})
    out.update({k: sum(m[k] * w for m, w in zip(ms, weights)) / total for k in _TOKEN_MEANS})
    out.update({k: sum(m[k] for m in ms) for k in _COUNTS})
    out["ratio_max"], out["ratio_min"] = max(m["ratio_max"] for m in ms), min(m["ratio_min"] for m in ms)
    return out, sum(g for _, g in passes) / len(passes)


class TorchGRPOBackend:
    """AdamW + grad clipping + micro-batched GRPO over a HF causal LM (or any module returning ``.logits``)."""

    def __init__(
        self,
        model: Any,
        *,
        grpo: GRPOConfig | None = None,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        max_grad_norm: float = 1.0,
        micro_batch_tokens: int = 4096,
        ref_model: Any | None = None,
        temperature: float = 1.0,
        pad_id: int = 0,
        autocast: torch.dtype | None = None,
        ranks: Any | None = None,
        share_prefix: bool = True,
        updates_per_batch: int = 1,
        mini_batches: int = 1,
    ) -> None:
        if micro_batch_tokens <= 0:
            raise TrainingError("micro_batch_tokens must be > 0")
        if updates_per_batch < 1 or mini_batches < 1:
            raise TrainingError("updates_per_batch and mini_batches must be >= 1")
        if (why := updates_refused((grpo or GRPOConfig()).policy_loss, updates_per_batch)) is not None:
            raise TrainingError(why)
        # GRPO's μ (verl's ppo_epochs, TRL's num_iterations): optimiser updates on each batch, every one clipped against
        # the log-probs the batch was sampled with (or, where none were recorded, the policy's before the first update)
        self.updates_per_batch = updates_per_batch
        # verl's mini-batches (train_batch_size / ppo_mini_batch_size): each pass over a batch is that many optimiser
        # steps, each on its own groups; a sample is used once a pass, so any policy loss takes them
        self.mini_batches = mini_batches
        self.model = model
        self.grpo = grpo or GRPOConfig()
        self.max_grad_norm = max_grad_norm
        self.micro_batch_tokens = micro_batch_tokens
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)
        self.temperature = temperature
        self.pad_id = pad_id
        self.autocast = autocast
        self.ranks = ranks  # a trainer.distributed.Ranks when the model is sharded over several processes
        # A group's shared prompt once per micro-batch (shared_batches). Not under activation checkpointing, where HF
        # models run without the keys and values the rows would continue from.
        self.share_prefix = share_prefix and not getattr(model, "is_gradient_checkpointing", False)
        # The reference's lower layers, where they are the policy's frozen ones, from the policy's forward (one device).
        self.shared_layers = shared_lower_layers(model, ref_model) if share_prefix and ranks is None else 0
        self.min_shared_saving = max(MIN_SAVED_POSITIONS, math.ceil(SHARE_BREAK_EVEN / max(sum(p.numel() for p in model.parameters()), 1)))
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _forward_precision(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)

    def accumulate(self, samples: Sequence[Sample], *, num_seqs: float | None = None, num_tokens: float | None = None,
                   loss_scale: float = 1.0, padding: Sequence[list[Sample]] = (), lockstep: bool = False,
                   packed: list[tuple[int, list[Sample]]] | None = None,
                   olds: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None, backward: bool = True) -> dict[str, float]:
        """Forward/backward over micro-batches, leaving the summed gradient in ``.grad``. Returns metrics.

        ``num_seqs`` / ``num_tokens``: the whole batch's counts when ``samples`` is one rank's share of it;
        ``loss_scale`` multiplies each loss before backward (the ranks' count, where FSDP averages gradients);
        ``padding``: micro-batches run with weight 0 after the real ones (a rank with fewer than the busiest);
        ``lockstep``: some rank shares a prefix, so every micro-batch makes two forward calls
        (:func:`masked_logprobs`); ``packed``: :meth:`pack` of ``samples`` when the caller has it already;
        ``olds``: each micro-batch's old log-probs and the reference's, kept across a batch's updates: the first call (an
        empty list) appends them, the later ones (the same micro-batches in the same order) reuse them; ``backward``
        False: only that (no gradient, no loss; the metrics are not the batch's), before an earlier mini-batch's step."""
        num_seqs = float(len(samples)) if num_seqs is None else num_seqs
        num_tokens = float(sum(sum(s.mask) for s in samples)) if num_tokens is None else num_tokens
        sums = {"loss": 0.0, "pg_loss": 0.0}
        tok_weighted = {"kl": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0}
        rmax, rmin, mbs = -math.inf, math.inf, 0
        data_time = 0.0
        self.model.train()
        through_root = self.ranks is not None
        packed = self.pack(samples) if packed is None else packed
        batches = [(prefix, mb, 1.0) for prefix, mb in packed] + [(0, mb, 0.0) for mb in padding]
        for i, (prefix, mb, weight) in enumerate(batches):
            t0 = time.perf_counter()
            b = collate(mb, self.pad_id, self.device)
            data_time += time.perf_counter() - t0
            kept = olds[i] if olds is not None and i < len(olds) else None
            with self._forward_precision():
                taps = (LayerInputs(self.model, self.shared_layers) if self.shared_layers and self.ref_model is not None
                        and kept is None else None)
                with taps or contextlib.nullcontext(), contextlib.nullcontext() if backward else torch.no_grad():
                    logp = masked_logprobs(self.model, b["input_ids"], b["attention_mask"], b["loss_mask"], self.temperature,
                                           through_root, prefix, lockstep)
                ref = None
                if kept is not None:
                    pass  # a later update of the batch: its old and reference log-probs are the first update's
                elif taps is not None:
                    with torch.no_grad():
                        ref = upper_logprobs(self.ref_model, self.shared_layers, taps.calls, b["input_ids"], b["loss_mask"],
                                             self.temperature, prefix)
                elif self.ref_model is not None:
                    with torch.no_grad():
                        ref = masked_logprobs(self.ref_model, b["input_ids"], b["attention_mask"], b["loss_mask"], self.temperature,
                                              through_root, prefix, lockstep)  # a sharded reference (several ranks) as the policy
            if kept is not None:
                old, ref = kept
            else:
                old = torch.where(b["has_old"], b["old_logp"], logp.detach())
                if olds is not None:
                    olds.append((old, ref))
            if not backward:
                continue
            loss, m = grpo_loss(
                logp, old, b["advantages"], b["loss_mask"], self.grpo,
                ref_logp=ref, seq_weights=b["weights"], num_seqs=num_seqs, num_tokens=num_tokens,
            )
            (loss * (loss_scale * weight)).backward()
            if not weight:
                continue
            mbs += 1
            sums["loss"] += m["loss"]
            sums["pg_loss"] += m["pg_loss"]
            for k in tok_weighted:
                tok_weighted[k] += m[k] * m["active_tokens"]
            if m["active_tokens"]:
                rmax, rmin = max(rmax, m["ratio_max"]), min(rmin, m["ratio_min"])
        denom = max(num_tokens, 1.0)
        return {
            **sums,
            **{k: v / denom for k, v in tok_weighted.items()},
            "ratio_max": rmax if mbs and rmax > -math.inf else 1.0,
            "ratio_min": rmin if mbs and rmin < math.inf else 1.0,
            "micro_batches": float(mbs),
            "response_tokens": num_tokens,
            "tokens": float(sum(len(s.ids) for s in samples)),
            "tokens_computed": float(computed_tokens(packed)),
            "samples": num_seqs,
            "collate_time_s": data_time,
        }

    def pack(self, samples: Sequence[Sample]) -> list[tuple[int, list[Sample]]]:
        """Micro-batches and the prefix each shares (:func:`shared_batches`; all 0 with ``share_prefix`` off)."""
        if self.share_prefix:
            return shared_batches(samples, self.micro_batch_tokens, self.min_shared_saving)
        return [(0, mb) for mb in micro_batches(samples, self.micro_batch_tokens)]

    def step(self, groups: Sequence[GroupBatch], weights: Sequence[float] | None = None) -> dict[str, float]:
        """A batch's optimiser steps on ``groups`` (``weights``: per-group loss weight, e.g. staleness): one, or
        ``updates_per_batch`` passes of ``mini_batches`` steps each. Returns the metrics of its first pass."""
        t0 = time.perf_counter()
        cuts = mini_batch_cuts(len(groups), self.mini_batches)
        reps = [samples_from_groups(groups[lo:hi], None if weights is None else weights[lo:hi], max_positions(self.model))
                for lo, hi in cuts]
        minis = [r.samples for r in reps if r.samples]
        build_time = time.perf_counter() - t0
        metrics: dict[str, float] = {
            "skipped_too_long": float(sum(r.skipped_too_long for r in reps)),
            "skipped_malformed": float(sum(r.skipped_malformed for r in reps)),
            "empty_responses": float(sum(r.empty_response for r in reps)),
            **group_stats(groups),
        }
        self.optimizer.zero_grad(set_to_none=True)
        if not minis:
            metrics.update({"loss": 0.0, "samples": 0.0, "tokens": 0.0, "step_time_s": time.perf_counter() - t0})
            return metrics
        # μ passes over the batch, each one optimiser step per mini-batch. The first pass's metrics are the step's (its
        # mini-batches' together); the last update's clip fraction and ratio say how far the updates moved the policy from
        # the batch's. A mini-batch's old and reference log-probs are kept across passes; where a sample recorded none,
        # its old ones are the policy's before the batch's first update (a forward pass before it, as verl's).
        ranked = self.ranks is not None
        packs = [None if ranked else self.pack(mini) for mini in minis]
        # a later mini-batch with a sample that recorded no sampling log-probs: its old ones from a pass before any step
        before = [k > 0 and any(smp.old_logp is None for smp in mini) for k, mini in enumerate(minis)]
        olds: list[list[tuple[torch.Tensor, torch.Tensor | None]] | None] = [
            [] if self.updates_per_batch > 1 or ahead else None for ahead in before]
        collate_s = 0.0
        for k in (k for k, ahead in enumerate(before) if ahead):
            collate_s += self._accumulate(minis[k], packs[k], olds[k], backward=False)["collate_time_s"]
        passes: list[tuple[dict[str, float], float]] = []
        applied: dict[str, float] | None = None
        updates, ran = 0, 0.0
        for epoch in range(self.updates_per_batch):
            for k, mini in enumerate(minis):
                self.optimizer.zero_grad(set_to_none=True)
                m = self._accumulate(mini, packs[k], olds[k])
                collate_s += m.pop("collate_time_s")
                ran += m["tokens"]
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
                if hasattr(grad_norm, "full_tensor"):  # sharded parameters: the norm over every rank's shard
                    grad_norm = grad_norm.full_tensor()
                if not epoch:
                    passes.append((m, float(grad_norm)))
                if not torch.isfinite(grad_norm):
                    # Skip the update (and the batch's later ones) rather than poison the weights; the metric says it
                    # happened, and ``updates`` how many were made before it.
                    self.optimizer.zero_grad(set_to_none=True)
                    metrics["skipped_nonfinite"] = 1.0
                    break
                self.optimizer.step()
                updates, applied = updates + 1, m
            if "skipped_nonfinite" in metrics:
                break
        self.model.eval()
        elapsed = time.perf_counter() - t0
        m, metrics["grad_norm"] = merge_mini_batches(passes)
        metrics.update(m)
        if len(minis) > 1:
            metrics["mini_batches"] = float(len(minis))
        if self.updates_per_batch * len(minis) > 1:
            metrics["updates"] = float(updates)
            if applied is not None:  # how far the batch's last update found the policy from the one that sampled it
                metrics["clip_fraction_last"] = applied["clip_fraction"]
                metrics["ratio_mean_last"] = applied["ratio_mean"]
        metrics["step_time_s"] = elapsed
        # the tokens the step ran through the model (with a gradient) per second, each pass's (``tokens``: the batch's, once)
        metrics["tokens_per_s"] = ran / elapsed if elapsed > 0 else 0.0
        metrics["build_time_s"] = build_time + collate_s
        return metrics

    def _accumulate(self, samples: list[Sample], packed: list[tuple[int, list[Sample]]] | None,
                    olds: list[tuple[torch.Tensor, torch.Tensor | None]] | None, backward: bool = True) -> dict[str, float]:
        """:meth:`accumulate` of one mini-batch on one device, or this rank's share of it."""
        if self.ranks is None:
            return self.accumulate(samples, packed=packed, olds=olds, backward=backward)
        return self._accumulate_share(samples, olds=olds, backward=backward)

    def _accumulate_share(self, samples: list[Sample], olds: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None,
                          backward: bool = True) -> dict[str, float]:
        """This rank's share of the batch through :meth:`accumulate`, normalised by the whole batch, as many
        micro-batches as the busiest rank; the metrics are the whole batch's. The share is a contiguous block of the
        rows sorted by their tokens, so that a group's rows (which share its prompt) stay on one rank. The share, its
        micro-batches and the padding are the same at each of a batch's updates (a stable sort, a deterministic
        packing): ``olds`` lines up with them."""
        from trainer import distributed

        ranks = self.ranks
        order = sorted(samples, key=lambda s: s.ids)
        share = order[ranks.rank * len(order) // ranks.world:(ranks.rank + 1) * len(order) // ranks.world]
        packed = self.pack(share)
        most = distributed.all_reduce({"n": float(len(packed)), "shared": float(any(p for p, _ in packed))}, "max")
        filler = share[:1] or samples[:1]
        m = self.accumulate(share, num_seqs=float(len(samples)), num_tokens=float(sum(sum(s.mask) for s in samples)),
                            loss_scale=float(ranks.world), padding=[filler] * (int(most["n"]) - len(packed)),
                            lockstep=bool(most["shared"]), packed=packed, olds=olds, backward=backward)
        # loss, pg_loss and the token means are each rank's part of the whole batch's (normalised by its counts)
        summed = distributed.all_reduce({k: m[k] for k in ("loss", "pg_loss", "kl", "clip_fraction", "ratio_mean", "micro_batches",
                                                           "tokens", "tokens_computed", "collate_time_s")})
        return {**m, **summed,
                "ratio_max": distributed.all_reduce({"r": m["ratio_max"]}, "max")["r"],
                "ratio_min": distributed.all_reduce({"r": m["ratio_min"]}, "min")["r"], "samples": float(len(samples))}

    def optimizer_state(self) -> dict[str, Any]:
        if self.ranks is not None:
            from trainer import distributed

            return distributed.full_optimizer_state(self.model, self.optimizer)
        return self.optimizer.state_dict()

    def load_sharded_optimizer_state(self, path: Any) -> None:
        """The optimizer state several ranks wrote (a DCP directory), resharded to these ranks or to one device."""
        from trainer import distributed

        try:
            distributed.load_sharded_optimizer(self.model, self.optimizer, path)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise TrainingError(f"optimizer state {path} does not match the model: {exc}") from exc

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        from trainer import distributed

        names = distributed.trained_names(self.model)
        try:  # a checkpoint of one device keys it by index, of several ranks by name: either loads on any rank count
            if self.ranks is not None:
                distributed.load_full_optimizer_state(self.model, self.optimizer, distributed.by_name(state, names))
            else:
                self.optimizer.load_state_dict(distributed.by_index(state, names))
        except (ValueError, KeyError, RuntimeError) as exc:
            raise TrainingError(f"optimizer state does not match the model: {exc}") from exc


__all__ = ["LayerInputs", "MIN_SAVED_POSITIONS", "merge_mini_batches", "mini_batch_cuts", "shared_lower_layers", "upper_logprobs", "MIN_SHARED_PREFIX", "SHARE_BREAK_EVEN", "Sample", "BuildReport", "TorchGRPOBackend", "collate", "computed_tokens", "group_stats",
           "masked_logprobs", "micro_batches", "samples_from_groups", "shared_batches"]
