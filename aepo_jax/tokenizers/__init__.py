"""Tokenizers behind one protocol (docs/interfaces.md): SentencePiece, Hugging Face
`tokenizer.json`, and the tokenizer embedded in a GGUF file."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from aepo_jax.tokenizers.chat import (
    CHATML,
    LLAMA3_CHAT,
    PLAIN_TEXT_CHAT,
    ChatFormat,
    Message,
    chat_format_from_template,
)
from aepo_jax.tokenizers.gguf_tokenizer import GGUFTokenizer
from aepo_jax.tokenizers.hf_tokenizer import HFTokenizer
from aepo_jax.tokenizers.sentencepiece_tokenizer import (
    SentencePieceTokenizer,
    train_sentencepiece,
)


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids, special ids and chat rendering (docs/interfaces.md)."""

    vocab_size: int
    eos_id: int
    pad_id: int
    bos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_to_id(self, piece: str) -> int | None: ...

    def apply_chat_template(self, messages: list[Message], add_generation_prompt: bool = True) -> list[int]: ...


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """The bytes each id decodes to alone (for stop strings matched on generated text)."""
    method = getattr(tokenizer, "token_bytes", None)
    if method is not None:
        return method()
    return [tokenizer.decode([i]).encode("utf-8") for i in range(tokenizer.vocab_size)]


def end_of_generation_ids(tokenizer: Tokenizer) -> list[int]:
    """Every id that ends a generation: the tokenizer's `eos_ids` when it has them, else its EOS."""
    return list(getattr(tokenizer, "eos_ids", None) or [tokenizer.eos_id])


def load_tokenizer(path: str | os.PathLike, *, add_agent_tokens: bool = False) -> Tokenizer:
    """Open a tokenizer by file type: `.model` (SentencePiece), `.gguf`, or
    `tokenizer.json` / a directory holding it (Hugging Face).

    `add_agent_tokens` registers the agent tags as special tokens on HF and
    GGUF tokenizers (ids may be appended past the base vocabulary); a
    SentencePiece model must already contain them (see `train_sentencepiece`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path does not exist: {path}")
    if path.suffix == ".model":
        tok = SentencePieceTokenizer(path)
        if add_agent_tokens:
            from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS

            missing = [t for t in AGENT_SPECIAL_TOKENS if tok.token_to_id(t) is None]
            if missing:
                raise ValueError(f"{path}: SentencePiece model lacks agent tags {missing}; "
                                 "retrain with train_sentencepiece(special_tokens=...)")
        return tok
    if path.suffix == ".gguf":
        return GGUFTokenizer(path, add_agent_tokens=add_agent_tokens)
    if path.is_dir() or path.suffix == ".json":
        return HFTokenizer.from_file(path, add_agent_tokens=add_agent_tokens)
    raise ValueError(f"unknown tokenizer file type: {path} (expected .model, .gguf, tokenizer.json or a directory)")


__all__ = [
    "CHATML",
    "LLAMA3_CHAT",
    "PLAIN_TEXT_CHAT",
    "ChatFormat",
    "GGUFTokenizer",
    "HFTokenizer",
    "Message",
    "SentencePieceTokenizer",
    "Tokenizer",
    "chat_format_from_template",
    "end_of_generation_ids",
    "load_tokenizer",
    "token_bytes",
    "train_sentencepiece",
]
