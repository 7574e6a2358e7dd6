"""The policy: a Hugging Face causal LM from a local path, or the tiny one the project builds itself.

Nothing here downloads: :func:`build_tiny` makes a small Llama from a config and a seed, and
:func:`load_policy` reads any local HF causal-LM directory (``local_files_only``). Sampling
(:func:`generate`, :func:`generate_batch`) returns the response ids *and* their behaviour
log-probabilities — the log-softmax of the distribution actually sampled from (logits divided by the
temperature; greedy rows report the temperature-1 distribution) — which GRPO's importance ratio needs.

Typical use from Python::

    from trainer.model import build_tiny, save_policy, load_policy, generate
    model, tok = build_tiny(seed=0)
    save_policy(model, tok, "ckpt/base")
    model, tok = load_policy("ckpt/base")
    ids, logprobs = generate(model, tok, tok.apply_chat_template(msgs), max_new_tokens=32, temperature=1.0)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from foundation.errors import ConfigError, RolloutbusError
from trainer.tokenizer import CharTokenizer, Tokenizer, load_tokenizer

TINY_NAME = "rolloutbus-tiny"


class ContextTooLong(RolloutbusError):
    """A prompt does not fit the model's context window."""


@dataclass(frozen=True)
class TinyConfig:
    """Shape of the project's tiny policy (~0.5M parameters: a GRPO step on 32 samples is ~1 s on one core)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    max_positions: int = 1024
    seed: int = 0


def build_tiny(config: TinyConfig | None = None, seed: int | None = None) -> tuple[Any, CharTokenizer]:
    """A freshly initialised tiny ``LlamaForCausalLM`` and the project's char tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = config or TinyConfig()
    if seed is not None:
        cfg = TinyConfig(**{**asdict(cfg), "seed": seed})
    tok = CharTokenizer()
    hf_cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions,
        bos_token_id=tok.bos_id,
        eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id,
        tie_word_embeddings=True,
    )
    # Seeded CPU RNG scope, so building the model never disturbs the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(hf_cfg)
    model.config.rolloutbus_base_model = TINY_NAME
    model.eval()
    return model, tok


def _quiet() -> None:
    # Progress bars on every checkpoint would drown the trainer's own log lines.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def save_policy(model: Any, tok: Tokenizer, directory: str | Path, state_dict: dict[str, Any] | None = None) -> Path:
    """``save_pretrained`` (safetensors) plus the tokenizer, into ``directory``; ``state_dict``: the weights to write
    instead of the model's own (a sharded model's, gathered)."""
    _quiet()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    if state_dict is not None:
        model.save_pretrained(str(path), safe_serialization=True, state_dict=state_dict)
    else:
        model.save_pretrained(str(path), safe_serialization=True)
    if isinstance(tok, CharTokenizer):
        tok.save(path)
    else:
        tok.hf.save_pretrained(str(path))
    return path


