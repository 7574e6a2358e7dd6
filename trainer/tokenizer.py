"""A character-level tokenizer the project defines itself (nothing to download).

Ids: ``0 <pad>``, ``1 <bos>``, ``2 <eos>``, ``3..7`` the chat markers ``<|system|> <|user|>
<|assistant|> <|tool|> <|end|>`` (one token each), then ``\\n`` and printable ASCII (space..~).
Characters outside that set encode as ``?`` (the tiny demo model only ever sees ASCII).

Chat format: ``<bos> <|role|> content <|end|> ... <|assistant|>``; the model ends its turn with
``<|end|>`` (or ``<eos>``), which are the stop tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from foundation.errors import ConfigError

TOKENIZER_FILE = "rolloutbus_tokenizer.json"
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
ROLES = ("system", "user", "assistant", "tool")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


class CharTokenizer:
    """Character tokenizer with single-token chat markers. ``len(tok)`` is the vocabulary size."""

    def __init__(self, specials: Sequence[str] = SPECIAL_TOKENS, chars: str = CHARS) -> None:
        self.specials = list(specials)
        self.chars = chars
        self.id_to_token = self.specials + list(chars)
        self._char_to_id = {c: i + len(self.specials) for i, c in enumerate(chars)}
        self._special_to_id = {t: i for i, t in enumerate(self.specials)}
        self.pad_id = self._special_to_id["<pad>"]
        self.bos_id = self._special_to_id["<bos>"]
        self.eos_id = self._special_to_id["<eos>"]
        self.end_id = self._special_to_id["<|end|>"]
        self._unknown = self._char_to_id.get("?", self.pad_id)

    def __len__(self) -> int:
        return len(self.id_to_token)

    @property
    def vocab_size(self) -> int:
        return len(self)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Tokens that end an assistant turn."""
        return (self.end_id, self.eos_id)

    def role_id(self, role: str) -> int:
        if role not in ROLES:
            raise ConfigError(f"unknown chat role {role!r}; expected one of {ROLES}")
        return self._special_to_id[f"<|{role}|>"]

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Text → ids, one per character (special-token spellings in ``text`` stay plain characters)."""
        ids = [self._char_to_id.get(c, self._unknown) for c in text]
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Ids → text. Special tokens are dropped unless ``skip_special=False``."""
        out = []
        n_special = len(self.specials)
        for i in ids:
            if 0 <= i < n_special:
                if not skip_special:
                    out.append(self.specials[i])
            elif n_special <= i < len(self.id_to_token):
                out.append(self.id_to_token[i])
        return "".join(out)

    def token_str(self, token_id: int) -> str:
        """One token's surface form (specials spelled out), as OpenAI-style logprobs report it."""
        return self.id_to_token[token_id] if 0 <= token_id < len(self.id_to_token) else ""

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """OpenAI-style messages → ids: ``<bos>`` then ``<|role|>content<|end|>`` per message, then ``<|assistant|>``."""
        ids = [self.bos_id]
        for m in messages:
            role = str(m.get("role", ""))
            content = m.get("content") or ""
            if isinstance(content, list):  # OpenAI content parts: keep the text ones
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            ids.append(self.role_id(role))
            ids.extend(self.encode(str(content)))
            ids.append(self.end_id)
        if add_generation_prompt:
            ids.append(self.role_id("assistant"))
        return ids

    def to_dict(self) -> dict[str, Any]:
        return {"type": "rolloutbus-char", "specials": self.specials, "chars": self.chars}

    def save(self, directory: str | Path) -> Path:
        """Write ``rolloutbus_tokenizer.json`` into ``directory`` (the model dir)."""
        path = Path(directory) / TOKENIZER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, directory: str | Path) -> "CharTokenizer":
        path = Path(directory) / TOKENIZER_FILE
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"no {TOKENIZER_FILE} in {directory}: not a rolloutbus tiny-model directory") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        if d.get("type") != "rolloutbus-char":
            raise ConfigError(f"{path}: unknown tokenizer type {d.get('type')!r}")
        return cls(d["specials"], d["chars"])


class HFTokenizerAdapter:
    """The same interface over a Hugging Face tokenizer from a local checkpoint (GPU users' models)."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.pad_id = hf.pad_token_id if hf.pad_token_id is not None else (hf.eos_token_id or 0)
        self.bos_id = hf.bos_token_id
        self.eos_id = hf.eos_token_id
        from trainer.model_import import end_of_turn_token

        eot = end_of_turn_token(hf)
        # The chat template's end of an assistant turn (``<|im_end|>``...): GGUF metadata may name another EOS.
        self.end_id = hf.convert_tokens_to_ids(eot) if eot else None

    def __len__(self) -> int:
        return len(self.hf)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(i for i in (self.end_id, self.eos_id) if i is not None))

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_bos))

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special))

    def token_str(self, token_id: int) -> str:
        return str(self.hf.decode([token_id]))

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        out = self.hf.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt, tokenize=True)
        if isinstance(out, Mapping):  # newer transformers return a BatchEncoding
            out = out["input_ids"]
        return list(out)


Tokenizer = CharTokenizer | HFTokenizerAdapter


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The project's tokenizer if the model dir has one, else the checkpoint's own HF tokenizer (local only)."""
    if (Path(directory) / TOKENIZER_FILE).exists():
        return CharTokenizer.load(directory)
    try:
        from transformers import AutoTokenizer

        return HFTokenizerAdapter(AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"no tokenizer in {directory}: {exc}") from exc


__all__ = ["CharTokenizer", "HFTokenizerAdapter", "Tokenizer", "load_tokenizer", "TOKENIZER_FILE", "SPECIAL_TOKENS"]
