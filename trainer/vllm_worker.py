"""vLLM worker extension: load a published checkpoint into the running engine (CPU and GPU alike).

Runs inside vLLM's worker processes, in vLLM's own virtualenv, so it imports only the standard library,
torch and safetensors (vLLM's dependencies), never the project's other modules. Start the engine with
``--worker-extension-cls trainer.vllm_worker.RolloutbusWorkerExtension``; each tensor-parallel worker
then answers ``collective_rpc("rolloutbus_load_checkpoint", args=(uri,))``.

One code path, ``model_runner.reload_weights(weights_iterator=...)``: vLLM's in-place reload, which
handles fused and sharded parameters and re-runs the backend's post-load processing. The older
``model_runner.model.load_weights(...)`` fails on the CPU backend, which repacks linear weights after
loading (``Attempted to load weight (torch.Size([576, 1536])) into parameter (torch.Size([0]))``).
The caller checks the checkpoint's names and shapes before (:func:`trainer.vllm_serve.checkpoint_problem`):
a reload that fails half-way would leave a mix of two versions in the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def checkpoint_files(uri: str) -> list[Path]:
    """The checkpoint's ``*.safetensors`` files, sorted; a directory without any is an error."""
    files = sorted(Path(uri).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {uri}")
    return files


def checkpoint_weights(files: list[Path]) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of every tensor in ``files``, read one at a time."""
    from safetensors.torch import safe_open

    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for name in fh.keys():
                yield name, fh.get_tensor(name)


class RolloutbusWorkerExtension:
    """Mixed into vLLM's worker class by ``--worker-extension-cls``."""

    model_runner: Any  # provided by vLLM's worker

    def rolloutbus_load_checkpoint(self, uri: str) -> int:
        """Reload the engine's weights from checkpoint directory ``uri``; the number of tensors read."""
        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in checkpoint_weights(checkpoint_files(uri)):
                count += 1
                yield item

        self.model_runner.reload_weights(weights_iterator=counted())
        return count


__all__ = ["RolloutbusWorkerExtension", "checkpoint_files", "checkpoint_weights"]
