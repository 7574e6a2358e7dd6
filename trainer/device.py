"""Where the trainer runs: ``--device`` (cpu, cuda, cuda:N, auto), and its precision and micro-batch size there.

The device is checked before anything is loaded or bound, and each way it cannot work is one
:class:`~foundation.errors.ConfigError` line (exit status 2): CUDA asked for on a machine without it, a
device index past the visible GPUs.
"""

from __future__ import annotations

from typing import Any

from foundation.errors import ConfigError

_WHERE = "(--device / ROLLOUTBUS_TRAIN_DEVICE)"


def _no_cuda_reason() -> str:
    import torch

    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build"
    return f"torch {torch.__version__} sees no NVIDIA driver or GPU (is this a GPU node, and was the container given one?)"


def resolve_device(spec: str) -> Any:
    """``spec`` → a ``torch.device``. ``auto`` is the first GPU when one is visible, else the CPU."""
    import torch

    if spec == "cpu":
        return torch.device("cpu")
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if not spec.startswith("cuda"):
        raise ConfigError(f"device {spec!r} {_WHERE}: must be cpu, cuda, cuda:N or auto")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {spec} {_WHERE}: CUDA is not available: {_no_cuda_reason()}; use cpu or auto")
    count = torch.cuda.device_count()
    index = int(spec.partition(":")[2] or torch.cuda.current_device())
    if index >= count:
        raise ConfigError(f"device {spec} {_WHERE}: only {count} CUDA device{'s' if count != 1 else ''} visible "
                          f"(cuda:0 to cuda:{count - 1})")
    return torch.device("cuda", index)


# Measured by the GPU check (bench/results/gpu-2026-11-27.md): at 4096 padded tokens per micro-batch a step of
# the 135M model kept an H200 busy for under a third of its wall time (kernel launches of 30 narrow layers).
CPU_MICRO_BATCH_TOKENS = 4096
GPU_MICRO_BATCH_TOKENS = 16384


def micro_batch_tokens(setting: int, device: Any) -> int:
    """``--micro-batch-tokens``, where 0 is the device's default."""
    if setting:
        return setting
    return GPU_MICRO_BATCH_TOKENS if device.type == "cuda" else CPU_MICRO_BATCH_TOKENS


def resolve_precision(spec: str, device: Any) -> Any:
    """``--precision`` → the autocast dtype of the forward passes (None: float32 throughout)."""
    import torch

    if spec == "fp32":
        return None
    if spec == "bf16-mixed":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError(f"--precision bf16-mixed: {torch.cuda.get_device_name(device)} has no bfloat16; use fp32")
        return torch.bfloat16
    if spec != "auto":
        raise ConfigError(f"precision {spec!r} (--precision / ROLLOUTBUS_TRAIN_PRECISION): must be auto, fp32 or bf16-mixed")
    return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None


__all__ = ["micro_batch_tokens", "resolve_device", "resolve_precision"]
