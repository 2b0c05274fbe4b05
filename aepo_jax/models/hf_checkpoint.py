"""Hugging Face checkpoint import/export: `config.json` + `*.safetensors` <-> `Decoder`, without PyTorch.

HF stores linear weights as `[out_features, in_features]` with heads flattened
into one axis; our parameters are `[in, out]` with explicit head axes (e.g.
q_proj `[D, H, Dh]`, o_proj `[H, Dh, D]`). `_tensor_layout` is the one table of
that correspondence, used both ways.

Safetensors files are read by parsing their header and memory-mapping the
data with numpy: `safetensors.numpy` cannot represent bfloat16 (the dtype of
most released checkpoints), and memory-mapping lets `load_hf_checkpoint(...,
mesh=...)` place each tensor straight onto its shards without holding the
whole checkpoint in host memory.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from aepo_jax.models.config import ModelConfig, config_from_hf, config_to_hf
from aepo_jax.models.decoder import Decoder

SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}

# (HF tensor name, attribute path in `Decoder`, number of leading axes of our
# parameter that form HF's `in_features` axis; None: not a linear weight, HF
# stores it flattened to 1-D (norm scales, biases); KEEP: same shape both sides;
# layer index into the stacked `[L, ...]` parameter, or None for a global one).
KEEP = "keep"
TensorEntry = tuple[str, tuple[str, ...], int | str | None, int | None]


def _tensor_layout(config: ModelConfig) -> list[TensorEntry]:
    """Every HF tensor of `config`'s architecture and where it lives in our model."""
    entries: list[TensorEntry] = [("model.embed_tokens.weight", ("embed",), KEEP, None)]
    attn = ("layers", "attention")
    per_layer: list[tuple[str, tuple[str, ...], int | str | None]] = [
        ("input_layernorm.weight", ("layers", "attention_norm", "scale"), None),
        ("self_attn.q_proj.weight", (*attn, "q_proj"), 1),
        ("self_attn.k_proj.weight", (*attn, "k_proj"), 1),
        ("self_attn.v_proj.weight", (*attn, "v_proj"), 1),
        ("self_attn.o_proj.weight", (*attn, "o_proj"), 2),
        ("post_attention_layernorm.weight", ("layers", "mlp_norm", "scale"), None),
        ("mlp.gate_proj.weight", ("layers", "mlp", "gate"), 1),
        ("mlp.up_proj.weight", ("layers", "mlp", "up"), 1),
        ("mlp.down_proj.weight", ("layers", "mlp", "down"), 1),
    ]
    if config.qkv_bias:
        per_layer += [(f"self_attn.{p}_proj.bias", (*attn, f"{p}_bias"), None) for p in "qkv"]
    if config.qk_norm:
        per_layer += [(f"self_attn.{p}_norm.weight", (*attn, f"{p}_norm", "scale"), None) for p in "qk"]
    for i in range(config.n_layers):
        entries += [(f"model.layers.{i}.{name}", path, in_axes, i) for name, path, in_axes in per_layer]
    entries.append(("model.norm.weight", ("final_norm", "scale"), None, None))
    if not config.tie_embeddings:
        entries.append(("lm_head.weight", ("lm_head",), 1, None))
    return entries


def _param_at(model: Decoder, path: tuple[str, ...]) -> nnx.Param:
    node: Any = model
    for key in path:
        node = getattr(node, key)
    return node


def _hf_shape(shape: tuple[int, ...], in_axes: int | str | None) -> tuple[int, ...]:
    """HF's shape for one of our (per-layer) parameters: `[out, in]` for linears, flat for vectors."""
    if in_axes == KEEP:
        return shape
    if in_axes is None:
        return (int(np.prod(shape)),)
    return (int(np.prod(shape[in_axes:])), int(np.prod(shape[:in_axes])))


def _from_hf(name: str, array: np.ndarray, shape: tuple[int, ...], in_axes: int | str | None) -> np.ndarray:
    expected = _hf_shape(shape, in_axes)
    if tuple(array.shape) != expected:
        raise ValueError(f"tensor {name!r} has shape {tuple(array.shape)}, the config implies {expected}")
    return (array if in_axes in (None, KEEP) else array.T).reshape(shape)


def _to_hf(array: np.ndarray, in_axes: int | str | None) -> np.ndarray:
    shape = _hf_shape(array.shape, in_axes)
    if in_axes in (None, KEEP):
        return array.reshape(shape)
    return np.ascontiguousarray(array.reshape(shape[1], shape[0]).T)


def _grouped_layout(config: ModelConfig) -> dict[tuple[str, ...], list[TensorEntry]]:
    """The layout grouped by parameter: a global parameter has one entry, a stacked one L (in layer order)."""
    groups: dict[tuple[str, ...], list[TensorEntry]] = {}
    for entry in _tensor_layout(config):
        groups.setdefault(entry[1], []).append(entry)
    return groups


