"""LoRA (peft) for the trainer: adapters on the attention projections (``--lora-rank R``; ``--lora-targets`` names
others, or ``all-linear`` for every linear layer but the output head), the base weights frozen,
so AdamW holds state for the adapters only. What is published stays one HF directory of full weights (the
adapters merged: ``W + (alpha / r) · B A``), so every policy server loads a LoRA version as it loads any other;
beside them, in ``adapter/``, the adapters alone in peft's format with the directory of the weights they sit on
(``base_model_name_or_path``), which the policy servers load at run time without reloading the base
(``rolloutbus serve [--engine vllm] --lora-rank R``, :func:`reload_plan`: vLLM's runtime LoRA, the
torch server's :func:`read_adapter` deltas added to the base weights it keeps).
Resuming from such a checkpoint starts new adapters on the merged weights (the optimizer starts afresh): their base
is that checkpoint."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch-free at import: the vLLM gate plans its loads with reload_plan
    import torch

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL_LINEAR = "all-linear"  # peft's (and verl's default) name for every linear layer but the output head
ADAPTER_DIR = "adapter"  # in a LoRA checkpoint: the adapters alone, as peft saves them
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


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

    targets: str | list[str] = ALL_LINEAR if ALL_LINEAR in lora.targets else list(lora.targets)
    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


_PREFIX = "base_model.model."
# an adapter factor's name: ``<module>.lora_A.<adapter>.weight`` in a peft model's state, ``<module>.lora_A.weight`` as saved
_ADAPTER = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")


def _unprefixed(key: str) -> str:
    return key[len(_PREFIX):] if key.startswith(_PREFIX) else key


def merged_state_dict(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A peft model's state dict (``base_model.model.<name>``, ``<module>.base_layer.weight``, ``lora_A`` /
    ``lora_B``) as the base model's own: each adapted weight ``W + scaling · B A``, the names as the base model
    names them. Pure."""
    out = {_unprefixed(key).replace(".base_layer.", "."): value for key, value in state.items()
           if not _ADAPTER.match(_unprefixed(key))}
    for key, delta in adapter_deltas(state, scaling).items():
        out[key] = (out[key].float() + delta).to(out[key].dtype)
    return out


def adapter_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters of a peft model's state dict, named as peft saves them (``base_model.model.<module>.lora_A.weight``:
    the adapter's own name dropped), which peft's ``from_pretrained`` and vLLM load. Pure."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        m = _ADAPTER.match(_unprefixed(key))
        if m:
            out[f"{_PREFIX}{m['module']}.lora_{m['which']}.weight"] = value
    return out


def adapted_modules(state: dict[str, torch.Tensor]) -> list[str]:
    """The module names (``q_proj``, ``down_proj``...) that carry adapters in a peft model's state dict, sorted. Pure."""
    found = (_ADAPTER.match(_unprefixed(key)) for key in state)
    return sorted({m["module"].rsplit(".", 1)[-1] for m in found if m})


def adapter_config(lora: LoraSettings, base: str | None, modules: list[str] | None = None) -> dict[str, Any]:
    """peft's ``adapter_config.json`` for adapters trained with ``lora`` on the weights in directory ``base``, on
    ``modules`` (the names adapted: ``all-linear`` resolved, which vLLM needs; default ``lora.targets``). Pure."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
            "target_modules": modules or sorted(lora.targets), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "modules_to_save": None, "base_model_name_or_path": base}


def write_adapter(directory: Path, state: dict[str, torch.Tensor], lora: LoraSettings, base: str | None) -> Path:
    """``directory/adapter/``: the adapters of ``state`` (a peft model's, gathered whole) and their config."""
    from safetensors.torch import save_file

    out = directory / ADAPTER_DIR
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in adapter_state_dict(state).items()}
    if not tensors:
        raise ValueError("no LoRA adapters in the model's state")
    save_file(tensors, str(out / ADAPTER_WEIGHTS))
    (out / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(lora, base, adapted_modules(state)), indent=1, sort_keys=True))
    return out


def adapter_deltas(tensors: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """Adapters (as saved in ``adapter/``, ``base_model.model.<module>.lora_A.weight`` / ``lora_B``, or in a peft model's
    state) → for each adapted weight of the base model (``<module>.weight``) what they add to it: ``scaling · B A``, in
    float32; other tensors ignored. A module with one factor only is refused (ValueError). Pure."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        m = _ADAPTER.match(_unprefixed(key))
        if m:
            pairs.setdefault(m["module"], {})[m["which"]] = value
    out: dict[str, torch.Tensor] = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"adapter of {module} has lora_{''.join(ab)} only")
        out[f"{module}.weight"] = scaling * (ab["B"].float() @ ab["A"].float())
    return out


def read_adapter(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``directory`` (an ``adapter/`` as :func:`write_adapter` writes it) → (:func:`adapter_deltas` of its weights,
    its config). Reads the adapters alone, never the weights they sit on."""
    from safetensors.torch import load_file

    config = json.loads((directory / ADAPTER_CONFIG).read_text())
    rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    scaling = alpha / rank ** 0.5 if config.get("use_rslora") else alpha / rank
    return adapter_deltas(load_file(str(directory / ADAPTER_WEIGHTS)), scaling), config


def adapter_of(uri: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """A LoRA checkpoint's ``adapter/`` directory and its config; None when it has none."""
    d = Path(uri) / ADAPTER_DIR
    try:
        config = json.loads((d / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError):
        return None
    return (d, config) if isinstance(config, dict) and (d / ADAPTER_WEIGHTS).is_file() else None


def _same_dir(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def reload_plan(uri: str | Path, loaded: str | Path | None, max_rank: int) -> tuple[str, Path | None, str | None]:
    """How to serve checkpoint ``uri`` when the engine holds the full weights of directory ``loaded`` (None: not known,
    after a load that failed): ``("adapter",
    adapter dir, None)``, the adapters alone, when they sit on ``loaded``; ``("base", adapter dir, base dir)``, the
    adapters' base first (one full reload), when it is another directory still on disk; else ``("full", None, None)``,
    the checkpoint's merged weights (no LoRA: ``max_rank`` 0, no adapters, a rank above it, or adapters on their own
    checkpoint, which holds the base itself). Reads the adapter's config only."""
    found = adapter_of(uri) if max_rank > 0 else None
    if found is None:
        return ("full", None, None)
    adapter, config = found
    base = config.get("base_model_name_or_path")
    try:
        rank = int(config.get("r", 0))
    except (TypeError, ValueError):
        return ("full", None, None)
    if not isinstance(base, str) or not base or not 0 < rank <= max_rank or _same_dir(base, uri):
        return ("full", None, None)
    if loaded is not None and _same_dir(base, loaded):
        return ("adapter", adapter, None)
    if Path(base).is_dir():
        return ("base", adapter, base)
    return ("full", None, None)


def base_of(model: Any) -> Any:
    """The HF model under the peft wrapper (its config and ``save_pretrained`` write the merged weights)."""
    return model.get_base_model() if is_lora(model) else model


__all__ = ["ADAPTER_CONFIG", "ADAPTER_DIR", "ADAPTER_WEIGHTS", "ALL_LINEAR", "DEFAULT_TARGETS", "LoraSettings", "adapted_modules",
           "adapter_config", "adapter_deltas", "adapter_of", "adapter_state_dict", "apply_lora", "base_of", "is_lora",
           "merged_state_dict", "read_adapter", "reload_plan", "write_adapter"]
