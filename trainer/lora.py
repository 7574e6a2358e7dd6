"""LoRA (peft) for the trainer: adapters on the attention projections (``--lora-rank R``), the base weights frozen,
so AdamW holds state for the adapters only. What is published stays one HF directory of full weights (the
adapters merged: ``W + (alpha / r) · B A``), so every policy server loads a LoRA version as it loads any other.
Resuming from such a checkpoint starts new adapters on the merged weights (the optimizer starts afresh)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def apply_lora(model: Any, lora: LoraSettings) -> Any:
    """``model`` wrapped by peft with adapters of rank ``lora.rank`` on ``lora.targets``; only they train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.targets), lora_dropout=0.0, bias="none",
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


_PREFIX = "base_model.model."
_ADAPTER = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.(?P<adapter>[^.]+)\.weight$")


def merged_state_dict(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A peft model's state dict (``base_model.model.<name>``, ``<module>.base_layer.weight``, ``lora_A`` /
    ``lora_B``) as the base model's own: each adapted weight ``W + scaling · B A``, the names as the base model
    names them. Pure."""
    out: dict[str, torch.Tensor] = {}
    adapters: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        name = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
        m = _ADAPTER.match(name)
        if m:
            adapters.setdefault(m["module"], {})[m["which"]] = value
            continue
        out[name.replace(".base_layer.", ".")] = value
    for module, ab in adapters.items():
        key = f"{module}.weight"
        out[key] = (out[key].float() + scaling * (ab["B"].float() @ ab["A"].float())).to(out[key].dtype)
    return out


def base_of(model: Any) -> Any:
    """The HF model under the peft wrapper (its config and ``save_pretrained`` write the merged weights)."""
    return model.get_base_model() if is_lora(model) else model


__all__ = ["DEFAULT_TARGETS", "LoraSettings", "apply_lora", "base_of", "is_lora", "merged_state_dict"]