def model_from_hf_tensors(
    config: ModelConfig,
    tensors: Mapping[str, np.ndarray],
    dtype: Any = jnp.float32,
    param_dtype: Any = None,
    mesh: jax.sharding.Mesh | None = None,
    remat: str | None = None,
    attention: str | None = None,
) -> Decoder:
    """A `Decoder` whose weights are HF-named, HF-layout `tensors` (e.g. `model.layers.0.self_attn.q_proj.weight`).

    The model is built abstractly (no random init) and each parameter is filled
    from its tensor(s) (per-layer tensors stacked along the leading layer
    axis), cast to `param_dtype` (default `dtype`) and, with a `mesh`, placed
    on its shards by the logical-axis rules. `remat` and `attention` override
    the config's rematerialisation and attention backend (run-time choices a
    checkpoint does not carry). Extra tensors (e.g. an `lm_head.weight` copy
    of tied embeddings) are ignored; missing ones raise.
    """
    from aepo_jax.parallel.sharding import named_sharding

    param_dtype = dtype if param_dtype is None else param_dtype
    run_time = {k: v for k, v in (("remat", remat), ("attention", attention)) if v is not None}
    config = config.replace(dtype=dtype, param_dtype=param_dtype, **run_time)
    missing = [name for name, _, _, _ in _tensor_layout(config) if name not in tensors]
    if missing:
        shown = ", ".join(missing[:20]) + (f", ... ({len(missing)} in all)" if len(missing) > 20 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s) the config needs: {shown}")
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    for path, entries in _grouped_layout(config).items():
        param = _param_at(model, path)
        stacked = entries[0][3] is not None
        shape = tuple(param.shape[1:] if stacked else param.shape)
        pieces = [_from_hf(name, np.asarray(tensors[name]), shape, in_axes).astype(param.dtype)
                  for name, _, in_axes, _ in entries]
        host = np.stack(pieces) if stacked else pieces[0]  # [L, ...] for per-layer tensors
        del pieces
        if mesh is None:
            param.set_value(jnp.asarray(host))
        else:
            # Each process materialises only the shards its own devices hold (multi-host safe).
            sharding = named_sharding(param.get_metadata("out_sharding"), host.shape, mesh)
            param.set_value(jax.make_array_from_callback(host.shape, sharding, lambda index, host=host: host[index]))
    return model


def hf_tensors_from_model(model: Decoder) -> dict[str, np.ndarray]:
    """HF-named, HF-layout host copies of every weight (the inverse of `model_from_hf_tensors`)."""
    tensors = {}
    for path, entries in _grouped_layout(model.config).items():
        value = np.asarray(jax.device_get(_param_at(model, path)[...]))
        for name, _, in_axes, layer in entries:
            tensors[name] = _to_hf(value if layer is None else value[layer], in_axes)
    return tensors


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Memory-mapped numpy views of every tensor in one `.safetensors` file (bfloat16 via ml_dtypes)."""
    path = Path(path)
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        tensors[name] = data[begin:end].view(SAFETENSORS_DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [directory / name for name in sorted(set(weight_map.values()))]
        absent = [str(f.name) for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{index} names shard files that do not exist: {absent}")
        return files
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no weights in {directory}: expected model.safetensors or model.safetensors.index.json "
            f"(found {sorted(p.name for p in directory.iterdir())})"
        )
    return files


def checkpoint_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face model directory, from its `config.json` alone (no weight read)."""
    directory = Path(path)
    if directory.is_file():
        raise NotADirectoryError(f"{directory} is a file; a Hugging Face checkpoint is the model directory that "
                                 f"holds config.json and the safetensors files (here: {directory.parent})")
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory does not exist: {directory}")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in checkpoint directory {directory}")
    return config_from_hf(json.loads(config_path.read_text()))


def load_hf_checkpoint(
    path: str | Path,
    dtype: Any = jnp.float32,
    param_dtype: Any = None,
    mesh: jax.sharding.Mesh | None = None,
    remat: str | None = None,
    attention: str | None = None,
) -> Decoder:
    """Loads a Hugging Face model directory (llama / qwen2 / qwen3) as a `Decoder`.

    Args:
      path: directory with `config.json` and `model.safetensors` (or shards
        listed in `model.safetensors.index.json`).
      dtype: activation dtype; also the parameter dtype unless `param_dtype` is given.
      mesh: if given, every parameter is placed on the mesh by its logical axes.
      remat: rematerialisation setting of the returned model (`ModelConfig.remat`).
      attention: attention backend of the returned model (`ModelConfig.attention`).
    """
    directory = Path(path)
    config = checkpoint_config(directory)
    weight_files = _weight_files(directory)
    tensors: dict[str, np.ndarray] = {}
    for file in weight_files:
        tensors.update(read_safetensors(file))
    return model_from_hf_tensors(config, tensors, dtype=dtype, param_dtype=param_dtype, mesh=mesh, remat=remat,
                                 attention=attention)


def save_hf_checkpoint(model: Decoder, path: str | Path) -> None:
    """Writes `config.json` and `model.safetensors` that `transformers.AutoModelForCausalLM` loads."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config_to_hf(model.config), indent=2) + "\n")
    save_file(hf_tensors_from_model(model), str(directory / "model.safetensors"), metadata={"format": "pt"})
