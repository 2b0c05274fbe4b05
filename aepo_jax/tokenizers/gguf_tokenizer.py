"""The tokenizer embedded in a GGUF file's metadata (`tokenizer.ggml.*` keys).

GGUF stores a GPT-2 style byte-level BPE (SmolLM2, Qwen, Llama-3) as its
vocabulary, merges and token types plus a `pre` name for the pre-tokenizer.
We rebuild the equivalent `tokenizers` BPE and reuse `HFTokenizer` for the rest.
"""

from __future__ import annotations

import os
from pathlib import Path

from aepo_jax.tokenizers.chat import ChatFormat
from aepo_jax.tokenizers.hf_tokenizer import HFTokenizer, _known_format

# llama.cpp token types (gguf.TokenType).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def gguf_field(reader, key: str, default=None):
    """The value of metadata `key` (scalar, string or list), or `default` if absent."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _byte_level_pre_tokenizer(pre: str):
    r"""The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre == pre`.

    "smollm" is SmolLM's own tokenizer.json pre-tokenizer: `Digits` isolates
    every `\p{N}` character (Nd, Nl and No: "²", "½" and "Ⅻ" as well as "7"),
    as llama.cpp's `\p{N}` pass does, before the GPT-2 regex. transformers'
    GGUF loader (5.24) skips that step and so tokenizes whitespace before a
    number differently (tests/test_tokenizers.py lists the cases).
    """
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("gpt2", "default"):
        return byte_level
    if pre == "smollm":  # every digit on its own, then the GPT-2 split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise ValueError(f"GGUF tokenizer pre-tokenizer {pre!r} is not supported (supported: smollm, gpt2, default)")


class GGUFTokenizer(HFTokenizer):
    """The BPE tokenizer of a GGUF file, behind the `Tokenizer` protocol.

    Characters whose bytes the vocabulary lacks encode to nothing (SmolLM2
    lacks six ASCII control bytes and UTF-8 lead bytes F1/F2), as in
    `transformers`' GGUF loader.

    Args:
      path: the `.gguf` file.
      chat_format: overrides the chat format read from `tokenizer.chat_template`
        (a simple ChatML or Llama-3 template; others fall back to ChatML).
      add_agent_tokens: append the agent tags as special tokens (grows the
        vocabulary past the model's embedding; see `add_special_tokens`).
      reader: an already open `gguf.GGUFReader` of `path`, to avoid reopening.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        chat_format: ChatFormat | None = None,
        add_agent_tokens: bool = False,
        reader=None,
    ):
        import gguf
        from tokenizers import AddedToken, Tokenizer, decoders, models

        self.path = Path(path)
        if reader is None:
            if not self.path.is_file():
                raise FileNotFoundError(f"GGUF file not found: {self.path}")
            reader = gguf.GGUFReader(self.path)
        kind = gguf_field(reader, "tokenizer.ggml.model")
        if kind is None:
            raise ValueError(f"{self.path}: GGUF file has no embedded tokenizer (tokenizer.ggml.model)")
        if kind != "gpt2":
            raise ValueError(f"{self.path}: GGUF tokenizer model {kind!r} is not supported (only 'gpt2' byte-level BPE)")
        tokens: list[str] = gguf_field(reader, "tokenizer.ggml.tokens")
        merges: list[str] = gguf_field(reader, "tokenizer.ggml.merges", [])
        types: list[int] = gguf_field(reader, "tokenizer.ggml.token_type", [_NORMAL] * len(tokens))
        if len(types) != len(tokens):
            raise ValueError(f"{self.path}: {len(tokens)} tokens but {len(types)} token types")

        vocab = {token: idx for idx, token in enumerate(tokens)}
        merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
        backend = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False))
        backend.pre_tokenizer = _byte_level_pre_tokenizer(gguf_field(reader, "tokenizer.ggml.pre", "default"))
        backend.decoder = decoders.ByteLevel()
        # Control tokens (`<|im_start|>` ...) and user-defined ones match as whole strings.
        backend.add_tokens([
            AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
            for i in range(len(tokens))
            if types[i] in (_CONTROL, _USER_DEFINED)
        ])

        def special(key: str) -> str | None:
            idx = gguf_field(reader, f"tokenizer.ggml.{key}_token_id")
            return None if idx is None else tokens[int(idx)]

        eos = special("eos")
        if eos is None:
            raise ValueError(f"{self.path}: GGUF tokenizer has no tokenizer.ggml.eos_token_id")
        add_bos = bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False))
        self.chat_template: str | None = gguf_field(reader, "tokenizer.chat_template")
        super().__init__(
            backend,
            eos_token=eos,
            bos_token=special("bos") if add_bos else None,
            pad_token=special("padding"),
            chat_format=chat_format or _known_format(self.chat_template, self.path),
            add_agent_tokens=add_agent_tokens,
        )
