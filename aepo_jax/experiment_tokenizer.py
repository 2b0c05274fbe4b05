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
    init_run = init_checkpoint_run_dir(cfg)
    if path:
        tokenizer = load_tokenizer(path, add_agent_tokens=register_tags)
    elif not register_tags:
        raise ValueError("tokenizer.agent_tags='text' needs a tokenizer file (tokenizer.path): the SentencePiece "
                         "trained for a run always registers the agent tags")
    else:
        prefix = os.path.join(workdir, "tokenizer")
        if init_run is not None:  # the init run's own SentencePiece, never one trained anew
            adopt_run_tokenizer(init_run, workdir)
        if os.path.exists(prefix + ".model"):
            tokenizer = SentencePieceTokenizer(prefix + ".model")
        else:
            tokenizer = train_sentencepiece(texts(), int(cfg.tokenizer.vocab_size), model_prefix=prefix)
    if init_run is not None:
        check_same_tokenizer_as_run(tokenizer, init_run)
    elif path and _has_checkpoints(workdir):  # a resumed run given a tokenizer file (a bucket moved, say)
        check_same_tokenizer_as_run(tokenizer, workdir, whose="the resumed run")
    return tokenizer


def _has_checkpoints(run_dir: str) -> bool:
    from aepo_jax.training.checkpoint import step_folders

    return bool(step_folders(os.path.join(run_dir, "checkpoints"))[0])


def init_checkpoint_run_dir(cfg: ml_collections.ConfigDict) -> str | None:
    """The run directory of `model.init_checkpoint` (its tokenizer and config.json), None when unset or
    not known (a bare checkpoints folder)."""
    if not cfg.model.get("init_checkpoint"):
        return None
    from aepo_jax.evaluation.restore import locate_checkpoint

    return locate_checkpoint(cfg.model.init_checkpoint).run_dir


def adopt_run_tokenizer(run_dir: str, workdir: str) -> None:
    """Copy the SentencePiece a run trained (RUN_DIR/tokenizer.model) into `workdir`, which then uses it; a
    ValueError when the run has none (it used `tokenizer.path`: set the same) or `workdir` holds another."""
    source = os.path.join(run_dir, TOKENIZER_FILES[0])
    if not os.path.exists(source):
        raise ValueError(f"model.init_checkpoint's run {run_dir} has no {TOKENIZER_FILES[0]}: set tokenizer.path to "
                         "the tokenizer that run used (its config.json names it)")
    target = os.path.join(workdir, TOKENIZER_FILES[0])
    if not os.path.exists(target):
        os.makedirs(workdir, exist_ok=True)
        copy_tokenizer_files(run_dir, workdir)


def check_same_tokenizer_as_run(tokenizer: Any, run_dir: str, whose: str = "model.init_checkpoint's run") -> None:
    """A ValueError when `tokenizer` maps any id to other text than the tokenizer of the run in `run_dir`
    (its tokenizer.model, else its config's tokenizer.path): weights trained there would read every
    such id as another token. A run whose tokenizer cannot be rebuilt is only warned about. `whose` names
    that run in the messages (the init checkpoint's, or the run being resumed)."""
    import warnings

    reference = run_tokenizer(run_dir)
    if reference is None:
        warnings.warn(f"{whose} {run_dir}: its tokenizer cannot be rebuilt (no tokenizer.model, "
                      "and its config's tokenizer.path is gone), so this run's ids are not checked against it",
                      stacklevel=2)
        return
    ours, theirs = tokenizer_fingerprint(tokenizer), tokenizer_fingerprint(reference)
    if ours != theirs:
        differ = [name for name, a, b in zip(("vocab_size", "eos_id", "pad_id", "bos_id", "pieces"), ours, theirs,
                                              strict=True) if a != b]
        raise ValueError(f"this run's tokenizer differs from the one of {whose} {run_dir} "
                         f"({', '.join(differ)} differ): its weights would read these ids as other tokens; use "
                         "that run's tokenizer (tokenizer.path, or leave it unset to take its tokenizer.model)")


def run_tokenizer(run_dir: str) -> Any | None:
    """The tokenizer a run used: RUN_DIR/tokenizer.model, else its config.json's tokenizer.path (with its
    agent-tag setting); None when neither is there."""
    import json

    from aepo_jax.tokenizers import load_tokenizer

    trained = os.path.join(run_dir, TOKENIZER_FILES[0])
    if os.path.exists(trained):
        return load_tokenizer(trained)
    config_path = os.path.join(run_dir, "config.json")
    if not os.path.exists(config_path):
        return None
    with open(config_path, encoding="utf-8") as f:
        section = json.load(f).get("tokenizer", {})
    path = section.get("path") or ""
    if not path or not os.path.exists(path) or section.get("kind") == "gguf":
        return None
    return load_tokenizer(path, add_agent_tokens=section.get("agent_tags", "special") == "special")


def tokenizer_fingerprint(tokenizer: Any) -> tuple:
    """(vocab_size, eos_id, pad_id, bos_id, digest of every id's bytes): equal for tokenizers that encode
    and decode alike."""
    import hashlib

    from aepo_jax.tokenizers import token_bytes

    digest = hashlib.sha256()
    for piece in token_bytes(tokenizer):
        digest.update(len(piece).to_bytes(4, "little") + piece)
    return (int(tokenizer.vocab_size), tokenizer.eos_id, tokenizer.pad_id, tokenizer.bos_id, digest.hexdigest())


def agent_tags_registered(cfg: ml_collections.ConfigDict) -> bool:
    """Whether `tokenizer.agent_tags` registers the agent tags as tokens ("special", the default) or
    leaves them ordinary text ("text"); anything else is an error naming the setting."""
    mode = cfg.tokenizer.get("agent_tags", "special")
    if mode not in ("special", "text"):
        raise ValueError(f"tokenizer.agent_tags must be 'special' or 'text', got {mode!r}")
    return mode == "special"


def check_tokenizer_fits_checkpoint(tokenizer: Any, checkpoint_dir: str) -> None:
    """A ValueError, before any weight is read, when the tokenizer has ids (the agent tags appended past
    its base vocabulary, say) beyond the checkpoint's embedding rows: the embedding lookup would read NaN
    for them (`jnp.take` fills out-of-range rows), which spreads to every later position of the row, and the
    policy could never sample them."""
    from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
    from aepo_jax.models.hf_checkpoint import checkpoint_config

    rows = checkpoint_config(checkpoint_dir).vocab_size
    tag_ids = [tokenizer.token_to_id(tag) for tag in AGENT_SPECIAL_TOKENS]
    ids = max([tokenizer.vocab_size] + [i + 1 for i in tag_ids if i is not None])  # a count, or past the last tag
    if ids > rows:
        raise ValueError(f"the tokenizer has {ids} ids (the agent tags included) but the checkpoint "
                         f"{checkpoint_dir} has {rows} vocabulary rows: ids {rows} and up have no embedding (they "
                         "would read NaN into the rest of their row) and could never be sampled; use a checkpoint "
                         "whose vocabulary has room for the tags (Qwen's pads past its tokenizer) or a tokenizer "
                         "whose ids fit")
