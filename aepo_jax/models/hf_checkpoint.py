"""Hugging Face checkpoint import: `config.json` + `*.safetensors` -> `Decoder`, without PyTorch (export:
`hf_export`).

HF stores linear weights as `[out_features, in_features]` with heads flattened
into one axis; our parameters are `[in, out]` with explicit head axes (e.g.
q_proj `[D, H, Dh]`, o_proj `[H, Dh, D]`). `_tensor_layout` is the one table of
that correspondence, used both ways.

Safetensors files are read by parsing their header and memory-mapping the
data with numpy: `safetensors.numpy` cannot represent bfloat16 (the dtype of
most released checkpoints), and memory-mapping lets `load_hf_checkpoint`
build one parameter at a time on the host (about one copy of the largest
parameter, not of the whole checkpoint) and place it on its device(s). Tensors
that must be computed rather than mapped (dequantised GGUF blocks) come as
`LazyTensor`s, made when their parameter is filled, for the same reason.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from aepo_jax.models.config import ModelConfig, config_from_hf
from aepo_jax.models.decoder import Decoder

SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
# The dtypes a weight may have; integer tensors would be silently cast to float (quantised data?).
FLOAT_DTYPES = frozenset(np.dtype(t) for t in (np.float64, np.float32, np.float16, ml_dtypes.bfloat16))

# (HF tensor name, attribute path in `Decoder`, number of leading axes of our
# parameter that form HF's `in_features` axis; None: not a linear weight, HF
# stores it flattened to 1-D (norm scales, biases); KEEP: same shape both sides;
# layer index into the stacked `[L, ...]` parameter, or None for a global one).
KEEP = "keep"
TensorEntry = tuple[str, tuple[str, ...], int | str | None, int | None]


@dataclasses.dataclass(frozen=True)
class LazyTensor:
    """A tensor made only when read (`np.asarray`), with its shape and dtype known beforehand.

    `model_from_hf_tensors` reads each tensor once, while it fills that tensor's parameter, so a
    checkpoint of lazy tensors (e.g. GGUF blocks dequantised on read) is never in memory whole:
    only the tensor being copied is. Each read calls `make` again; nothing is cached.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    make: Callable[[], np.ndarray]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = np.asarray(self.make())
        if value.shape != self.shape or value.dtype != self.dtype:
            raise ValueError(f"a lazy tensor declared {self.shape} {self.dtype} but made {value.shape} {value.dtype}")
        if dtype is not None:
            return value.astype(dtype, copy=bool(copy))
        return value.copy() if copy else value  # a copy when asked: `make` may return a read-only file view

    def __getitem__(self, index: Any) -> np.ndarray:
        return np.asarray(self)[index]


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


def _fill_from_hf(name: str, array: np.ndarray, out: np.ndarray, in_axes: int | str | None, source: str) -> None:
    """Writes HF tensor `array` into our (per-layer) parameter `out` in place, cast to `out`'s dtype.

    Writing through a reshaped view of `out` transposes and casts in one pass,
    with no temporary copy of the tensor.
    """
    expected = _hf_shape(out.shape, in_axes)
    if tuple(array.shape) != expected:
        raise ValueError(f"{source}: tensor {name!r} has shape {tuple(array.shape)}, the config implies {expected}")
    # `out` is contiguous (a fresh array or one layer of it), so each reshape is a view of it.
    if in_axes in (None, KEEP):
        out.reshape(expected)[...] = array
    else:
        out.reshape(expected[::-1])[...] = array.T  # [in, out] view of e.g. [D, H, Dh]


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


def _listed(names: list[str], shown: int = 10) -> str:
    """The first `shown` of `names`, and how many there are in all when some are left out."""
    return ", ".join(names[:shown]) + (f", ... ({len(names)} in all)" if len(names) > shown else "")


def _equal_rows(a: np.ndarray, b: np.ndarray, rows: int = 4096) -> bool:
    """`np.array_equal(a, b)`, compared a block of rows at a time so no full-size temporary is made."""
    if a.shape != b.shape:
        return False
    return all(np.array_equal(a[i:i + rows], b[i:i + rows]) for i in range(0, len(a), rows))


def _check_tied_head(tensors: Mapping[str, np.ndarray], source: str) -> None:
    """Raises when a tied config comes with an `lm_head.weight` that is not the embedding.

    transformers then unties and uses the file's head, so taking the embedding
    as the head would silently give different logits.
    """
    head, embed = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
    if not _equal_rows(np.asarray(head), np.asarray(embed)):
        raise ValueError(
            f"{source}: the config ties the embeddings (tie_word_embeddings=true) but lm_head.weight "
            f"{tuple(head.shape)} differs from model.embed_tokens.weight {tuple(embed.shape)}; transformers "
            f"would use the separate head. Set tie_word_embeddings=false or drop lm_head.weight"
        )


