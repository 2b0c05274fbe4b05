"""The tokenizer embedded in a GGUF file's metadata (`tokenizer.ggml.*` keys).

GGUF stores a GPT-2 style byte-level BPE (SmolLM2, Qwen, Llama-3) as its
vocabulary, merges and token types plus a `pre` name for the pre-tokenizer.
We rebuild the equivalent `tokenizers` BPE and reuse `HFTokenizer` for the rest.
"""

from __future__ import annotations

import dataclasses
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


def read_gguf_file(path: str | os.PathLike):
    """A `gguf.GGUFReader` of `path`; a missing, directory or unreadable (corrupt, truncated) file
    raises naming the path: FileNotFoundError, IsADirectoryError or ValueError."""
    import gguf

    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; pass the .gguf file itself")
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as err:  # corrupt counts and offsets end up as IndexError
        raise ValueError(f"{path}: not a readable GGUF file: {type(err).__name__}: {err}") from err


@dataclasses.dataclass(frozen=True)
class _PreTokenizer:
    """How llama.cpp splits text for one `tokenizer.ggml.pre` value, and what else that value implies.

    Fields: `split`: the regex text is cut by (None: GPT-2's, built into `ByteLevel`); `digits`:
    isolate every `\\p{N}` character first; `nfc`: NFC-normalise first (the model's tokenizer.json
    does); `ignore_merges`: a piece that is itself a token is not merged from bytes (llama.cpp sets
    it for Llama-3, as Llama-3's tokenizer.json does); `add_bos`: prepend BOS, if the file has one,
    when the file does not say.
    """

    split: str | None = None
    digits: bool = False
    nfc: bool = False
    ignore_merges: bool = False
    add_bos: bool = False


def _contraction_split(numbers: str) -> str:
    """llama.cpp's split regex for Llama-3 and Qwen2 vocabularies (llama-vocab.cpp), which differ only
    in `numbers`, the most digits one piece holds. It is the regex of the models' tokenizer.json with
    the case-insensitive contractions `(?i:'s|'t|'re|'ve|'m|'ll|'d)` spelled out letter by letter."""
    contractions = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    return contractions + r"|[^\r\n\p{L}\p{N}]?\p{L}+|" + numbers + r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


LLAMA3_SPLIT = _contraction_split(r"\p{N}{1,3}")  # runs of up to three digits
QWEN2_SPLIT = _contraction_split(r"\p{N}")  # every digit alone

# `tokenizer.ggml.pre` -> its pre-tokenizer. "smollm" is SmolLM's own tokenizer.json pre-tokenizer:
# `Digits` isolates every `\p{N}` character (Nd, Nl and No: "²", "½" and "Ⅻ" as well as "7"), as
# llama.cpp's `\p{N}` pass does, before the GPT-2 regex. transformers' GGUF loader (5.24) skips that
# step and so tokenizes whitespace before a number differently (tests/test_tokenizers.py lists the
# cases). "qwen2" (Qwen2, Qwen2.5 and Qwen3 files) adds Qwen's NFC normaliser, which llama.cpp leaves
# out, so that a GGUF and the same checkpoint's tokenizer.json give the same ids.
PRE_TOKENIZERS = {
    "default": _PreTokenizer(),
    "gpt2": _PreTokenizer(),
    "smollm": _PreTokenizer(digits=True),
    "qwen2": _PreTokenizer(split=QWEN2_SPLIT, nfc=True),
    "llama-bpe": _PreTokenizer(split=LLAMA3_SPLIT, ignore_merges=True, add_bos=True),
    "llama3": _PreTokenizer(split=LLAMA3_SPLIT, ignore_merges=True, add_bos=True),
    "llama-v3": _PreTokenizer(split=LLAMA3_SPLIT, ignore_merges=True, add_bos=True),
}


