"""The files a run starts from, fingerprinted: the pretrained weights (`model.checkpoint_dir`,
`model.gguf_path`) and a local task's questions and search corpus (`data.path`, `data.corpus_path`).

Their paths may change when a run resumes (a bucket mounted elsewhere, `launch.resume_check`), but their
contents may not: other weights behind `model.checkpoint_dir` change the reference model the KL terms
compare with, and another questions file or corpus changes what the run trains on from the restored data
position on. The run keeps the fingerprints in RUN_DIR/sources.json when it starts, and a resume compares.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from aepo_jax.file_digests import file_digest, sampled_file_digest

SOURCES_FILE = "sources.json"

# The files of a Hugging Face checkpoint folder that hold what the model computes (its tokenizer has its own
# check, `experiment_tokenizer`; a README or .gitattributes may change freely).
_CHECKPOINT_FILES = ("config.json", "model.safetensors.index.json")
_WEIGHT_SUFFIX = ".safetensors"


def run_source_paths(cfg: Any) -> dict[str, str]:
    """{config key: path} of the sources the run reads (as `experiment.environment_from` and
    `training.build` choose them: a GGUF policy reads no checkpoint_dir, a generated task no data.path)."""
    paths = {}
    if cfg.tokenizer.get("kind") == "gguf":
        if cfg.model.get("gguf_path"):
            paths["model.gguf_path"] = str(cfg.model.gguf_path)
    elif cfg.model.get("checkpoint_dir"):
        paths["model.checkpoint_dir"] = str(cfg.model.checkpoint_dir)
    if cfg.get("env") is None and cfg.data.get("path"):
        paths["data.path"] = str(cfg.data.path)
        if cfg.data.get("corpus_path"):
            paths["data.corpus_path"] = str(cfg.data.corpus_path)
    return paths


def fingerprint(path: str) -> dict[str, str]:
    """{file name: digest} of one source: a checkpoint folder's config and weight files (sampled digests:
    many GB), or one file (a GGUF file sampled; a JSONL read whole, as the run reads it whole anyway)."""
    if os.path.isdir(path):
        names = sorted(name for name in os.listdir(path)
                       if name in _CHECKPOINT_FILES or name.endswith(_WEIGHT_SUFFIX))
        return {name: sampled_file_digest(os.path.join(path, name)) for name in names}
    digest = sampled_file_digest(path) if path.endswith(".gguf") else file_digest(path, length=16)
    return {os.path.basename(path): digest}


def run_source_fingerprints(cfg: Any) -> dict[str, dict[str, str]]:
    """{config key: fingerprint} of every source the run reads that exists (a missing one is reported by
    whatever reads it, with its own message)."""
    return {key: fingerprint(path) for key, path in run_source_paths(cfg).items() if os.path.exists(path)}


def source_differences(saved: Mapping[str, Mapping[str, str]], current: Mapping[str, Mapping[str, str]]
                       ) -> list[str]:
    """One line per source whose files differ between the fingerprints a run saved and the current ones
    (a source that only one side reads is a difference too)."""
    lines = []
    for key in sorted(saved.keys() | current.keys()):
        if key not in current:
            lines.append(f"{key}: the run read {sorted(saved[key])}; this resume reads no such source")
        elif key not in saved:
            lines.append(f"{key}: this resume reads {sorted(current[key])}; the run read no such source")
        else:
            before, after = saved[key], current[key]
            changed = sorted(name for name in before.keys() & after.keys() if before[name] != after[name])
            gone, new = sorted(before.keys() - after.keys()), sorted(after.keys() - before.keys())
            parts = ([f"other contents in {changed}"] if changed else []) + \
                ([f"missing {gone}"] if gone else []) + ([f"new files {new}"] if new else [])
            if parts:
                lines.append(f"{key}: " + "; ".join(parts))
    return lines