def load_policy(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple[Any, Tokenizer]:
    """Any local HF causal-LM directory → (model in eval mode, tokenizer). Never touches the network. ``device``
    ``"meta"``: the model's shape only, no weight read or allocated (a rank that receives its shard from rank 0:
    :func:`trainer.distributed.fill_from_rank0`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _quiet()
    p = Path(path)
    if not (p / "config.json").exists():
        raise ConfigError(f"{p} is not a model directory (no config.json); build one with trainer.model.build_tiny + save_policy")
    try:
        if device == "meta":
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(p), local_files_only=True), dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a causal LM from {p}: {exc}") from exc
    if device != "meta":
        model.to(device)
    model.eval()
    return model, load_tokenizer(p)


def train_top_layers(model: Any, layers: int) -> int:
    """Freeze everything but the top ``layers`` decoder layers and the final norm; returns the trainable
    parameter count. Backward then stops at the lowest trained layer: on a CPU, training the top third
    of a model costs about half of a full step. ``layers <= 0`` trains every parameter."""
    if layers <= 0:
        return sum(p.numel() for p in model.parameters() if p.requires_grad)
    decoder = model.get_decoder()
    stack = getattr(decoder, "layers", None)
    if stack is None:
        raise ConfigError("--train-layers needs a decoder with a `layers` stack (Llama-style)")
    for p in model.parameters():
        p.requires_grad_(False)
    for module in [*list(stack)[-layers:], getattr(decoder, "norm", None)]:
        if module is not None:
            for p in module.parameters():
                p.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def base_model_name(model: Any, fallback: str = "") -> str:
    """The name recorded as ``base_model`` on published versions."""
    return str(getattr(model.config, "rolloutbus_base_model", None) or getattr(model.config, "_name_or_path", "") or fallback)


def max_positions(model: Any) -> int:
    return int(getattr(model.config, "max_position_embeddings", 2048) or 2048)


@dataclass
class Generation:
    """One sampled response: ids, behaviour log-probs (same length), and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


class ContinuousBatch:
    """Continuous batching over a plain Hugging Face KV cache: requests join and leave between decode steps.

    A static batch runs until its longest answer ends and keeps new requests waiting meanwhile; here a
    finished row leaves at once (its cache rows are dropped) and :meth:`admit` prefills newcomers and
    merges their cache into the running one (left padding, per-row positions), so one forward pass per
    step serves whoever is in flight — the scheduling vLLM does, on CPU-sized models.

    Prefix caching (vLLM's automatic prefix caching, in small): agents resend the same system prompt and
    examples, and an agent's next turn resends its previous turn. The KV of every finished request (its
    prompt and answer, unless ``keep_finished`` is off) and of each admission's common prefix is kept (the
    last ``keep_prefixes``); a
    newcomer reuses the longest kept prefix of its prompt and prefills only the rest. A reused prefix is
    the same computation, so answers do not change. Holds one model's state: make a new one after
    swapping weights. ``key`` is the caller's handle.
    """

    def __init__(self, model: Any, stop_ids: Sequence[int] = (), pad_id: int = 0, generator: torch.Generator | None = None,
                 keep_prefixes: int = 64, keep_finished: bool = True) -> None:
        if keep_prefixes < 1:
            raise ValueError("keep_prefixes must be >= 1")
        self.model, self.pad_id, self.generator = model, pad_id, generator
        self.keep_prefixes, self.keep_finished = keep_prefixes, keep_finished
        self.stops = set(int(s) for s in stop_ids)
        self.device = next(model.parameters()).device
        self.limit = max_positions(model)
        self._rows: list[_Row] = []
        self._cache: Any = None  # DynamicCache over the rows in flight
        self._attn = torch.zeros((0, 0), dtype=torch.long)
        self._prefixes: list[_Prefix] = []  # most recently used last

    def __len__(self) -> int:
        return len(self._rows)

    @torch.no_grad()
    def admit(self, requests: Sequence[tuple[Any, Sequence[int], int, float]]) -> list[tuple[Any, Generation | Exception]]:
        """Prefill ``(key, prompt_ids, max_new_tokens, temperature)`` requests and sample their first token.

        Returns the ones that are already finished (a stop token first, ``max_new_tokens`` 0) and, as
        :class:`ContextTooLong`, those that cannot run; the rest stay in flight for :meth:`step`.
        """
        done: list[tuple[Any, Generation | Exception]] = []
        todo: list[tuple[Any, list[int], int, float]] = []
        for key, prompt, max_new, temp in requests:
            p = [int(t) for t in prompt]
            if not p:
                done.append((key, ContextTooLong("empty prompt: give at least one token (e.g. <bos>)")))
            elif len(p) >= self.limit:
                done.append((key, ContextTooLong(f"prompt of {len(p)} tokens does not fit the model's {self.limit}-token context")))
            elif max_new <= 0:
                done.append((key, Generation([], [], "length")))
            else:
                todo.append((key, p, max(1, min(int(max_new), self.limit - len(p))), float(temp)))
        if not todo:
            return done
        prompts = [p for _, p, _, _ in todo]
        reuse = self._reuse(prompts)
        n, shared = len(todo), max(k for _, k in reuse)
        width = max(len(p) - k for p, (_, k) in zip(prompts, reuse))
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, shared + width), dtype=torch.long)
        for i, (p, (_, k)) in enumerate(zip(prompts, reuse)):
            attn[i, shared - k:shared] = 1
            ids[i, width - (len(p) - k):] = torch.tensor(p[k:], dtype=torch.long)
            attn[i, shared + width - (len(p) - k):] = 1
        past = None
        if shared:  # each row's reused prefix, left-padded to the longest
            from transformers import DynamicCache

            past = DynamicCache()
            layers = len(next(pre for pre, _ in reuse if pre is not None).keys)
            for layer in range(layers):
                keys = [_left_pad(pre.keys[layer][:, :, :k], shared) if pre else None for pre, k in reuse]  # type: ignore[union-attr]
                values = [_left_pad(pre.values[layer][:, :, :k], shared) if pre else None for pre, k in reuse]  # type: ignore[union-attr]
                like = next(t for t in keys if t is not None)
                past.update(torch.cat([t if t is not None else like.new_zeros(like.shape) for t in keys]),
                            torch.cat([t if t is not None else like.new_zeros(like.shape) for t in values]), layer)
        # Padding sits between each reused prefix and its suffix: masked out, positions continue after it.
        pos = ((attn.cumsum(-1) - 1).clamp(min=0))[:, shared:]
        out = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device), position_ids=pos.to(self.device),
                         past_key_values=past, use_cache=True, logits_to_keep=1)
        if any(getattr(layer, "is_sliding", False) for layer in out.past_key_values.layers):
            raise RolloutbusError("this model uses sliding-window attention, which this server's batching does not "
                                  "support: serve it with vLLM (`rolloutbus serve --engine vllm`; `make vllm` installs it)")
        rows = [_Row(key, m, t, Generation([], [], "length"), len(p), p) for (key, p, m, t) in todo]
        self._merge(rows, out.past_key_values, attn)
        return done + self._advance(out.logits[:, -1, :].float(), first=len(self._rows) - n)

    @torch.no_grad()
    def step(self) -> list[tuple[Any, Generation | Exception]]:
        """One decode step for every row in flight; returns the rows that finished."""
        if not self._rows:
            return []
        last = torch.tensor([[r.gen.token_ids[-1]] for r in self._rows], dtype=torch.long, device=self.device)
        pos = torch.tensor([[r.pos] for r in self._rows], dtype=torch.long, device=self.device)
        self._attn = torch.cat([self._attn, torch.ones((len(self._rows), 1), dtype=torch.long)], dim=1)
        out = self.model(input_ids=last, attention_mask=self._attn.to(self.device), position_ids=pos,
                         past_key_values=self._cache, use_cache=True)
        self._cache = out.past_key_values
        for r in self._rows:
            r.pos += 1
        return self._advance(out.logits[:, -1, :].float(), first=0)

    # ------------------------------------------------------------------ internals

    def _advance(self, logits: torch.Tensor, first: int) -> list[tuple[Any, Generation | Exception]]:
        """Sample the next token of rows ``first..`` from their logits; drop the rows that finish."""
        rows = self._rows[first:]
        temps = [r.temp for r in rows]
        temp_t = torch.tensor([t if t > 0 else 1.0 for t in temps], device=logits.device).unsqueeze(-1)
        greedy = torch.tensor([t <= 0 for t in temps], device=logits.device)
        logp = torch.log_softmax(logits / temp_t, dim=-1)
        nxt = logits.argmax(-1)
        if not bool(greedy.all()):  # inverse-CDF sampling: one uniform per row (multinomial costs ~15x more here)
            cdf = logp.exp().cumsum(-1)
            u = 1.0 - torch.rand((len(rows), 1), generator=self.generator, device=logits.device)  # in (0, 1]
            sampled = torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(-1).clamp(max=logits.shape[-1] - 1)
            nxt = torch.where(greedy, nxt, sampled)
        chosen = logp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1).tolist()
        finished: list[tuple[Any, Generation | Exception]] = []
        keep = list(range(first))
        for i, (r, tok_id, lp) in enumerate(zip(rows, nxt.tolist(), chosen)):
            r.gen.token_ids.append(int(tok_id))
            r.gen.logprobs.append(float(min(lp, 0.0)))
            if tok_id in self.stops:
                r.gen.finish_reason = "stop"
            if tok_id in self.stops or len(r.gen.token_ids) >= r.max_new:
                finished.append((r.key, r.gen))
                if self.keep_finished and len(r.gen.token_ids) > 1:  # its KV: the prompt and all but the last token
                    self._keep(self._row_prefix(first + i, r.prompt + r.gen.token_ids[:-1]))
            else:
                keep.append(first + i)
        if len(keep) < len(self._rows):
            self._select(keep)
        return finished

    def _reuse(self, prompts: list[list[int]]) -> list[tuple[_Prefix | None, int]]:
        """Per prompt, the kept prefix to reuse and how many of its tokens (at least one token is left to prefill)."""
        if len(prompts) > 1:  # newcomers that share more than any kept prefix: prefill what they share once
            shared = min(_common_prefix(prompts), min(len(p) for p in prompts) - 1)
            if shared >= MIN_SHARED_PREFIX and shared > max(self._match(prompts[0])[1], 0):
                ids = tuple(prompts[0][:shared])
                cache = self.model(input_ids=torch.tensor([ids], dtype=torch.long, device=self.device), use_cache=True,
                                   logits_to_keep=1).past_key_values
                self._keep(_Prefix(ids, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]))
        return [self._match(p) for p in prompts]

    def _match(self, prompt: list[int]) -> tuple[_Prefix | None, int]:
        best: tuple[_Prefix | None, int] = (None, 0)
        for pre in self._prefixes:
            k = min(_common_prefix([pre.ids, prompt]), len(prompt) - 1)
            if k > best[1]:
                best = (pre, k)
        if best[1] < MIN_SHARED_PREFIX:
            return None, 0
        self._prefixes.remove(best[0])  # type: ignore[arg-type]
        self._prefixes.append(best[0])  # type: ignore[arg-type]
        return best

    def _keep(self, prefix: _Prefix) -> None:
        """Keep ``prefix`` (most recent last); an older one it extends is dropped, the oldest beyond the limit too."""
        kept = [p for p in self._prefixes if prefix.ids[: len(p.ids)] != p.ids]
        self._prefixes = (kept + [prefix])[-self.keep_prefixes:]

    def _row_prefix(self, row: int, ids: list[int]) -> _Prefix:
        cols = self._attn[row].nonzero().squeeze(-1)
        cols = cols[-len(ids):]  # the row's own positions, padding left out
        keys = [layer.keys[row:row + 1, :, cols.to(layer.keys.device)] for layer in self._cache.layers]
        values = [layer.values[row:row + 1, :, cols.to(layer.values.device)] for layer in self._cache.layers]
        return _Prefix(tuple(ids), keys, values)

    def _merge(self, rows: list[_Row], cache: Any, attn: torch.Tensor) -> None:
        """Append newcomers' rows, cache and mask to the running batch, left-padding the shorter side."""
        if not self._rows:
            self._rows, self._cache, self._attn = rows, cache, attn
            return
        width = max(self._attn.shape[1], attn.shape[1])
        for old, new in zip(self._cache.layers, cache.layers):
            old.keys = torch.cat([_left_pad(old.keys, width), _left_pad(new.keys, width)], dim=0)
            old.values = torch.cat([_left_pad(old.values, width), _left_pad(new.values, width)], dim=0)
        self._attn = torch.cat([_left_pad_mask(self._attn, width), _left_pad_mask(attn, width)], dim=0)
        self._rows = self._rows + rows

    def _select(self, keep: list[int]) -> None:
        """Keep only rows ``keep``; drop cache columns that no remaining row attends to."""
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache, self._attn = None, torch.zeros((0, 0), dtype=torch.long)
            return
        idx = torch.tensor(keep, dtype=torch.long)
        attn = self._attn[idx]
        start = int(attn.any(dim=0).long().argmax())  # first column anyone still attends to
        self._attn = attn[:, start:]
        for layer in self._cache.layers:
            layer.keys = layer.keys[idx.to(layer.keys.device), :, start:, :]
            layer.values = layer.values[idx.to(layer.values.device), :, start:, :]