def _pre_tokenizer(spec: _PreTokenizer):
    """The `tokenizers` pre-tokenizer of `spec`: its split, then the bytes spelt in the byte-level alphabet."""
    from tokenizers import Regex, pre_tokenizers

    if spec.split is not None:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(spec.split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if spec.digits:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


def _string_list(reader, key: str, path: Path, default=None) -> list[str]:
    value = gguf_field(reader, key, default)
    if value is None:
        raise ValueError(f"{path}: GGUF tokenizer has no {key}")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{path}: GGUF metadata {key} is not a list of strings")
    return value


class GGUFTokenizer(HFTokenizer):
    """The BPE tokenizer of a GGUF file, behind the `Tokenizer` protocol.

    Characters whose bytes the vocabulary lacks encode to nothing (SmolLM2
    lacks six ASCII control bytes and UTF-8 lead bytes F1/F2), as in
    `transformers`' GGUF loader. Every problem with the file raises ValueError
    naming it.

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
        from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

        self.path = path = Path(path)
        if reader is None:
            reader = read_gguf_file(path)
        kind = gguf_field(reader, "tokenizer.ggml.model")
        if kind is None:
            raise ValueError(f"{path}: GGUF file has no embedded tokenizer (tokenizer.ggml.model)")
        if kind != "gpt2":
            raise ValueError(f"{path}: GGUF tokenizer model {kind!r} is not supported (only 'gpt2' byte-level BPE)")
        pre = gguf_field(reader, "tokenizer.ggml.pre", "default")
        spec = PRE_TOKENIZERS.get(pre) if isinstance(pre, str) else None
        if spec is None:
            raise ValueError(f"{path}: GGUF tokenizer pre-tokenizer {pre!r} is not supported "
                             f"(supported: {', '.join(PRE_TOKENIZERS)})")
        tokens = _string_list(reader, "tokenizer.ggml.tokens", path)
        merges = _string_list(reader, "tokenizer.ggml.merges", path, [])
        types = gguf_field(reader, "tokenizer.ggml.token_type", [_NORMAL] * len(tokens))
        if not isinstance(types, list) or len(types) != len(tokens):
            raise ValueError(f"{path}: {len(tokens)} tokens but {len(types) if isinstance(types, list) else 'no'} "
                             f"token types")
        bad_merges = [m for m in merges if len(m.split(" ")) != 2]
        if bad_merges:
            raise ValueError(f"{path}: {len(bad_merges)} GGUF merge(s) are not two tokens apart by a space, "
                             f"e.g. {bad_merges[0]!r}")

        vocab = {token: idx for idx, token in enumerate(tokens)}
        try:
            bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], fuse_unk=False,
                             ignore_merges=spec.ignore_merges)
        except Exception as err:  # the Rust side raises plain Exception (e.g. a merge of unknown tokens)
            raise ValueError(f"{path}: GGUF vocabulary and merges do not form a BPE: {err}") from err
        backend = Tokenizer(bpe)
        if spec.nfc:
            backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = _pre_tokenizer(spec)
        backend.decoder = decoders.ByteLevel()
        # Control tokens (`<|im_start|>` ...) and user-defined ones match as whole strings.
        backend.add_tokens([
            AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
            for i in range(len(tokens))
            if types[i] in (_CONTROL, _USER_DEFINED)
        ])

        def special(key: str) -> str | None:
            idx = gguf_field(reader, f"tokenizer.ggml.{key}_token_id")
            if idx is None:
                return None
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < len(tokens):
                raise ValueError(f"{path}: tokenizer.ggml.{key}_token_id = {idx!r} is not one of the "
                                 f"{len(tokens)} token ids")
            return tokens[idx]

        eos = special("eos")
        if eos is None:
            raise ValueError(f"{path}: GGUF tokenizer has no tokenizer.ggml.eos_token_id")
        add_bos = gguf_field(reader, "tokenizer.ggml.add_bos_token")  # None: the pre-tokenizer's default
        bos = special("bos") if add_bos or (add_bos is None and spec.add_bos) else None
        if add_bos and bos is None:
            raise ValueError(f"{path}: the GGUF tokenizer adds BOS but has no tokenizer.ggml.bos_token_id")
        self.chat_template: str | None = gguf_field(reader, "tokenizer.chat_template")
        super().__init__(
            backend,
            eos_token=eos,
            bos_token=bos,
            pad_token=special("padding"),
            chat_format=chat_format or _known_format(self.chat_template, path),
            add_agent_tokens=add_agent_tokens,
        )