def _harmless_extra(name: str, config: ModelConfig) -> bool:
    """Tensors a checkpoint may carry that we do not load: rotary tables (recomputed) and a tied head's copy."""
    return name.endswith(".rotary_emb.inv_freq") or (config.tie_embeddings and name == "lm_head.weight")


def _check_tensors(config: ModelConfig, tensors: Mapping[str, np.ndarray], source: str) -> None:
    """Raises unless `tensors` are exactly the floating-point weights `config` needs (plus harmless extras).

    A tensor the config does not use (more layers, a bias the architecture
    lacks) means config and weights disagree, so it is an error, not ignored.
    """
    needed = [name for name, _, _, _ in _tensor_layout(config)]
    missing = [name for name in needed if name not in tensors]
    if missing:
        raise ValueError(f"{source} is missing {len(missing)} tensor(s) the config needs: {_listed(missing)}")
    if config.tie_embeddings and "lm_head.weight" in tensors:
        _check_tied_head(tensors, source)
    known = set(needed)
    unexpected = sorted(name for name in tensors if name not in known and not _harmless_extra(name, config))
    if unexpected:
        raise ValueError(f"{source} has {len(unexpected)} tensor(s) the config does not use (config and weights "
                         f"disagree): {_listed(unexpected)}")
    not_float = [f"{name} ({tensors[name].dtype})" for name in needed
                 if np.dtype(tensors[name].dtype) not in FLOAT_DTYPES]
    if not_float:
        raise ValueError(f"{source} has {len(not_float)} weight(s) of a non-float dtype: {_listed(not_float)}")


def _host_value(param: nnx.Param, entries: list[TensorEntry], tensors: Mapping[str, np.ndarray],
                source: str) -> np.ndarray:
    """One parameter's host array in its own dtype, `[L, ...]` for per-layer tensors.

    Allocated once and filled tensor by tensor (cast on the way in), so host
    memory peaks at about one copy of the parameter, not three (per-layer
    casts, their list, and the stacked result).
    """
    host = np.empty(param.shape, param.dtype)
    for name, _, in_axes, layer in entries:
        _fill_from_hf(name, np.asarray(tensors[name]), host if layer is None else host[layer], in_axes, source)
    return host


def _place(host: np.ndarray, param: nnx.Param, mesh: jax.sharding.Mesh | None) -> jax.Array:
    """`host` as a device array: on the default device, or on `mesh` by the parameter's logical axes."""
    from aepo_jax.parallel.sharding import named_sharding

    if mesh is None:
        return jnp.asarray(host)
    # Every process builds the whole parameter on its host, then copies to its own devices only the
    # slices they hold (multi-host safe; host memory is one parameter, not one shard).
    sharding = named_sharding(param.get_metadata("out_sharding"), host.shape, mesh)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


# A parameter buffer at least this large is collected once copied (`model_from_hf_tensors`); smaller ones
# cost less memory than the collection costs time.
_COLLECT_AFTER_BYTES = 4 * 2**20


def model_from_hf_tensors(
    config: ModelConfig,
    tensors: Mapping[str, np.ndarray | LazyTensor],
    dtype: Any = jnp.float32,
    param_dtype: Any = None,
    mesh: jax.sharding.Mesh | None = None,
    remat: str | None = None,
    attention: str | None = None,
    source: str = "checkpoint",
) -> Decoder:
    """A `Decoder` whose weights are HF-named, HF-layout `tensors` (e.g. `model.layers.0.self_attn.q_proj.weight`).

    `tensors` may be arrays (memory-mapped ones are read a parameter at a time) or `LazyTensor`s
    (each made once, when its parameter is filled).

    The model is built abstractly (no random init) and each parameter is filled
    from its tensor(s) (per-layer tensors stacked along the leading layer
    axis), cast to `param_dtype` (default `dtype`) and, with a `mesh`, placed
    on its shards by the logical-axis rules. `remat` and `attention` override
    the config's rematerialisation and attention backend (run-time choices a
    checkpoint does not carry). Missing, unused, or non-float tensors raise
    (only rotary `inv_freq` tables and a tied head equal to the embedding may
    be extra); `source` names the checkpoint in those errors.
    """
    param_dtype = dtype if param_dtype is None else param_dtype
    run_time = {k: v for k, v in (("remat", remat), ("attention", attention)) if v is not None}
    config = config.replace(dtype=dtype, param_dtype=param_dtype, **run_time)
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    if mesh is not None:
        from aepo_jax.parallel.sharding import state_shardings

        # A dimension the mesh cannot split (a 64-wide embed over fsdp=3) leaves its parameters replicated:
        # warned here (UnsplitAxisWarning), before any tensor is read, not after the model has been placed.
        state_shardings(nnx.state(model), mesh)
    _check_tensors(config, tensors, source)
    for path, entries in _grouped_layout(config).items():
        param = _param_at(model, path)
        host = _host_value(param, entries, tensors, source)
        param.set_value(jax.block_until_ready(_place(host, param, mesh)))
        # Once copied, `host` is held only by a reference cycle JAX's transfer leaves behind: collect it
        # now, or it lives on beside the next parameter's buffer (a 2x host peak, measured). A full
        # collection takes 0.1-0.3 s in a process holding torch and jax, so small buffers skip it.
        big = host.nbytes >= _COLLECT_AFTER_BYTES
        del host
        if big:
            gc.collect()
    return model


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Memory-mapped numpy views of every tensor in one `.safetensors` file (bfloat16 via ml_dtypes).

    The header is checked against the file's size first, so a truncated (partly
    downloaded) file raises naming the file and the first tensor it cuts off.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{path}: {size} bytes, too short for a safetensors header (truncated file?)")
        (header_len,) = struct.unpack("<Q", prefix)
        if 8 + header_len > size:
            raise ValueError(f"{path}: header of {header_len} bytes runs past the end of the {size}-byte file "
                             f"(truncated file?)")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: unreadable safetensors header: {err}") from err
    data_len = size - 8 - header_len
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len) if data_len else np.zeros(0, np.uint8)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_view(path, name, info, data)
    return tensors


