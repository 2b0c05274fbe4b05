"""Hugging Face checkpoint export: `Decoder` -> `config.json` + `model.safetensors` that transformers loads
(the inverse of `hf_checkpoint`'s import, through its one layout table), from one process or several."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from aepo_jax.atomic_write import write_file_atomically
from aepo_jax.models.config import config_to_hf
from aepo_jax.models.decoder import Decoder
from aepo_jax.models.hf_checkpoint import _grouped_layout, _param_at, _to_hf


def _whole_on_host(value: jax.Array) -> np.ndarray:
    """`value` whole, as a host array: gathered from the other processes when they hold some of its shards
    (a collective then: every process calls it, in the same order)."""
    if getattr(value, "is_fully_addressable", True):
        return np.asarray(jax.device_get(value))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def hf_tensors_from_model(model: Decoder) -> dict[str, np.ndarray]:
    """HF-named, HF-layout host copies of every weight (the inverse of `model_from_hf_tensors`).

    A model sharded over several processes is gathered: every process must call this, and each gets the
    whole model on its host."""
    tensors = {}
    for path, entries in _grouped_layout(model.config).items():
        value = _whole_on_host(_param_at(model, path)[...])
        for name, _, in_axes, layer in entries:
            tensors[name] = _to_hf(value if layer is None else value[layer], in_axes)
    return tensors


def save_hf_checkpoint(model: Decoder, path: str | Path, *, bos_id: int | None = None,
                       eos_ids: Sequence[int] = ()) -> None:
    """Writes `config.json`, `generation_config.json` and `model.safetensors` that
    `transformers.AutoModelForCausalLM` loads. A model sharded over several processes is gathered
    (every process calls this) and written by the first process only.

    Args:
      bos_id / eos_ids: the tokenizer's BOS id and the ids that end a generation (`eos_ids` of the
        project's tokenizers). Written to both JSON files so that transformers' `generate` stops where
        ours does; unknown ones are written as null, not left to transformers' class defaults
        (Llama's 1 and 2, wrong for Llama-3's vocabulary, where 2 is an ordinary token).
    """
    eos = [int(i) for i in eos_ids]
    bad = [i for i in [*eos, *([] if bos_id is None else [bos_id])] if not 0 <= i < model.config.vocab_size]
    if bad:
        raise ValueError(f"special token ids {bad} are outside the model's {model.config.vocab_size} ids")
    special = {"bos_token_id": bos_id, "eos_token_id": (eos[0] if len(eos) == 1 else eos) or None}
    tensors = hf_tensors_from_model(model)  # every process takes part when the model spans several
    if jax.process_index() != 0:
        return
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    # Each file is written beside its name and renamed into place, config.json last: a save cut short
    # leaves no half-written file, and without config.json the folder is not taken for a checkpoint.
    write_file_atomically(str(directory / "model.safetensors"),
                          lambda f: save_file(tensors, f, metadata={"format": "pt"}))
    for name, content in (("generation_config.json", special), ("config.json", {**config_to_hf(model.config),
                                                                               **special})):
        write_file_atomically(str(directory / name),
                              lambda f, c=content: Path(f).write_text(json.dumps(c, indent=2) + "\n"))
