"""The run's tokenizer, from its config, and its fit to a checkpoint's vocabulary. Part of the
composition root (`aepo_jax.experiment` builds the environment around it; a GGUF policy brings its
own tokenizer there)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ml_collections

# The files of a trained tokenizer, kept in a run's folder.
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.vocab")


def copy_tokenizer_files(source_dir: str, dest_dir: str) -> bool:
    """Copy a trained tokenizer's files from `source_dir` into `dest_dir`; returns whether its model
    file was there."""
    import shutil

    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(source_dir, name)):
            shutil.copyfile(os.path.join(source_dir, name), os.path.join(dest_dir, name))
    return os.path.exists(os.path.join(source_dir, TOKENIZER_FILES[0]))


def tokenizer_from(cfg: ml_collections.ConfigDict, workdir: str, texts: Callable[[], list[str]]) -> Any:
    """The tokenizer of `cfg.tokenizer` (kind "" or "hf"), with the agent tags.

    kind "hf": `tokenizer.path` is a Hugging Face tokenizer.json or its folder (the paper configs).
    kind "": `tokenizer.path` by its file type, else WORKDIR/tokenizer.model when it exists (a resumed
    or evaluated run), else a SentencePiece trained on `texts()` and kept there.
    """
    from aepo_jax.tokenizers import load_tokenizer
    from aepo_jax.tokenizers.sentencepiece_tokenizer import (
        SentencePieceTokenizer,
        train_sentencepiece,
    )

    kind, path = cfg.tokenizer.get("kind") or "", cfg.tokenizer.path
    if kind not in ("", "hf"):  # "gguf" is handled where its policy is loaded (`environment_from`)
        raise ValueError(f"tokenizer.kind {kind!r} is not supported; use '', 'hf' or 'gguf'")
    register_tags = agent_tags_registered(cfg)
    if kind == "hf":
        if not path:
            raise ValueError("tokenizer.kind='hf' needs tokenizer.path: a Hugging Face tokenizer.json or its folder")
        if not (os.path.isdir(path) or path.endswith(".json")):
            raise ValueError(f"tokenizer.kind='hf' needs a tokenizer.json or its folder, got tokenizer.path={path!r}")
    if path:
        return load_tokenizer(path, add_agent_tokens=register_tags)
    if not register_tags:
        raise ValueError("tokenizer.agent_tags='text' needs a tokenizer file (tokenizer.path): the SentencePiece "
                         "trained for a run always registers the agent tags")
    prefix = os.path.join(workdir, "tokenizer")
    if os.path.exists(prefix + ".model"):
        return SentencePieceTokenizer(prefix + ".model")
    return train_sentencepiece(texts(), int(cfg.tokenizer.vocab_size), model_prefix=prefix)


def agent_tags_registered(cfg: ml_collections.ConfigDict) -> bool:
    """Whether `tokenizer.agent_tags` registers the agent tags as tokens ("special", the default) or
    leaves them ordinary text ("text"); anything else is an error naming the setting."""
    mode = cfg.tokenizer.get("agent_tags", "special")
    if mode not in ("special", "text"):
        raise ValueError(f"tokenizer.agent_tags must be 'special' or 'text', got {mode!r}")
    return mode == "special"


def check_tokenizer_fits_checkpoint(tokenizer: Any, checkpoint_dir: str) -> None:
    """A ValueError, before any weight is read, when the tokenizer has ids (the agent tags appended past
    its base vocabulary, say) beyond the checkpoint's embedding rows: the embedding lookup would clamp
    them to the last row and the policy could never sample them."""
    from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
    from aepo_jax.models.hf_checkpoint import checkpoint_config

    rows = checkpoint_config(checkpoint_dir).vocab_size
    tag_ids = [tokenizer.token_to_id(tag) for tag in AGENT_SPECIAL_TOKENS]
    ids = max([tokenizer.vocab_size] + [i + 1 for i in tag_ids if i is not None])  # a count, or past the last tag
    if ids > rows:
        raise ValueError(f"the tokenizer has {ids} ids (the agent tags included) but the checkpoint "
                         f"{checkpoint_dir} has {rows} vocabulary rows: ids {rows} and up would be clamped to its "
                         "last row and could never be sampled; use a checkpoint whose vocabulary has room for the "
                         "tags (Qwen's pads past its tokenizer) or a tokenizer whose ids fit")
