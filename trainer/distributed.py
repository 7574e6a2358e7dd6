"""The trainer on several ranks: FSDP2 (``torch.distributed.fsdp.fully_shard``) over processes started by
``torchrun`` (``rolloutbus train --nproc-per-node N``), gloo on the CPU and NCCL on GPUs, nothing else changed.

Each decoder layer is its own FSDP unit and the root (embeddings, final norm, LM head: tied weights stay in one
unit) another, so a rank holds 1/N of the parameters, gradients and AdamW's state between steps and gathers one
layer at a time. A step is the single-device step (:meth:`trainer.torch_backend.TorchGRPOBackend.step`) on every
rank: the same groups, each rank the samples ``rank::world`` of the batch, the loss normalised by the whole
batch's counts (so the gradients FSDP reduces are the one-device gradients), every rank running as many
micro-batches as the busiest one (a rank with fewer runs zero-weight ones: FSDP's collectives stay in step).

Rank 0 alone talks to Kafka and ClickHouse (:mod:`trainer.loop`): it reads the step's groups, hands them to the
other ranks (:class:`Leader`, :func:`follow`), and commits offsets after the step as on one device. Checkpoints hold
the full weights (gathered once, for the policy servers, in the HF directory they load) and the optimizer state as
each rank holds it (``torch.distributed.checkpoint``: every rank writes its own shard, nothing is gathered), which
:func:`load_sharded_optimizer` reshards on load: a run resumes on any number of ranks, one process included. Over
several nodes the checkpoint directory is one every node writes to (a shared filesystem), as DCP needs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """This process's rank among ``world`` training processes."""

    rank: int
    world: int

    @property
    def main(self) -> bool:
        return self.rank == 0


def from_env(device: torch.device) -> Ranks | None:
    """The ranks torchrun started (``WORLD_SIZE`` > 1), the process group initialised (gloo on the CPU, NCCL on
    CUDA); None for one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size())


def shard(model: Any, *, mixed_precision: torch.dtype | None = None) -> Any:
    """``model`` sharded in place by FSDP2: each decoder layer, then the root. ``mixed_precision``: the dtype the
    gathered parameters compute in (gradients reduced in float32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=mixed_precision, reduce_dtype=torch.float32) if mixed_precision else MixedPrecisionPolicy()
    for layer in model.get_decoder().layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def fill_from_rank0(model: Any, full: Mapping[str, torch.Tensor], device: torch.device) -> None:
    """A sharded model whose weights only rank 0 read (``full``, its state before sharding; ``{}`` elsewhere, where
    the model was built on the meta device): every rank's shard filled from rank 0's weights, and the buffers
    (rotary frequencies, which no state dict carries) copied from rank 0. A collective. So N ranks on one machine
    hold one whole copy of the weights while loading, not N."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if dist.get_rank() != 0:
        model.to_empty(device=device)
    set_model_state_dict(model, dict(full), options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for _name, buf in sorted(model.named_buffers(), key=lambda nb: nb[0]):
        dist.broadcast(buf, src=0)


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The whole model's weights on the CPU (a collective: every rank calls it; rank 0's is the full one)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The optimizer's whole state, keyed by parameter name, on the CPU (a collective, as :func:`full_state_dict`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded_optimizer(model: Any, optimizer: Any, path: str | os.PathLike[str]) -> None:
    """The optimizer's state as this rank holds it, into the DCP directory ``path`` (a collective: every rank calls it
    with the same path; each writes its shard, rank 0 the metadata)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(path))


def load_sharded_optimizer(model: Any, optimizer: Any, path: str | os.PathLike[str]) -> None:
    """A state :func:`save_sharded_optimizer` wrote, on any number of ranks, into this process's optimizer: resharded
    to its ranks (a collective on several), or whole into one process's (no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    box = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the shapes to read into (a fresh AdamW's, zeros)
    with warnings.catch_warnings():  # one process: DCP says it assumes so, which is the point
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(box, checkpoint_id=str(path))
    set_optimizer_state_dict(model, optimizer, box["optimizer"])


def load_full_optimizer_state(model: Any, optimizer: Any, state: Mapping[str, Any]) -> None:
    """A full optimizer state (from any number of ranks) into this rank's shard of it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, dict(state), options=StateDictOptions(full_state_dict=True))


def trained_names(model: Any) -> list[str]:
    """The names of the parameters the optimizer holds, in its order (``model.parameters()`` that need a gradient)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def by_name(state: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state keyed by index (one device's ``state_dict()``) keyed by parameter name instead (as the
    sharded trainer's full state is); one already keyed by name as it is. Pure."""
    if all(isinstance(k, str) for k in state.get("state", {})) and all(
            isinstance(p, str) for g in state.get("param_groups", []) for p in g["params"]):
        return dict(state)
    return {"state": {names[int(k)]: v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]]}


def by_index(state: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """The reverse of :func:`by_name`: a state keyed by parameter name, keyed by the optimizer's indices. Pure."""
    if all(isinstance(p, int) for g in state.get("param_groups", []) for p in g["params"]):
        return dict(state)
    index = {n: i for i, n in enumerate(names)}
    missing = sorted({p for g in state["param_groups"] for p in g["params"]} - set(index))
    if missing:
        raise KeyError(f"the optimizer state names parameters this model does not train: {missing[:3]}")
    return {"state": {index[k]: v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[p] for p in g["params"]]} for g in state["param_groups"]]}


def all_reduce(values: dict[str, float], op: str = "sum") -> dict[str, float]:
    """``values`` reduced over the ranks (sum, max or min), as floats."""
    if not values:
        return {}
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return dict(zip(keys, t.tolist()))


def broadcast(obj: Any = None) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


STEP, GATHER, STOP = "step", "gather", "stop"


class Leader:
    """Rank 0's side: tells the other ranks what to do next, then does it too."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks

    def step(self, groups: list[Any], weights: list[float] | None) -> None:
        broadcast((STEP, groups, weights))

    def gather(self, optimizer_dir: str | os.PathLike[str]) -> None:
        """Every rank gathers the full weights, then writes its optimizer shard into ``optimizer_dir``."""
        broadcast((GATHER, str(optimizer_dir), None))

    def stop(self) -> None:
        broadcast((STOP, None, None))


def follow(backend: Any) -> int:
    """A rank other than 0: run each step and each gather (with its optimizer shard's save) rank 0 asks for, until it
    says stop. Returns the steps run."""
    steps = 0
    while True:
        what, groups, weights = broadcast()
        if what == STEP:
            backend.step(groups, weights)
            steps += 1
        elif what == GATHER:
            full_state_dict(backend.model)
            save_sharded_optimizer(backend.model, backend.optimizer, groups)
        else:
            return steps


__all__ = ["GATHER", "Leader", "Ranks", "STEP", "STOP", "all_reduce", "broadcast", "by_index", "by_name", "fill_from_rank0", "follow", "from_env", "full_optimizer_state",
           "full_state_dict", "is_sharded", "load_full_optimizer_state", "load_sharded_optimizer", "save_sharded_optimizer",
           "shard", "trained_names"]
