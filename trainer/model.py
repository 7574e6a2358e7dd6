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

from rolloutbus.errors import ConfigError, RolloutbusError
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


def save_policy(model: Any, tok: Tokenizer, directory: str | Path) -> Path:
    """``save_pretrained`` (safetensors) plus the tokenizer, into ``directory``."""
    _quiet()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    if isinstance(tok, CharTokenizer):
        tok.save(path)
    else:
        tok.hf.save_pretrained(str(path))
    return path


def load_policy(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple[Any, Tokenizer]:
    """Any local HF causal-LM directory → (model in eval mode, tokenizer). Never touches the network."""
    from transformers import AutoModelForCausalLM

    _quiet()
    p = Path(path)
    if not (p / "config.json").exists():
        raise ConfigError(f"{p} is not a model directory (no config.json); build one with trainer.model.build_tiny + save_policy")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a causal LM from {p}: {exc}") from exc
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


@torch.no_grad()
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
    """Sample continuations of several prompts at once (left padding + KV cache).

    ``max_new_tokens`` and ``temperature`` may differ per prompt (concurrent server requests); a
    temperature of 0 is greedy. A stop token is included in the returned ids (the trainer must learn
    to emit it) and ends that row.
    """
    n = len(prompts)
    if n == 0:
        return []
    max_new = [int(max_new_tokens)] * n if isinstance(max_new_tokens, int) else [int(x) for x in max_new_tokens]
    temps = [float(temperature)] * n if isinstance(temperature, (int, float)) else [float(x) for x in temperature]
    limit = max_positions(model)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ContextTooLong("empty prompt: give at least one token (e.g. <bos>)")
        if len(p) >= limit:
            raise ContextTooLong(f"prompt of {len(p)} tokens does not fit the model's {limit}-token context")
        max_new[i] = max(0, min(max_new[i], limit - len(p)))
    device = next(model.parameters()).device
    # Agents resend the same system prompt and examples: prefill their common prefix once, share its cache.
    shared = _common_prefix(prompts) if n > 1 else 0
    shared = min(shared, min(len(p) for p in prompts) - 1)
    past = None
    if shared >= MIN_SHARED_PREFIX:
        pre = torch.tensor([list(prompts[0][:shared])], dtype=torch.long, device=device)
        past = model(input_ids=pre, use_cache=True).past_key_values
        past.batch_repeat_interleave(n)
        prompts = [p[shared:] for p in prompts]
    else:
        shared = 0
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, shared + width), dtype=torch.long)
    attn[:, :shared] = 1
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        attn[i, shared + width - len(p) :] = 1
    ids, attn = ids.to(device), attn.to(device)
    # Padding sits between the shared prefix and each suffix: masked out, positions continue after it.
    pos = ((attn.cumsum(-1) - 1).clamp(min=0))[:, shared:]
    temp_t = torch.tensor([t if t > 0 else 1.0 for t in temps], device=device).unsqueeze(-1)
    greedy = torch.tensor([t <= 0 for t in temps], device=device)
    stops = set(int(s) for s in stop_ids)
    out: list[Generation] = [Generation([], [], "length") for _ in range(n)]
    done = [m == 0 for m in max_new]
    steps = max(max_new)
    out_model = model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=past, use_cache=True)
    past = out_model.past_key_values
    logits = out_model.logits[:, -1, :].float()
    last_pos = pos[:, -1:]
    for step in range(steps):
        if all(done):
            break
        logp = torch.log_softmax(logits / temp_t, dim=-1)
        sampled = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        nxt = torch.where(greedy, logits.argmax(-1), sampled)
        chosen_lp = logp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1).tolist()
        nxt_list = nxt.tolist()
        for i in range(n):
            if done[i]:
                continue
            out[i].token_ids.append(int(nxt_list[i]))
            out[i].logprobs.append(float(min(chosen_lp[i], 0.0)))
            if nxt_list[i] in stops:
                out[i].finish_reason = "stop"
                done[i] = True
            elif len(out[i].token_ids) >= max_new[i]:
                done[i] = True
        if all(done) or step == steps - 1:
            break
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=1)
        last_pos = last_pos + 1
        out_model = model(
            input_ids=nxt.unsqueeze(-1), attention_mask=attn, position_ids=last_pos, past_key_values=past, use_cache=True
        )
        past = out_model.past_key_values
        logits = out_model.logits[:, -1, :].float()
    return out


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
