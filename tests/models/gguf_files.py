"""Small synthetic GGUF files for the GGUF loading tests: random weights, a byte-level vocabulary,
and knobs to make each kind of bad file (numpy only; no transformers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def byte_level_tokens() -> list[str]:
    """The 256 byte-level BPE characters, then `<|im_end|>` (a control token, the EOS)."""
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet()) + ["<|im_end|>"]


def layer_shapes(arch: str, d_model: int, n_heads: int, n_kv: int, head_dim: int, mlp: int,
                 layers: int) -> dict[str, tuple[int, ...]]:
    """GGUF name -> HF-order shape `[out, in]` of every per-layer tensor of `arch`."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(layers):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (d_model,), f"blk.{i}.attn_q.weight": (n_heads * head_dim, d_model),
            f"blk.{i}.attn_k.weight": (n_kv * head_dim, d_model), f"blk.{i}.attn_v.weight": (n_kv * head_dim, d_model),
            f"blk.{i}.attn_output.weight": (d_model, n_heads * head_dim), f"blk.{i}.ffn_norm.weight": (d_model,),
            f"blk.{i}.ffn_gate.weight": (mlp, d_model), f"blk.{i}.ffn_up.weight": (mlp, d_model),
            f"blk.{i}.ffn_down.weight": (d_model, mlp),
        })
        if arch == "qwen2":
            shapes.update({f"blk.{i}.attn_{p}.bias": ((n_heads if p == "q" else n_kv) * head_dim,) for p in "qkv"})
        if arch == "qwen3":
            shapes.update({f"blk.{i}.attn_{p}_norm.weight": (head_dim,) for p in "qk"})
    return shapes


def write_gguf(
    path: str | Path,
    *,
    arch: str = "llama",
    d_model: int = 32,
    n_heads: int = 4,
    n_kv: int = 2,
    head_dim: int = 8,
    mlp: int = 48,
    layers: int = 2,
    tokens: Sequence[str] | None = None,
    token_types: Sequence[int] | None = None,
    merges: Sequence[str] = (),
    pre: str = "default",
    embed_rows: int | None = None,
    qtype: Any = None,
    raw_types: Mapping[str, Any] = {},
    dtypes: Mapping[str, Any] = {},
    shapes: Mapping[str, tuple[int, ...]] = {},
    drop: Sequence[str] = (),
    metadata: Sequence[tuple[str, str, Any]] = (),
    tensors: bool = True,
    seed: int = 0,
) -> Path:
    """Write a GGUF of `arch` with random weights; returns `path`.

    Args:
      tokens / token_types / merges / pre: the tokenizer (default: `byte_level_tokens()`, all normal but
        the last, a control token and the EOS).
      embed_rows: rows of `token_embd.weight` (default: one per token).
      qtype: quantise every 2-D tensor to this `gguf.GGMLQuantizationType` (None: float32).
      raw_types: tensor name -> a type whose bytes are written as zeros (types nothing can dequantise).
      dtypes: tensor name -> numpy dtype to store it as (e.g. float64).
      shapes / drop: override or leave out tensors (GGUF names, HF-order shapes).
      metadata: `(writer method, key, value)` calls made last, overriding the standard keys.
      tensors: False writes the metadata only (enough for a tokenizer).
    """
    import gguf

    rng = np.random.default_rng(seed)
    tokens = list(byte_level_tokens() if tokens is None else tokens)
    types = list([1] * (len(tokens) - 1) + [3] if token_types is None else token_types)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_context_length(64)
    writer.add_embedding_length(d_model)
    writer.add_feed_forward_length(mlp)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(5000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(merges))
    writer.add_eos_token_id(types.index(3) if 3 in types else len(tokens) - 1)
    for method, key, value in metadata:
        getattr(writer, method)(key, value)
    all_shapes = {"token_embd.weight": (embed_rows or len(tokens), d_model), "output_norm.weight": (d_model,)}
    all_shapes.update(layer_shapes(arch, d_model, n_heads, n_kv, head_dim, mlp, layers))
    all_shapes.update(shapes)
    for name, shape in all_shapes.items() if tensors else ():
        if name in drop:
            continue
        values = (0.2 * rng.normal(size=shape)).astype(np.float32)
        if name in raw_types:
            block, type_size = gguf.GGML_QUANT_SIZES[raw_types[name]]
            raw = np.zeros((*shape[:-1], shape[-1] // block * type_size), np.uint8)
            writer.add_tensor(name, raw, raw_dtype=raw_types[name])
        elif name in dtypes:
            writer.add_tensor(name, values.astype(dtypes[name]))
        elif qtype is not None and len(shape) == 2:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