@dataclass
class _Row:
    key: Any
    max_new: int
    temp: float
    gen: Generation
    pos: int  # position id of the last sampled token
    prompt: list[int]


@dataclass
class _Prefix:
    """Kept KV of a token sequence (batch 1, per layer), reusable by any prompt that starts with some of it."""

    ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    extra = width - t.shape[2]
    return t if extra == 0 else torch.cat([t.new_zeros((t.shape[0], t.shape[1], extra, t.shape[3])), t], dim=2)


def _left_pad_mask(m: torch.Tensor, width: int) -> torch.Tensor:
    extra = width - m.shape[1]
    return m if extra == 0 else torch.cat([m.new_zeros((m.shape[0], extra)), m], dim=1)


def generate_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int | Sequence[int] = 64,
    temperature: float | Sequence[float] = 1.0,
    stop_ids: Sequence[int] = (),
    pad_id: int = 0,
    generator: torch.Generator | None = None,
) -> list[Generation]:
    """Sample continuations of several prompts at once (a :class:`ContinuousBatch` run to the end).

    ``max_new_tokens`` and ``temperature`` may differ per prompt (concurrent server requests); a
    temperature of 0 is greedy. A stop token is included in the returned ids (the trainer must learn
    to emit it) and ends that row.
    """
    n = len(prompts)
    max_new = [int(max_new_tokens)] * n if isinstance(max_new_tokens, int) else [int(x) for x in max_new_tokens]
    temps = [float(temperature)] * n if isinstance(temperature, (int, float)) else [float(x) for x in temperature]
    batch = ContinuousBatch(model, stop_ids, pad_id, generator, keep_finished=False)  # no next turn will reuse them
    results: dict[int, Generation] = {}
    finished = batch.admit([(i, p, m, t) for i, (p, m, t) in enumerate(zip(prompts, max_new, temps))])
    while True:
        for i, g in finished:
            if isinstance(g, Exception):
                raise g
            results[i] = g
        if not len(batch):
            break
        finished = batch.step()
    return [results[i] for i in range(n)]