def _tensor_view(path: Path, name: str, info: Mapping[str, Any], data: np.ndarray) -> np.ndarray:
    """Tensor `name` as a view of the file's data bytes, after checking its byte range is whole."""
    if info["dtype"] not in SAFETENSORS_DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
    dtype = np.dtype(SAFETENSORS_DTYPES[info["dtype"]])
    begin, end = info["data_offsets"]
    if end > len(data):
        raise ValueError(f"{path}: tensor {name!r} ends at data byte {end} but the file holds only {len(data)} "
                         f"data bytes: the file is truncated (incomplete download?)")
    needed = int(np.prod(info["shape"])) * dtype.itemsize
    if not 0 <= begin <= end or end - begin != needed:
        raise ValueError(f"{path}: tensor {name!r} spans bytes [{begin}, {end}) but shape {info['shape']} of "
                         f"{info['dtype']} needs {needed} bytes")
    return data[begin:end].view(dtype).reshape(info["shape"])


def _read_indexed(index: Path) -> dict[str, np.ndarray]:
    """The tensors of a sharded checkpoint, each read only from the shard its `weight_map` names.

    A shard's copy of a tensor the index assigns elsewhere is not read, so
    duplicates cannot silently override one another.
    """
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{index}: not a safetensors index with a 'weight_map': {err}") from err
    by_file: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        by_file.setdefault(file, []).append(name)
    absent = sorted(file for file in by_file if not (index.parent / file).is_file())
    if absent:
        raise FileNotFoundError(f"{index} names shard files that do not exist: {absent}")
    tensors: dict[str, np.ndarray] = {}
    for file, names in sorted(by_file.items()):
        shard = read_safetensors(index.parent / file)
        lacking = [name for name in names if name not in shard]
        if lacking:
            raise ValueError(f"{index} places {len(lacking)} tensor(s) in {file}, which does not hold them: "
                             f"{_listed(lacking)}")
        tensors.update((name, shard[name]) for name in names)
    return tensors


def _read_files(files: list[Path]) -> dict[str, np.ndarray]:
    """The tensors of every file in `files`; a tensor defined by two files raises (which one is meant?)."""
    tensors: dict[str, np.ndarray] = {}
    origin: dict[str, Path] = {}
    clashes = []
    for file in files:
        for name, array in read_safetensors(file).items():
            if name in origin:
                clashes.append(f"{name} ({origin[name].name} and {file.name})")
            origin[name], tensors[name] = file, array
    if clashes:
        raise ValueError(f"{files[0].parent}: {len(clashes)} tensor(s) are defined in more than one safetensors "
                         f"file and there is no model.safetensors.index.json to choose: {_listed(clashes)}")
    return tensors


def _unindexed_files(directory: Path) -> list[Path]:
    """`model.safetensors`, else every `*.safetensors` file of a checkpoint without an index."""
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


def _read_checkpoint_tensors(directory: Path) -> dict[str, np.ndarray]:
    """Every weight tensor of a HF model directory, memory-mapped, by its HF name."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return _read_indexed(index)
    return _read_files(_unindexed_files(directory))


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
    try:
        hf_config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from err
    if not isinstance(hf_config, dict):
        raise ValueError(  # noqa: TRY004 - a bad file, like the JSON error above
            f"{config_path} holds a {type(hf_config).__name__}, not a JSON object")
    return config_from_hf(hf_config)


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
    tensors = _read_checkpoint_tensors(directory)
    return model_from_hf_tensors(config, tensors, dtype=dtype, param_dtype=param_dtype, mesh=mesh, remat=remat,
                                 attention=attention, source=str(directory))
