"""SentencePiece tokenizers: loading a `.model` file and training a small BPE one.

The trained tokenizers round-trip any text (byte fallback, identity
normalisation, whitespace kept as is) and hold each agent tag as one id
(spec section 4), so stop sequences like `</search>` are a single token.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
from aepo_jax.tokenizers.chat import PLAIN_TEXT_CHAT, ChatFormat, Message

# Id layout of tokenizers trained here: pad first so zero-padding is inert.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_MARKER = "\u2581"  # SentencePiece's whitespace marker


class SentencePieceTokenizer:
    """A SentencePiece `.model` file behind the `Tokenizer` protocol.

    Args:
      model: path to a `.model` file, or its serialized bytes.
      chat_format: how chats render; defaults to plain-text role markers
        (`User: ...`, `Assistant: `) with EOS after each message.
    """

    def __init__(self, model: str | os.PathLike | bytes, chat_format: ChatFormat | None = None):
        if isinstance(model, bytes):
            self.model_proto = model
        else:
            path = Path(model)
            if not path.is_file():
                raise FileNotFoundError(f"SentencePiece model file not found: {path}")
            self.model_proto = path.read_bytes()
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self.model_proto)
        except RuntimeError as err:
            raise ValueError(f"not a valid SentencePiece model: {model!r:.200}: {err}") from err
        self.chat_format = chat_format or PLAIN_TEXT_CHAT
        self.vocab_size: int = self._sp.GetPieceSize()
        self.eos_id: int = self._sp.eos_id()
        if self.eos_id < 0:
            raise ValueError("SentencePiece model has no EOS piece; train it with eos_id >= 0")
        bos = self._sp.bos_id()
        self.bos_id: int | None = bos if bos >= 0 else None
        pad = self._sp.pad_id()
        self.pad_id: int = pad if pad >= 0 else self.eos_id
        # SentencePiece writes spaces as the marker U+2581, so a literal marker in
        # the input would decode as a space; encode it through its byte pieces.
        marker_bytes = [self.token_to_id(f"<0x{b:02X}>") for b in _MARKER.encode()]
        self._marker_ids = None if None in marker_bytes else marker_bytes

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no BOS/EOS added."""
        if _MARKER not in text or self._marker_ids is None:
            return list(self._sp.EncodeAsIds(text))
        parts = text.split(_MARKER)
        ids = list(self._sp.EncodeAsIds(parts[0]))
        for part in parts[1:]:
            ids += self._marker_ids + (list(self._sp.EncodeAsIds(part)) if part else [])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; control ids (pad, BOS, EOS) decode to nothing."""
        return self._sp.DecodeIds([int(i) for i in ids])

    def token_bytes(self) -> list[bytes]:
        """The bytes each id stands for inside a text: a byte piece as its byte (decoded alone, part of a
        multi-byte character reads as U+FFFD), the space marker as a space (a model with a dummy prefix
        drops it from a piece decoded alone), control ids as nothing."""
        def piece_bytes(idx: int) -> bytes:
            if self._sp.IsControl(idx):
                return b""
            piece = self._sp.IdToPiece(idx)
            if self._sp.IsByte(idx):
                return bytes([int(piece[3:5], 16)])  # "<0xHH>"
            if self._sp.IsUnknown(idx):
                return self._sp.DecodeIds([idx]).encode("utf-8")
            return piece.replace(_MARKER, " ").encode("utf-8")

        return [piece_bytes(i) for i in range(self.vocab_size)]

    def token_to_id(self, piece: str) -> int | None:
        """Id of a piece, or None if the vocabulary lacks it."""
        idx = self._sp.PieceToId(piece)
        if idx == self._sp.unk_id() and piece != self._sp.IdToPiece(idx):
            return None
        return idx

    def id_to_token(self, idx: int) -> str:
        return self._sp.IdToPiece(int(idx))

    def apply_chat_template(self, messages: list[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat rendered with `self.chat_format`."""
        return self.chat_format.render_ids(messages, add_generation_prompt, self.encode, self.eos_id)


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Sequence[str] = AGENT_SPECIAL_TOKENS,
    model_prefix: str | os.PathLike | None = None,
    *,
    chat_format: ChatFormat | None = None,
    split_digits: bool = True,
    max_sentence_length: int = 1 << 16,
) -> SentencePieceTokenizer:
    """Train a BPE SentencePiece tokenizer on `texts` (about a second for a few MB).

    Byte fallback plus identity normalisation and kept whitespace make
    `decode(encode(s)) == s` for any text.
    Each of `special_tokens` becomes one user-defined piece, matched in any text.
    Ids: pad 0, unk 1, BOS 2, EOS 3.

    Args:
      texts: training text, one document per item (newlines inside are fine).
      vocab_size: total pieces, including 256 byte pieces and the special tokens
        (an upper bound: a small corpus may yield fewer pieces; read `.vocab_size`).
      special_tokens: strings that must each encode to exactly one id.
      model_prefix: if given, also write `<model_prefix>.model` and `.vocab`.
      chat_format: passed to the returned tokenizer.
    """
    special_tokens = list(special_tokens)
    if len(set(special_tokens)) != len(special_tokens):
        raise ValueError(f"duplicate special tokens: {special_tokens}")
    minimum = 4 + 256 + len(special_tokens) + 1
    if vocab_size < minimum:
        raise ValueError(f"vocab_size {vocab_size} is too small: need at least {minimum} "
                         "(4 control ids, 256 byte pieces, the special tokens, one learned piece)")
    # SentencePiece reads sentences line by line; keep newlines inside documents
    # learnable by training on lines, and teach the newline through byte fallback.
    lines = [line for text in texts for line in text.split("\n") if line.strip()]
    if not lines:
        raise ValueError("train_sentencepiece needs non-empty training text")
    proto = io.BytesIO()
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(lines),
        model_writer=proto,
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        user_defined_symbols=special_tokens,
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        split_digits=split_digits,
        character_coverage=1.0,
        max_sentence_length=max_sentence_length,
        hard_vocab_limit=False,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        num_threads=1,
        minloglevel=2,
    )
    model_bytes = proto.getvalue()
    if model_prefix is not None:
        prefix = Path(model_prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{prefix}.model").write_bytes(model_bytes)
        tok = SentencePieceTokenizer(model_bytes)
        vocab_lines = (f"{tok.id_to_token(i)}\t{tok._sp.GetScore(i)}" for i in range(tok.vocab_size))
        Path(f"{prefix}.vocab").write_text("\n".join(vocab_lines) + "\n", encoding="utf-8")
    return SentencePieceTokenizer(model_bytes, chat_format=chat_format)