MIN_SHARED_PREFIX = 16


def _common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    first, k = prompts[0], min(len(p) for p in prompts)
    for p in prompts[1:]:
        i = 0
        while i < k and p[i] == first[i]:
            i += 1
        k = i
    return k


def generate(
    model: Any,
    tok: Tokenizer,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[float]]:
    """Sample one response: ``(response_ids, behaviour_logprobs)``; stops at ``<|end|>``/``<eos>``."""
    g = generate_batch(
        model,
        [prompt_ids],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        stop_ids=tok.stop_ids,
        pad_id=tok.pad_id,
        generator=generator,
    )[0]
    return g.token_ids, g.logprobs


def sequence_logprobs(model: Any, prompt_ids: Sequence[int], response_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
    """Log-probs of ``response_ids`` after ``prompt_ids`` under ``model`` (one forward pass)."""
    from trainer.grpo import token_logprobs

    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], dtype=torch.long, device=device)
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids).logits, ids, temperature)
    return lp[0, len(prompt_ids) :].tolist()


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


__all__ = [
    "TINY_NAME",
    "TinyConfig",
    "ContextTooLong",
    "ContinuousBatch",
    "Generation",
    "base_model_name",
    "build_tiny",
    "generate",
    "generate_batch",
    "load_policy",
    "max_positions",
    "save_policy",
    "sequence_logprobs",
    "train_top_layers",
]
